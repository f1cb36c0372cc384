"""Runs in SGLang's own environment (a subprocess of test_sglang_glm.py): reads request bodies
in the glm-sglang dialect and parser flags on stdin, and prints what SGLang makes of each body.

- `ignored`: request fields SGLang's ChatCompletionRequest does not know (it drops them);
- `reasoning`: the reasoning_content of each assistant message as SGLang parsed it;
- `prompt`: GLM-5.3's chat template (SGLang's Python rendering of Z.ai's template) applied to the
  request as SGLang does: history tool-call arguments parsed (strictly: SGLang answers 400 to
  arguments that are not a JSON object), template kwargs from `chat_template_kwargs` and
  `reasoning_effort`;
- `unknown_parsers`: flag values that are not parser names of this SGLang.
"""

import json
import sys

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.serving_chat import normalize_assistant_tool_call_arguments
from sglang.srt.function_call.parser_names import TOOL_CALL_PARSER_NAMES
from sglang.srt.parser.glm53_chat_template import render_glm53
from sglang.srt.parser.reasoning_parser import ReasoningParser


def seen(body: dict) -> dict:
    request = ChatCompletionRequest.model_validate(body)
    kwargs = dict(request.chat_template_kwargs or {})
    if request.reasoning_effort is not None:
        kwargs["reasoning_effort"] = request.reasoning_effort
    messages = [m.model_dump(exclude_none=True) for m in request.messages]
    for message in messages:  # as SGLang's server does before rendering (400 on bad arguments)
        normalize_assistant_tool_call_arguments(message, strict=True)
    return {
        "ignored": sorted(set(body) - request.model_fields_set),
        "reasoning": [m.get("reasoning_content") for m in messages if m["role"] == "assistant"],
        "prompt": render_glm53(
            messages, tools=body.get("tools"), add_generation_prompt=True, **kwargs
        ),
    }


data = json.load(sys.stdin)
unknown = []
for flags in data["flags"]:
    words = flags.split()
    pairs = dict(zip(words[::2], words[1::2], strict=True))
    if pairs["--reasoning-parser"] not in ReasoningParser.DetectorMap:
        unknown.append(pairs["--reasoning-parser"])
    if pairs["--tool-call-parser"] not in TOOL_CALL_PARSER_NAMES:
        unknown.append(pairs["--tool-call-parser"])
print(json.dumps({"bodies": [seen(b) for b in data["bodies"]], "unknown_parsers": unknown}))
