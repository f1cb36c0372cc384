"""The tool contract: a typed function, its JSON schema, and a registry that never crashes a run.

A tool is a plain function whose single argument is a pydantic model (its parameters). The
registry derives the OpenAI `tools=[...]` schema from that model, validates the model's raw
arguments against it, and turns every failure (unknown tool, bad JSON, schema violation, an
exception inside the tool) into a precise `ToolResult.error` the model can read and act on.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from infra_agent.errors import UserError

if TYPE_CHECKING:
    from infra_agent.tasks.manifest import Task, TaskManifest

P = TypeVar("P", bound=BaseModel)

MAX_RESULT_CHARS = 6000
"""Tool results longer than this are cut (the model sees the head and a note), unless the tool
states a cap of its own (`Tool.max_chars`)."""

NEEDS: dict[str, Callable[[TaskManifest], bool]] = {
    "": lambda m: True,
    "serving": lambda m: m.kind == "serving",  # a server to start, a workload, step statistics
    "python": lambda m: m.kind == "python",  # the task's program runs from its own workspace
    "knobs": lambda m: bool(m.knobs),
    "code": lambda m: bool(m.editable),
}
"""What a tool can declare it needs (`Tool.needs`, one word) and whether a task's manifest has
it; a run offers a tool only when its task has what it needs (`Tool.works_for`)."""


class Record(Protocol):
    """An instrument's typed record: stored as JSON, rendered for the model (decisive numbers
    first, a few hundred tokens)."""

    def render(self) -> str: ...
    def model_dump(self, *, mode: str) -> dict[str, Any]: ...


class ToolResult(BaseModel):
    """What a tool call returns to the model."""

    content: str
    """The short rendering the model reads (decisive numbers first)."""
    error: str | None = None
    """Set when the call failed; `content` then repeats it in words for the model."""
    data: dict[str, Any] | None = None
    """The typed record behind the rendering, dumped to JSON (for the run store)."""

    @classmethod
    def failure(cls, message: str) -> ToolResult:
        return cls(content=f"error: {message}", error=message)

    @classmethod
    def of(cls, record: Record) -> ToolResult:
        """An instrument's answer: its record's rendering, and the record as data."""
        return cls(content=record.render(), data=record.model_dump(mode="json"))


@dataclass(frozen=True)
class Tool(Generic[P]):
    """One tool the model may call."""

    name: str
    description: str
    params: type[P]
    fn: Callable[[P, Any], ToolResult]
    """Called as fn(params, context); context is the run's `ToolContext`."""
    deferred: bool = False
    """True for tools the graph runs in a node of its own (experiments): `call` only validates."""
    needs: str = ""
    """What the task must have for this tool to work, one word of `NEEDS` ('' for any task)."""
    kind: Literal["tool", "instrument"] = "tool"
    """'instrument': a measurement (`@instrument`), which `infra-agent feedback run NAME --task T`
    also runs for a person, through this same function."""
    max_chars: int = MAX_RESULT_CHARS
    """The registry cuts an answer longer than this (a tool that pages, like read_file, states
    its own larger cap and stays under it)."""

    def __post_init__(self) -> None:
        if self.needs not in NEEDS:
            raise ValueError(
                f"tool {self.name}: needs '{self.needs}' is not one of {sorted(NEEDS)}"
            )

    def works_for(self, task: Task) -> bool:
        """Whether this tool can work for `task` (so a run on it offers the tool)."""
        return NEEDS[self.needs](task.manifest)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool schema, generated from the parameter model."""
        parameters = self.params.model_json_schema()
        parameters.pop("title", None)
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }


class ToolRegistry:
    """The tools of one run, by name."""

    def __init__(self, tools: list[Tool[Any]]) -> None:
        self._tools = {t.name: t for t in tools}

    def names(self) -> list[str]:
        return sorted(self._tools)

    def get(self, name: str) -> Tool[Any] | None:
        return self._tools.get(name)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values()]

    def parse(self, name: str, arguments: str) -> tuple[Tool[Any], BaseModel] | str:
        """Validate a raw call; return (tool, params) or a precise error message."""
        tool = self._tools.get(name)
        if tool is None:
            return f"unknown tool '{name}'; available tools: {', '.join(self.names())}"
        try:
            raw = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return (
                f"arguments of '{name}' are not valid JSON ({exc.msg} at line {exc.lineno} "
                f"column {exc.colno}); send a JSON object matching the tool's schema"
            )
        if not isinstance(raw, dict):
            return f"arguments of '{name}' must be a JSON object, got {type(raw).__name__}"
        try:
            params = tool.params.model_validate(raw)
        except ValidationError as exc:
            problems = []
            for err in exc.errors()[:5]:
                where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
                problems.append(f"'{where}': {err['msg']}")
            return f"arguments of '{name}' do not match its schema: " + "; ".join(problems)
        return tool, params

    def call(self, name: str, arguments: str, context: Any) -> ToolResult:
        """Run one call. Never raises for the model's mistakes or a tool's failure."""
        parsed = self.parse(name, arguments)
        if isinstance(parsed, str):
            return ToolResult.failure(parsed)
        tool, params = parsed
        if tool.deferred:
            return ToolResult.failure(f"'{name}' runs as an experiment step, not inline")
        try:
            result = tool.fn(params, context)
        except UserError as exc:
            return ToolResult.failure(f"{name}: {exc}")
        except Exception as exc:  # a broken instrument must not end the run; the model is told
            tail = traceback.format_exc(limit=3).strip().splitlines()[-1]
            return ToolResult.failure(f"{name} failed: {type(exc).__name__}: {exc} ({tail})")
        if len(result.content) > tool.max_chars:
            cut = len(result.content) - tool.max_chars
            result.content = result.content[: tool.max_chars] + f"\n[... {cut} more characters cut]"
        return result


def tool(
    name: str,
    description: str,
    params: type[P],
    *,
    deferred: bool = False,
    needs: str = "",
    kind: Literal["tool", "instrument"] = "tool",
    max_chars: int = MAX_RESULT_CHARS,
) -> Callable[[Callable[[P, Any], ToolResult]], Tool[P]]:
    """Decorator: turn `fn(params, context) -> ToolResult` into a `Tool`; `needs` says what kind
    of task it works for (one word of `NEEDS`, e.g. `needs="serving"`); `max_chars` where its
    answers may be longer than `MAX_RESULT_CHARS`."""

    def wrap(fn: Callable[[P, Any], ToolResult]) -> Tool[P]:
        return Tool(
            name=name, description=description, params=params, fn=fn, deferred=deferred,
            needs=needs, kind=kind, max_chars=max_chars,
        )  # fmt: skip

    return wrap


def instrument(
    name: str, description: str, params: type[P], *, needs: str = ""
) -> Callable[[Callable[[P, Any], ToolResult]], Tool[P]]:
    """Decorator for a measurement: a `@tool` of kind 'instrument', which the agent calls and
    `infra-agent feedback run NAME --task T` runs for a person. Its function returns
    `ToolResult.of(record)`: a typed record (a pydantic model of its module) with a `render()`,
    decisive numbers first, a few hundred tokens."""
    return tool(name, description, params, needs=needs, kind="instrument")
