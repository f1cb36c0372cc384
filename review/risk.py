"""Risk policy: how dangerous a proposal is, and whether it may skip a human.

A proposal's risk comes from what its patch touches and from the flags its experiment raised:

    knob change of an allow-listed argument  <  source patch (e.g. scheduling)  <  kernel or
    memory-management patch;  `suspicious` forces HIGH (an implausible gain, or one the metric's
    companion does not share: throughput far beyond tokens per server CPU-second), its reasons
    quoted; accuracy-near-threshold and health warnings raise the level by one; a patch that
    adds a secret-like literal (what the run store's redaction would remove: `TOKEN = "..."`, an
    `sk-...` key) is HIGH, because patches are kept byte-exact and so hold it raw.

The policy is a TOML file of rules, read top to bottom. Each touched file (or knob) takes the
FIRST rule whose globs match it; the strictest outcome over all touched items decides
(forbid > review > auto-approve). An item no rule matches needs review at MEDIUM risk.

    [[rule]]
    files = ["**/kernels/**", "**/*.cu"]   # globs over patch file paths (workspace-relative)
    action = "review"                       # auto-approve | review | forbid
    risk = "high"                           # low | medium | high (optional; default medium)
    reason = "kernel code"                  # shown to reviewers

    [[rule]]
    knobs = ["chunked_prefill_size", "schedule_*"]   # globs over knob names
    action = "auto-approve"
    risk = "low"

Globs: `*` matches within a path segment, `**` any number of segments, `?` one character.
Auto-approval also needs the experiment's verdict IMPROVED and none of the flags in
`blocking_flags` (top-level key; default: every flag except `noisy`).

Whatever the policy says, a win that noise could explain goes to a person: one measured with
the `noisy` flag, or whose 95% interval's low end lies within twice the task's minimum effect of
1 (`noise_could_explain`). A policy cannot turn this off.
"""

from __future__ import annotations

import json
import re
from enum import Enum
from functools import lru_cache
from pathlib import Path

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra_agent.errors import UserError
from infra_agent.judgement import SUSPICIOUS
from infra_agent.redact import redact_text
from infra_agent.store.records import PatchKind, PatchRecord, RiskLevel
from infra_agent.store.verdict import ExperimentResult, Flag, Verdict
from infra_agent.tasks.patch import glob_regex

DEFAULT_POLICY_PATH = Path(__file__).with_name("default_policy.toml")

_ORDER = [RiskLevel.LOW, RiskLevel.MEDIUM, RiskLevel.HIGH, RiskLevel.FORBIDDEN]


class PolicyAction(str, Enum):
    AUTO_APPROVE = "auto-approve"
    REVIEW = "review"
    FORBID = "forbid"


_STRICTNESS = {PolicyAction.AUTO_APPROVE: 0, PolicyAction.REVIEW: 1, PolicyAction.FORBID: 2}


class PolicyRule(BaseModel):
    """One line of the policy: globs over files and/or knobs, and what happens on a match."""

    model_config = ConfigDict(extra="forbid")

    files: list[str] = Field(default_factory=list)
    """Globs over the patch's file paths, relative to the task workspace."""
    knobs: list[str] = Field(default_factory=list)
    """Globs over knob names."""
    action: PolicyAction
    risk: RiskLevel = RiskLevel.MEDIUM
    """Risk level of an item this rule matches (ignored for forbid: always FORBIDDEN)."""
    reason: str = ""
    """Why, in words a reviewer reads."""


class RiskPolicy(BaseModel):
    """The parsed policy file."""

    model_config = ConfigDict(extra="forbid")

    rule: list[PolicyRule] = Field(default_factory=list)
    blocking_flags: list[Flag] = Field(
        default_factory=lambda: [
            Flag.SUSPICIOUS,
            Flag.ACCURACY_NEAR_THRESHOLD,
            Flag.HEALTH_WARNING,
            Flag.DIFFERENT_NODES,
        ]
    )
    """Flags that rule out auto-approval whatever the rules say."""
    source: str = "default"
    """Where the policy came from (file path or 'default')."""


class RiskAssessment(BaseModel):
    """The policy's answer for one proposal."""

    level: RiskLevel
    action: PolicyAction
    """What happens now: auto-approve, wait for review, or refuse."""
    reasons: list[str]
    """One line per matched rule or flag, for the reviewer."""


# The same glob dialect as a task's `editable` patterns (tasks.patch), compiled once per pattern.
_glob_regex = lru_cache(maxsize=256)(glob_regex)


def glob_match(pattern: str, path: str) -> bool:
    """True if `path` (posix, relative) matches `pattern` (`*`, `**`, `?`)."""
    path = path[2:] if path.startswith("./") else path
    return _glob_regex(pattern).match(path) is not None


