"""The output health guard: garbled text, repetition loops, speculative-decoding anomalies.

A serving change that makes outputs loop can look like a speed-up (a loop is easy to draft and
accept), so every serving verdict is gated on output health. Rules (names used in reports):

- `garbled_text`: the share of bad characters (U+FFFD from invalid UTF-8, control characters
  other than tab/newline/CR, private-use, unassigned or surrogate code points, and, when the
  expected alphabet is known, characters outside it) is at least `max_bad_char_ratio` with at
  least `min_bad_chars` of them.
- `repetition_loop`: a block of at most `max_period` tokens (or characters, without token ids)
  repeats back to back at least `min_loop_repeats` times over at least `min_loop_span` tokens,
  or, in an output shorter than that, over at least `min_loop_share` of it (and
  `min_short_loop` tokens): a 16-token output padded with one repeated token trips it.
- `spec_low_accept_length`: `spec_accept_length` below 1.4 after more than 128 generated tokens
  (garbled output is hard to draft: the public rule from GLM-5 serving).
- `spec_high_accept_rate`: speculative accept rate above 0.96 (repetition is trivially drafted).

Offline: `check_output(text, token_ids, meta)` scores one finished output; `score_outputs(...)`
scores a run into a `HealthReport` (counts per rule, per 10,000). Online: `StreamGuard` is fed
deltas of a streaming response and returns the first `HealthIssue` that means "abort and
retry" (spec rules once past 128 tokens, loops as soon as they are long enough).
`compare_health(baseline, candidate)` names the rules the candidate trips more often.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

Rule = Literal["garbled_text", "repetition_loop", "spec_low_accept_length", "spec_high_accept_rate"]
RULES: tuple[Rule, ...] = (
    "garbled_text",
    "repetition_loop",
    "spec_low_accept_length",
    "spec_high_accept_rate",
)


class HealthRules(BaseModel):
    """Thresholds of the guard (defaults: the public spec-decoding rule, conservative others)."""

    max_bad_char_ratio: float = 0.02
    """Share of bad characters in an output from which it counts as garbled."""
    min_bad_chars: int = 3
    """...and at least this many bad characters (one stray byte is not garbled text)."""
    alphabet: str | None = None
    """Characters the model can legitimately produce; others count as bad (None: any printable)."""
    max_period: int = 32
    """Longest repeated block (tokens) considered a loop."""
    min_loop_span: int = 48
    """A loop must cover at least this many tokens..."""
    min_loop_repeats: int = 4
    """...and repeat its block at least this many times."""
    min_loop_share: float = 0.5
    """In a finished output shorter than `min_loop_span`, a loop covering this share of it counts..."""
    min_short_loop: int = 8
    """...when it spans at least this many tokens."""

    def loop_span(self, length: int) -> int:
        """The shortest loop (tokens) that trips `repetition_loop` in a finished output of
        `length` tokens."""
        share = max(self.min_short_loop, math.ceil(self.min_loop_share * length))
        return min(self.min_loop_span, share)

    min_spec_accept_length: float = 1.4
    """Accept length below this after `spec_min_tokens` tokens trips `spec_low_accept_length`."""
    spec_min_tokens: int = 128
    max_spec_accept_rate: float = 0.96


class HealthIssue(BaseModel):
    rule: Rule
    detail: str
    """The numbers that tripped the rule, in words."""


class OutputHealth(BaseModel):
    """The verdict on one output."""

    healthy: bool
    issues: list[HealthIssue] = Field(default_factory=list)


class HealthReport(BaseModel):
    """Health of a whole run: how many outputs tripped each rule."""

    outputs: int
    unhealthy: int
    per_rule: dict[str, int] = Field(default_factory=dict)
    examples: list[str] = Field(default_factory=list)
    """Up to three short descriptions of unhealthy outputs."""

    @property
    def unhealthy_per_10k(self) -> float:
        return 1e4 * self.unhealthy / self.outputs if self.outputs else 0.0

    def as_health(self) -> dict[str, float | int | str | bool]:
        """Flat name -> value form for `Evidence.health` / `Harness.health`."""
        out: dict[str, float | int | str | bool] = {
            "outputs": self.outputs,
            "unhealthy": self.unhealthy,
            "unhealthy_per_10k": round(self.unhealthy_per_10k, 1),
        }
        for rule in RULES:
            out[f"rule.{rule}"] = self.per_rule.get(rule, 0)
        return out

    def render(self) -> str:
        head = (
            f"health: {self.unhealthy}/{self.outputs} unhealthy ({self.unhealthy_per_10k:.0f}/10k)"
        )
        rules = ", ".join(f"{r} {n}" for r, n in self.per_rule.items() if n)
        return head + (f"; {rules}" if rules else "") + "".join(f"\n  {e}" for e in self.examples)


def bad_characters(text: str, alphabet: str | None = None) -> int:
    """Count characters a healthy output should not contain (see `garbled_text`)."""
    allowed = set(alphabet) if alphabet is not None else None
    bad = 0
    for ch in text:
        if ch in "\n\t\r":
            continue
        cat = unicodedata.category(ch)
        if (
            ch == "\ufffd"
            or cat in ("Cc", "Co", "Cn", "Cs")
            or (allowed is not None and ch not in allowed)
        ):
            bad += 1
    return bad


def find_loop(
    seq: Sequence[Any], rules: HealthRules, min_span: int | None = None
) -> tuple[int, int, int] | None:
    """The longest back-to-back repetition: (period, span, start) or None if shorter than
    `min_span` (default: `rules.min_loop_span`) or repeated fewer than `min_loop_repeats` times."""
    n = len(seq)
    needed = rules.min_loop_span if min_span is None else min_span
    best: tuple[int, int, int] | None = None
    for period in range(1, min(rules.max_period, n // 2) + 1):
        run = 0
        for i in range(period, n + 1):
            if i < n and seq[i] == seq[i - period]:
                run += 1
                continue
            span = run + period
            if run and span >= needed and span >= rules.min_loop_repeats * period:
                if best is None or span > best[1]:
                    best = (period, span, i - span)
            run = 0
    return best


def spec_stats(meta: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """(accept length, accept rate) from SGLang's per-request meta_info, when present.

    SGLang reports `spec_accept_length` (accepted tokens per verify step, including the bonus
    token); the rate is taken from `spec_accept_rate` when given, else derived from the accepted
    and drafted token counts (`spec_accept_token_num` / `spec_draft_token_num`).
    """
    if not meta:
        return None, None
    length = meta.get("spec_accept_length")
    rate = meta.get("spec_accept_rate")
    if rate is None:
        accepted, drafted = meta.get("spec_accept_token_num"), meta.get("spec_draft_token_num")
        if accepted is not None and drafted:
            rate = float(accepted) / float(drafted)
    return (
        float(length) if length is not None else None,
        float(rate) if rate is not None else None,
    )


def _spec_issues(
    meta: Mapping[str, Any] | None, generated: int, rules: HealthRules
) -> list[HealthIssue]:
    length, rate = spec_stats(meta)
    issues = []
    if (
        length is not None
        and generated > rules.spec_min_tokens
        and length < rules.min_spec_accept_length
    ):
        issues.append(
            HealthIssue(
                rule="spec_low_accept_length",
                detail=f"spec_accept_length {length:.2f} < {rules.min_spec_accept_length} after {generated} tokens",
            )
        )
    if rate is not None and rate > rules.max_spec_accept_rate:
        issues.append(
            HealthIssue(
                rule="spec_high_accept_rate",
                detail=f"spec accept rate {rate:.3f} > {rules.max_spec_accept_rate}",
            )
        )
    return issues


def check_output(
    text: str,
    token_ids: Sequence[int] | None = None,
    meta: Mapping[str, Any] | None = None,
    rules: HealthRules | None = None,
) -> OutputHealth:
    """Score one finished output (offline)."""
    rules = rules or HealthRules()
    issues: list[HealthIssue] = []
    bad = bad_characters(text, rules.alphabet)
    if text and bad >= rules.min_bad_chars and bad / len(text) >= rules.max_bad_char_ratio:
        issues.append(HealthIssue(rule="garbled_text", detail=f"{bad}/{len(text)} bad characters"))
    seq: Sequence[Any] = token_ids if token_ids is not None else text
    loop = find_loop(seq, rules, rules.loop_span(len(seq)))
    if loop is not None:
        unit = "tokens" if token_ids is not None else "characters"
        period, span, start = loop
        issues.append(
            HealthIssue(
                rule="repetition_loop",
                detail=f"a {period}-{unit[:-1]} block repeats over {span} {unit} from {start}",
            )
        )
    generated = (
        len(token_ids) if token_ids is not None else int((meta or {}).get("completion_tokens", 0))
    )
    issues += _spec_issues(meta, generated, rules)
    return OutputHealth(healthy=not issues, issues=issues)


class StreamGuard:
    """Online guard for one streaming response: feed deltas, abort on the first issue returned."""

    def __init__(self, rules: HealthRules | None = None) -> None:
        self.rules = rules or HealthRules()
        self.text = ""
        self.token_ids: list[int] = []
        self.tripped: HealthIssue | None = None

    def feed(
        self,
        text_delta: str = "",
        token_ids: Iterable[int] = (),
        meta: Mapping[str, Any] | None = None,
    ) -> HealthIssue | None:
        """Add a chunk; return the issue that means "abort and retry", once, else None."""
        if self.tripped is not None:
            return None
        self.text += text_delta
        self.token_ids.extend(token_ids)
        generated = len(self.token_ids) or int((meta or {}).get("completion_tokens", 0))
        issues = _spec_issues(meta, generated, self.rules)
        if not issues:
            # Only the recent tail can hold a new loop; scanning it keeps feeding O(window).
            window = 4 * max(
                self.rules.min_loop_span, self.rules.max_period * self.rules.min_loop_repeats
            )
            seq: Sequence[Any] = self.token_ids[-window:] if self.token_ids else self.text[-window:]
            loop = find_loop(seq, self.rules)
            if loop is not None:
                issues = [
                    HealthIssue(
                        rule="repetition_loop",
                        detail=f"a {loop[0]}-long block repeats over {loop[1]}",
                    )
                ]
        if not issues:
            tail = self.text[-512:]
            bad = bad_characters(tail, self.rules.alphabet)
            if (
                bad >= self.rules.min_bad_chars
                and bad / max(len(tail), 1) >= self.rules.max_bad_char_ratio
            ):
                issues = [
                    HealthIssue(
                        rule="garbled_text",
                        detail=f"{bad}/{len(tail)} bad characters in the last chunk",
                    )
                ]
        self.tripped = issues[0] if issues else None
        return self.tripped


def score_outputs(
    outputs: Iterable[tuple[str, Sequence[int] | None, Mapping[str, Any] | None]],
    rules: HealthRules | None = None,
) -> HealthReport:
    """Score a run's outputs, each (text, token_ids or None, meta or None)."""
    per_rule: dict[str, int] = dict.fromkeys(RULES, 0)
    total = unhealthy = 0
    examples: list[str] = []
    for text, ids, meta in outputs:
        total += 1
        result = check_output(text, ids, meta, rules)
        if not result.healthy:
            unhealthy += 1
            for issue in result.issues:
                per_rule[issue.rule] += 1
            if len(examples) < 3:
                examples.append(
                    f"{result.issues[0].rule}: {result.issues[0].detail}: {text[:60]!r}"
                )
    return HealthReport(outputs=total, unhealthy=unhealthy, per_rule=per_rule, examples=examples)


