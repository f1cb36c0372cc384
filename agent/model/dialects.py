"""Dialects of the chat-completions API: what a request carries for each kind of endpoint.

- `openai`: any OpenAI-compatible endpoint. Asks for usage in the stream (`stream_options`) and
  for per-token logprobs; an endpoint that refuses them (or streaming) is asked once without.
- `glm`: Z.ai's API (api.z.ai and open.bigmodel.cn, pay-as-you-go and Coding Plan paths; chosen
  for them when a profile names no dialect). Streams tool-call arguments as they are generated
  (`tool_stream`, without which Z.ai sends a call's arguments in one piece at its end), sets
  `thinking` ({"type", "clear_thinking"}) and `reasoning_effort` from the profile, returns every
  assistant turn's `reasoning_content` with later requests (Z.ai's interleaved thinking, GLM-4.5
  and later, and preserved thinking, GLM-4.7 and later), sends `tool_choice` only as "auto", tool
  results without a `name`, and neither `stream_options` nor `logprobs` (Z.ai's SDK takes
  neither; its last chunk carries the usage unasked).
- `glm-sglang`: a GLM model behind SGLang's OpenAI server started with GLM's reasoning and
  tool-call parsers (`SGLANG_GLM_FLAGS`). Thinking goes to the chat template
  (`chat_template_kwargs`: `enable_thinking`, `clear_thinking`), `reasoning_effort` is a field
  (GLM-5.3's template reads it), reasoning is returned as with `glm`; SGLang takes
  `stream_options` (it streams usage only when asked) and logprobs.

A dialect is one `Dialect` and one line in `DIALECTS`; profiles name it (`LLMProfile.dialect`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from infra_agent.agent.state import Message
from infra_agent.config import LLMProfile
from infra_agent.errors import UserError

GLM_DOMAINS = ("z.ai", "bigmodel.cn")
"""Hosts in these domains (api.z.ai, open.bigmodel.cn) speak the glm dialect unless told."""

SGLANG_GLM_FLAGS: dict[str, str] = {
    "GLM-4.5, GLM-4.6": "--reasoning-parser glm45 --tool-call-parser glm",
    "GLM-4.7, GLM-5.x": "--reasoning-parser glm45 --tool-call-parser glm47",
}
"""`sglang.launch_server` flags that return a GLM model's reasoning and tool calls as separate
fields (SGLang 0.5.23's parser names; its GLM-5.3 chat template declares the second pair).
Add `--enable-cache-report` for cached prompt tokens in the usage."""


@dataclass(frozen=True)
class Dialect:
    """How requests to one kind of endpoint are shaped (the `openai` dialect as is)."""

    name: str = "openai"
    returns_reasoning: bool = False
    """Assistant turns' `reasoning_content` goes back with every later request."""
    tool_choices: tuple[str, ...] = ("auto", "required")
    """`tool_choice` values the endpoint takes."""
    stream_usage_option: bool = True
    """Ask for usage in the stream's last chunk (`stream_options.include_usage`)."""
    logprobs: bool = True
    """Ask for per-token logprobs."""
    learns_refusals: bool = True
    """After a 400, ask once more without logprobs, then without streaming."""
    sends_thinking: bool = False
    """The profile's `thinking` and `preserved_thinking` reach the model."""

    def problem(self, profile: LLMProfile) -> str | None:
        """What in `profile` this dialect cannot send, in a sentence (None if nothing)."""
        if profile.tool_choice not in self.tool_choices:
            allowed = " or ".join(repr(c) for c in self.tool_choices)
            return f"the {self.name} dialect takes tool_choice {allowed} only"
        thinking_set = profile.thinking is not None or profile.preserved_thinking is not None
        if thinking_set and not self.sends_thinking:
            return (
                f"thinking and preserved_thinking are GLM settings the {self.name} dialect does "
                "not send; set dialect = 'glm' (Z.ai) or 'glm-sglang' (SGLang)"
            )
        if profile.preserved_thinking and profile.thinking is False:
            return "preserved_thinking needs thinking (thinking = false)"
        return None

    def fields(self, profile: LLMProfile, *, tools: bool, stream: bool) -> dict[str, Any]:
        """The request fields this dialect adds to the common ones."""
        return {"reasoning_effort": profile.reasoning_effort} if profile.reasoning_effort else {}

    def message(self, message: Message) -> dict[str, Any]:
        """One message of the conversation as this dialect sends it."""
        return message.to_openai(reasoning=self.returns_reasoning)

    def request(
        self,
        profile: LLMProfile,
        messages: list[Message],
        tools: list[dict[str, Any]],
        *,
        stream: bool = True,
        logprobs: bool = True,
    ) -> dict[str, Any]:
        """The JSON body of one chat-completions request, exactly as it is sent."""
        body: dict[str, Any] = {
            "model": profile.model,
            "messages": [self.message(m) for m in messages],
            "temperature": profile.temperature,
            "max_tokens": profile.max_tokens,
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = profile.tool_choice
        if logprobs and self.logprobs:
            body["logprobs"] = True
        if stream:
            body["stream"] = True
            if self.stream_usage_option:
                body["stream_options"] = {"include_usage": True}
        body.update(self.fields(profile, tools=bool(tools), stream=stream))
        return body


@dataclass(frozen=True)
class ZaiGLM(Dialect):
    """Z.ai's API for GLM models (see the module docstring)."""

    name: str = "glm"
    returns_reasoning: bool = True
    tool_choices: tuple[str, ...] = ("auto",)
    stream_usage_option: bool = False
    logprobs: bool = False
    learns_refusals: bool = False
    sends_thinking: bool = True

    def message(self, message: Message) -> dict[str, Any]:
        """As sent, but a tool result carries only role, content and tool_call_id (the shape of
        Z.ai's own function-calling example; its docs do not name a `name` field there)."""
        out = super().message(message)
        if message.role == "tool":
            out.pop("name", None)
        return out

    def fields(self, profile: LLMProfile, *, tools: bool, stream: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if tools and stream:
            out["tool_stream"] = True
        if profile.thinking is not None or profile.preserved_thinking is not None:
            thinking: dict[str, Any] = {
                "type": "disabled" if profile.thinking is False else "enabled"
            }
            if profile.preserved_thinking is not None:
                thinking["clear_thinking"] = not profile.preserved_thinking
            out["thinking"] = thinking
        if profile.reasoning_effort:
            out["reasoning_effort"] = profile.reasoning_effort
        return out


@dataclass(frozen=True)
class SGLangGLM(Dialect):
    """A GLM model served by SGLang with its GLM parsers (see the module docstring)."""

    name: str = "glm-sglang"
    returns_reasoning: bool = True
    learns_refusals: bool = False
    sends_thinking: bool = True

    def message(self, message: Message) -> dict[str, Any]:
        """As sent, but an earlier tool call whose arguments are not a JSON object (a malformed
        call the agent answered with an error) goes as `{}`: SGLang refuses the whole request
        otherwise ("arguments must be a JSON object")."""
        out = super().message(message)
        for call in out.get("tool_calls", []):
            if not _json_object(call["function"]["arguments"]):
                call["function"]["arguments"] = "{}"
        return out

    def fields(self, profile: LLMProfile, *, tools: bool, stream: bool) -> dict[str, Any]:
        template: dict[str, Any] = {}
        if profile.thinking is not None:
            template["enable_thinking"] = profile.thinking
        if profile.preserved_thinking is not None:
            template["clear_thinking"] = not profile.preserved_thinking
        out: dict[str, Any] = {"chat_template_kwargs": template} if template else {}
        if profile.reasoning_effort:
            out["reasoning_effort"] = profile.reasoning_effort
        return out


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


DIALECTS: dict[str, Dialect] = {d.name: d for d in (Dialect(), ZaiGLM(), SGLangGLM())}
"""Every dialect by name: what `LLMProfile.dialect` may say."""


def detected(base_url: str | None) -> str:
    """The dialect a profile without one speaks: 'glm' for Z.ai's hosts, else 'openai'."""
    host = (urlparse(base_url or "").hostname or "").lower()
    glm = any(host == d or host.endswith("." + d) for d in GLM_DOMAINS)
    return "glm" if glm else "openai"


def dialect_of(profile: LLMProfile) -> Dialect:
    """The profile's dialect (named, or detected from its URL); UserError if it cannot be used."""
    name = profile.dialect or detected(profile.base_url)
    if name not in DIALECTS:
        known = ", ".join(DIALECTS)
        raise UserError(f"llm profile for {profile.model}: dialect '{name}' is not one of {known}")
    dialect = DIALECTS[name]
    problem = dialect.problem(profile)
    if problem is not None:
        raise UserError(f"llm profile for {profile.model}: {problem}")
    return dialect
