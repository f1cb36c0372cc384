"""The `scripted` policy: replays a recorded list of model replies. TEST EQUIPMENT.

It exists so tests and demos can drive the real graph, tools and experiments offline. It is used
only when chosen explicitly (`--policy scripted --script FILE`), and runs are marked with it.

A script is a JSON list (or JSONL) of replies, each an object with `content`, optional
`reasoning_content`, and `tool_calls` ([{"name": ..., "arguments": {...} or "raw text"}]).
Inside arguments, `{{last_patch_id}}` is replaced by the id of the most recently proposed patch
(patch ids are content hashes the script's author cannot always know in advance). The reply
replayed is chosen by how many assistant turns the conversation already has, so a resumed run
continues where it stopped. When the script runs out, the policy calls `finish`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError

from infra_agent.agent.policies.base import ModelTurn, Policy, PolicySpec
from infra_agent.agent.state import AgentState, Message
from infra_agent.config import LLMSettings
from infra_agent.errors import UserError
from infra_agent.store.records import ToolCall

if TYPE_CHECKING:
    from infra_agent.agent.configuration import RunConfig
    from infra_agent.tasks.manifest import Task


class ScriptedCall(BaseModel):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """A JSON object, or raw text sent as-is (to replay malformed calls)."""


class ScriptedReply(BaseModel):
    content: str = ""
    reasoning_content: str | None = None
    tool_calls: list[ScriptedCall] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0


def load_script(path: Path) -> list[ScriptedReply]:
    """Read a script file; raise UserError naming the file and the bad entry."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"script {path}: cannot read ({exc.strerror})") from exc
    try:
        data = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    except json.JSONDecodeError as exc:
        raise UserError(f"script {path}: not JSON or JSONL ({exc.msg}, line {exc.lineno})") from exc
    replies = []
    for i, item in enumerate(data):
        try:
            replies.append(ScriptedReply.model_validate(item))
        except ValidationError as exc:
            raise UserError(f"script {path}: reply {i}: {exc.errors()[0]['msg']}") from exc
    if not replies:
        raise UserError(f"script {path}: no replies")
    return replies


class ScriptedPolicy:
    """Replays `replies` in order (test equipment; see the module docstring)."""

    name = "scripted"

    def __init__(self, replies: list[ScriptedReply], *, model: str = "scripted-replay") -> None:
        self.replies = replies
        self.model: str | None = model

    def next_turn(self, state: AgentState, tools: list[dict[str, Any]]) -> ModelTurn:
        index = sum(1 for m in state.messages if m.role == "assistant")
        last_patch = state.patches[-1] if state.patches else ""
        if index >= len(self.replies):
            reply = ScriptedReply(
                content="(script exhausted)",
                tool_calls=[ScriptedCall(name="finish", arguments={"summary": "script exhausted"})],
            )
        else:
            reply = self.replies[index]
        calls = []
        for j, call in enumerate(reply.tool_calls):
            raw = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
            calls.append(
                ToolCall(
                    id=f"call_{index}_{j}",
                    name=call.name,
                    arguments=raw.replace("{{last_patch_id}}", last_patch),
                )
            )
        message = Message(
            role="assistant",
            content=reply.content,
            reasoning_content=reply.reasoning_content,
            tool_calls=calls,
        )
        return ModelTurn(
            message=message,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
        )


def _check(llm: LLMSettings, script: Path | None) -> str:
    if script is None:
        raise UserError("--policy scripted needs --script FILE (it replays recorded replies)")
    return f"scripted policy (test equipment) replaying {script}"


def _build(config: RunConfig, llm: LLMSettings, task: Task) -> Policy:
    if config.script is None:
        raise UserError("the scripted policy needs its script file (--script)")
    return ScriptedPolicy(load_script(Path(config.script)))


SPEC = PolicySpec("scripted", _check, _build)