def load_policy(path: Path | None = None) -> RiskPolicy:
    """Read a policy TOML file (the bundled default when `path` is None); UserError if malformed."""
    target = path or DEFAULT_POLICY_PATH
    try:
        data = tomllib.loads(target.read_text())
    except OSError as exc:
        raise UserError(f"risk policy {target}: cannot read ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"risk policy {target}: not valid TOML ({exc})") from exc
    try:
        policy = RiskPolicy.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise UserError(f"risk policy {target}: field '{where}': {first['msg']}") from exc
    for n, rule in enumerate(policy.rule):
        if not rule.files and not rule.knobs:
            raise UserError(f"risk policy {target}: rule {n + 1} has neither 'files' nor 'knobs'")
    policy.source = str(target) if path else "default"
    return policy


def _first_rule(policy: RiskPolicy, item: str, *, knob: bool) -> PolicyRule | None:
    for rule in policy.rule:
        globs = rule.knobs if knob else rule.files
        if any(glob_match(g, item) for g in globs):
            return rule
    return None


def _raise(level: RiskLevel, to: RiskLevel) -> RiskLevel:
    return _ORDER[max(_ORDER.index(level), _ORDER.index(to))]


def _bump(level: RiskLevel) -> RiskLevel:
    return level if level == RiskLevel.FORBIDDEN else _ORDER[min(_ORDER.index(level) + 1, 2)]


def secret_like_lines(patch: PatchRecord, limit: int = 3) -> list[str]:
    """Up to `limit` lines the patch adds that hold a secret-like literal (what `redact_text`
    would change), as `file:line: text` with the literal redacted."""
    if patch.kind == PatchKind.KNOBS:
        raw = json.dumps(patch.knobs, sort_keys=True, default=str)
        text = redact_text(raw)
        return [f"knobs: {text[:160]}"] if text != raw else []
    found: list[str] = []
    path, line_no = "?", 0
    for line in patch.diff.splitlines():
        hunk = _HUNK_START.match(line)
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0].removeprefix("b/")
        elif hunk is not None:
            line_no = int(hunk.group(1))
        elif line.startswith("+"):
            text = redact_text(line[1:])
            if text != line[1:]:
                found.append(f"{path}:{line_no}: {text.strip()[:160]}")
            line_no += 1
        elif line.startswith(" ") or not line:
            line_no += 1
    return found[:limit]


_HUNK_START = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)")


DEFAULT_MIN_EFFECT = 0.02
"""The manifest's default minimum effect, for evidence recorded before it was kept there."""


def noise_could_explain(result: ExperimentResult) -> str | None:
    """Why noise could explain an IMPROVED result (no policy may then approve it without a
    person), or None when the win stands clear of the noise."""
    if result.verdict != Verdict.IMPROVED:
        return None
    if Flag.NOISY in result.flags:
        return "the measurement was noisy (flag noisy)"
    perf = result.evidence.performance
    if perf is None:
        return "no measured interval backs the win"
    effect = perf.min_effect if perf.min_effect is not None else DEFAULT_MIN_EFFECT
    bound = 1.0 + 2.0 * effect
    if not perf.ci_low >= bound:  # NaN (a bound stored as null) counts as not shown
        return (
            f"the 95% interval's low end {perf.ci_low:.3f} is within twice the task's minimum "
            f"effect of 1 (below {bound:.3f})"
        )
    return None


def assess(
    patch: PatchRecord, result: ExperimentResult, policy: RiskPolicy | None = None
) -> RiskAssessment:
    """Risk level and action for `patch` backed by `result`, under `policy` (default bundled)."""
    policy = policy or load_policy()
    items = [(k, True) for k in sorted(patch.knobs)] if patch.kind == PatchKind.KNOBS else []
    items += [(f, False) for f in patch.files]
    level, action, reasons = RiskLevel.LOW, PolicyAction.AUTO_APPROVE, []
    if not items:
        level, action = RiskLevel.MEDIUM, PolicyAction.REVIEW
        reasons.append("patch touches nothing the policy can classify")
    for item, is_knob in items:
        what = f"knob {item}" if is_knob else item
        rule = _first_rule(policy, item, knob=is_knob)
        if rule is None:
            item_level, item_action = RiskLevel.MEDIUM, PolicyAction.REVIEW
            reasons.append(f"{what}: no policy rule matches; needs review")
        else:
            item_action = rule.action
            item_level = RiskLevel.FORBIDDEN if rule.action == PolicyAction.FORBID else rule.risk
            why = f" ({rule.reason})" if rule.reason else ""
            reasons.append(f"{what}: {rule.action.value}, {item_level.value} risk{why}")
        level = _raise(level, item_level)
        if _STRICTNESS[item_action] > _STRICTNESS[action]:
            action = item_action
    if Flag.SUSPICIOUS in result.flags:
        level = _raise(level, RiskLevel.HIGH)
        said = [r.removeprefix(SUSPICIOUS) for r in result.reasons if r.startswith(SUSPICIOUS)]
        reasons.append("flag suspicious: " + ("; ".join(said) or "an implausible result"))
    for flag in (Flag.ACCURACY_NEAR_THRESHOLD, Flag.HEALTH_WARNING):
        if flag in result.flags:
            level = _bump(level)
            reasons.append(f"flag {flag.value}: risk raised one level")
    secrets = secret_like_lines(patch)
    if secrets:
        level = _raise(level, RiskLevel.HIGH)
        reasons.append(
            "adds a secret-like literal (text the run store's redaction removes; patches are "
            "kept byte-exact, so the store holds it raw): " + "; ".join(secrets)
        )
    if action == PolicyAction.AUTO_APPROVE:
        blocking = [f.value for f in result.flags if f in policy.blocking_flags]
        if result.verdict != Verdict.IMPROVED:
            action = PolicyAction.REVIEW
            reasons.append(f"verdict {result.verdict.value}: only IMPROVED may be auto-approved")
        elif blocking:
            action = PolicyAction.REVIEW
            reasons.append(f"flags {', '.join(blocking)} rule out auto-approval")
        elif level != RiskLevel.LOW:
            action = PolicyAction.REVIEW
            reasons.append(f"{level.value} risk: only low risk may be auto-approved")
        elif (noise := noise_could_explain(result)) is not None:
            action = PolicyAction.REVIEW
            reasons.append(f"{noise}: noise could explain the win, so a person decides")
    return RiskAssessment(level=level, action=action, reasons=reasons)
