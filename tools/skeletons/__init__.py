"""Optimization skeletons: reusable patterns the agent looks up (`lookup_skeletons`), and grows
from proven patches.

Each skeleton is a TOML file: when it applies, how to test that it applies, a worked example,
and optionally `knob_advice` (knob name -> values worth trying) that seeds the search policy.
Bundled skeletons live in `tools/skeletons/bundled/`; skeletons saved from reviewed runs live in
`<data dir>/skeletons/` and are loaded after them.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, Field, ValidationError

from infra_agent.config import default_data_dir
from infra_agent.errors import UserError
from infra_agent.private import write_private
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
_STOP = frozenset(
    "a an and are as at be by each every for from has have in is it its of on one or per so "
    "than that the then this to too when where which while with".split()
)
FIELD_WEIGHTS = (("tags", 3.0), ("title", 2.0), ("text", 1.0))
"""A query word counts 3x in a skeleton's tags or name, 2x in its title, 1x in its text."""
MIN_RELEVANCE = 0.15
"""Skeletons scoring below this (or below half the best score) are left out as irrelevant."""


def _words(text: str) -> set[str]:
    """Lower-case words without stop words, a plural 's' dropped ('splits' -> 'split')."""
    out = set()
    for word in _WORD.findall(text.lower()):
        if word in _STOP:
            continue
        out.add(word[:-1] if len(word) > 3 and word.endswith("s") and word[-2] != "s" else word)
    return out


def _fields(s: Skeleton) -> dict[str, set[str]]:
    return {
        "tags": _words(" ".join([s.name, *s.tags])),
        "title": _words(s.title),
        "text": _words(f"{s.applies_when} {s.how_to_test}"),
    }


def rank_skeletons(
    query: str, skeletons: list[Skeleton]
) -> list[tuple[Skeleton, float, list[str]]]:
    """Every skeleton with its relevance to `query` in [0, 1] and the query words it matched,
    best first. A word's weight is its field's (tags > title > text) times its rarity among the
    skeletons (log(1 + n / skeletons containing it)); the score is the matched share of the
    weight the query's known words could reach."""
    fields = [_fields(s) for s in skeletons]
    known = [set().union(*f.values()) for f in fields]
    query_words = sorted(w for w in _words(query) if any(w in k for k in known))
    rarity = {
        w: math.log(1 + len(skeletons) / sum(1 for k in known if w in k)) for w in query_words
    }
    reachable = sum(FIELD_WEIGHTS[0][1] * rarity[w] for w in query_words) or 1.0
    ranked = []
    for skeleton, field in zip(skeletons, fields, strict=True):
        gained, matched = 0.0, []
        for w in query_words:
            weight = next((x for name, x in FIELD_WEIGHTS if w in field[name]), 0.0)
            if weight:
                gained += weight * rarity[w]
                matched.append(w)
        ranked.append((skeleton, gained / reachable, matched))
    ranked.sort(key=lambda r: -r[1])
    return ranked


def relevant_skeletons(
    query: str, skeletons: list[Skeleton], top_k: int = 3
) -> list[tuple[Skeleton, float, list[str]]]:
    """The relevant skeletons for `query` with their scores and matched words, best first, at
    most `top_k`: those scoring at least MIN_RELEVANCE and half the best score (maybe none)."""
    ranked = rank_skeletons(query, skeletons)
    best = ranked[0][1] if ranked else 0.0
    return [r for r in ranked if r[1] >= max(MIN_RELEVANCE, best / 2)][:top_k]


def search_skeletons(query: str, skeletons: list[Skeleton], top_k: int = 3) -> list[Skeleton]:
    """The relevant skeletons for `query`, best first (see `relevant_skeletons`)."""
    return [s for s, _, _ in relevant_skeletons(query, skeletons, top_k)]


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
    write_private(path, "\n".join(lines) + "\n")  # its example comes from a run
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
    skeletons = load_skeletons()
    found = relevant_skeletons(p.query, skeletons, p.top_k)
    if not found:
        names = ", ".join(s.name for s in skeletons)
        return ToolResult(
            content=f"no skeleton is relevant to '{p.query}' (relevance below "
            f"{MIN_RELEVANCE}); describe the code pattern in other words. Known: {names}",
            data={"skeletons": [], "scores": []},
        )
    left_out = len(skeletons) - len(found)
    parts = [
        f"relevance {score:.2f} (matched: {', '.join(words)})\n{s.render()}"
        for s, score, words in found
    ]
    note = f"\n\n({left_out} less relevant skeletons left out)" if left_out else ""
    return ToolResult(
        content="\n\n".join(parts) + note,
        data={
            "skeletons": [s.name for s, _, _ in found],
            "scores": [round(x, 3) for _, x, _ in found],
        },
    )