def _rate(health: Mapping[str, Any], key: str) -> tuple[int, int]:
    return int(health.get(key, 0)), int(health.get("outputs", 0))


def compare_health(
    baseline: Mapping[str, Any] | HealthReport,
    candidate: Mapping[str, Any] | HealthReport,
    *,
    z: float = 2.0,
) -> list[str]:
    """Rules the candidate trips more often than baseline, each named, with the counts.

    "More often" is a one-sided two-proportion test at `z` standard errors (plus at least two
    more trips than baseline would have at the same rate), so a single chance trip on a small
    run does not block a candidate while a loop in most outputs always does.
    """
    b = baseline.as_health() if isinstance(baseline, HealthReport) else baseline
    c = candidate.as_health() if isinstance(candidate, HealthReport) else candidate
    problems = []
    for rule in RULES:
        kb, nb = _rate(b, f"rule.{rule}")
        kc, nc = _rate(c, f"rule.{rule}")
        if nc == 0 or kc == 0:
            continue
        pb = kb / nb if nb else 0.0
        pc = kc / nc
        pooled = (kb + kc) / (nb + nc) if nb + nc else 0.0
        se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / max(nb, 1) + 1 / nc))
        if pc > pb and (pc - pb) / se >= z and kc - pb * nc >= 2:
            problems.append(
                f"health rule {rule}: candidate tripped it in {kc}/{nc} outputs vs baseline {kb}/{nb}"
            )
    return problems
