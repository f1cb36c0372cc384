"""Optimization skeletons: reusable patterns the agent looks up (`lookup_skeletons`), and grows
from proven patches.

Each skeleton is a TOML file: when it applies, how to test that it applies, a worked example,
and optionally `knob_advice` (knob name -> values worth trying) that seeds the search policy.
Bundled skeletons live in `tools/skeletons/bundled/`; skeletons saved from reviewed runs live in
`<data dir>/skeletons/` and are loaded after them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, Field, ValidationError

from infra_agent.config import default_data_dir
from infra_agent.errors import UserError
from infra_agent.tools.base import ToolResult, tool
from infra_agent.tools.context import ToolContext

BUNDLED_DIR = Path(__file__).parent / "bundled"


class Skeleton(BaseModel):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    title: str
    tags: list[str] = Field(default_factory=list)
    applies_when: str
    """The situation in which the pattern pays off, with the public case it comes from."""
    how_to_test: str
    """Steps that confirm (or refute) that it applies here, cheapest first."""
    example: str
    """A worked before/after example."""
    knob_advice: dict[str, list[Any]] = Field(default_factory=dict)
    """Knob name -> values worth trying first (seeds the search policy)."""
    source: str = "bundled"
    """'bundled' or the run id it was learned from."""

    def render(self) -> str:
        text = (
            f"## {self.name}: {self.title}\nWHEN IT APPLIES:\n{self.applies_when.strip()}\n"
            f"HOW TO TEST IT APPLIES:\n{self.how_to_test.strip()}\nEXAMPLE:\n{self.example.strip()}"
        )
        if self.knob_advice:
            advice = "; ".join(f"{k}: {v}" for k, v in self.knob_advice.items())
            text += f"\nKNOB VALUES WORTH TRYING: {advice}"
        return text


def user_dir() -> Path:
    return default_data_dir() / "skeletons"


def load_skeletons(extra_dirs: list[Path] | None = None) -> list[Skeleton]:
    """All skeletons: bundled first, then the user's, then `extra_dirs` (later names win)."""
    found: dict[str, Skeleton] = {}
    for folder in [BUNDLED_DIR, user_dir(), *(extra_dirs or [])]:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            try:
                skeleton = Skeleton.model_validate(tomllib.loads(path.read_text()))
            except (tomllib.TOMLDecodeError, ValidationError) as exc:
                raise UserError(f"skeleton {path}: invalid ({exc})") from exc
            found[skeleton.name] = skeleton
    return list(found.values())


_WORD = re.compile(r"[a-z0-9]+")


def search_skeletons(query: str, skeletons: list[Skeleton], top_k: int = 3) -> list[Skeleton]:
    """Rank skeletons by word overlap with the query (tags count double); best first."""
    words = set(_WORD.findall(query.lower()))

    def score(s: Skeleton) -> int:
        tags = set(_WORD.findall(" ".join(s.tags).lower()))
        text = set(_WORD.findall(f"{s.name} {s.title} {s.applies_when}".lower()))
        return 2 * len(words & tags) + len(words & text)

    ranked = sorted(skeletons, key=score, reverse=True)
    return [s for s in ranked if score(s) > 0][:top_k] or ranked[:top_k]


def knob_advice(skeletons: list[Skeleton]) -> dict[str, list[Any]]:
    """Merged knob advice of all skeletons: knob name -> values in first-seen order."""
    merged: dict[str, list[Any]] = {}
    for s in skeletons:
        for knob, values in s.knob_advice.items():
            bucket = merged.setdefault(knob, [])
            bucket.extend(v for v in values if v not in bucket)
    return merged


def save_skeleton(skeleton: Skeleton, folder: Path | None = None) -> Path:
    """Write a skeleton learned from a reviewed run (refuses to overwrite an existing name)."""
    folder = folder or user_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{skeleton.name}.toml"
    if path.exists() or skeleton.name in {s.name for s in load_skeletons()}:
        raise UserError(f"a skeleton named '{skeleton.name}' already exists")
    lines = [
        f"{key} = {_toml_value(value)}"
        for key, value in skeleton.model_dump().items()
        if key != "knob_advice"
    ]
    if skeleton.knob_advice:
        lines.append("\n[knob_advice]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in skeleton.knob_advice.items())
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def skeleton_from_proposal(
    name: str, title: str, diff: str, rationale: str, run_id: str, speedup: float | None
) -> Skeleton:
    """A new skeleton from a reviewed, proven patch (the reviewer names it)."""
    gain = f" Measured {speedup:.2f}x in run {run_id}." if speedup else ""
    return Skeleton(
        name=name,
        title=title,
        tags=sorted(set(_WORD.findall(f"{title} {rationale}".lower())))[:20],
        applies_when=rationale.strip() + gain,
        how_to_test="Apply the same change to the analogous code and run_experiment; it must "
        "come out IMPROVED with correctness passing.",
        example=diff.strip()[:4000] or "(knob assignment)",
        source=run_id,
    )


class LookupSkeletons(BaseModel):
    query: str = Field(description="What you are looking at, e.g. 'split loop recomputes norm'.")
    top_k: int = Field(2, ge=1, le=7, description="How many skeletons to return.")


@tool(
    "lookup_skeletons",
    "Find optimization patterns that may apply: when each applies, how to test it, an example.",
    LookupSkeletons,
)
def lookup_skeletons(p: LookupSkeletons, ctx: ToolContext) -> ToolResult:
    found = search_skeletons(p.query, load_skeletons(), p.top_k)
    return ToolResult(
        content="\n\n".join(s.render() for s in found),
        data={"skeletons": [s.name for s in found]},
    )
