"""Work that grows with the answer's length, for `diagnosis`: the task's workload profiled again
with answers `LENGTH_CUT` times shorter (`LENGTH_CUT` times the requests, as many in flight:
as many tokens), against the task's own.

- A helper process (front end, detokenizer) runs no model: its CPU per generated token should
  not depend on how long the answer is. One whose does (`helper_growth`) is the process to look
  in (sglang-real-long-stream: the detokenizer decoding the whole answer every streamed step).
- In the scheduler the model's own attention grows with the context by design; what else grows
  with the answer is bookkeeping that should not (`outside_model`: the scheduler's profile with
  the model's forward pass left out; sglang-real-stop-pattern: `Req.tail_str` decoding the whole
  answer every decode step).

Pure functions over `diagnosis.ProfiledRun`s; `diagnosis` runs the workloads.
"""

from __future__ import annotations

from typing import Any

from infra_agent.feedback.pyprofile import FunctionProfile

LENGTH_MIN_OUTPUT = 128
"""Tasks whose answers (`output_len`) are at least this long are profiled again with answers
`LENGTH_CUT` times shorter."""
LENGTH_CUT = 4
LENGTH_GROWTH = 1.5
"""A helper whose CPU per generated token is this many times higher with the task's answers than
with answers `LENGTH_CUT` times shorter does per-token work over the whole answer."""
LENGTH_MIN_CORES = 0.1
"""...and it must keep at least this share of a core busy at the task's load (a fault that costs
the server little CPU is not the symptom)."""
LENGTH_NEAR = 0.8
"""What grows with the answer dominates the loops around it (stop-pattern: the scheduler's
`run_scheduler_process` 2.1x per token around a faster `Req.tail_str`; rl-rollout: the front
end's `handle_loop` 4.8x around the injected function's 5.9x), so a function named on that axis
must grow nearly as fast as the fastest."""
MODEL_FORWARD = "ModelRunner.forward ("
"""The frame (as py-spy writes it: 'name (file:line)') of the model's forward pass in SGLang's
scheduler process; what runs under it is the model."""


def helper_growth(
    short: Any, heavy: Any, tokens: tuple[int, int], helpers: dict[str, str], evidence: list[str]
) -> str | None:
    """The role of the helper whose CPU per generated token grows with the answer's length (the
    one whose growth costs the most CPU per token), or None. `tokens`: (short, heavy) output
    tokens; each helper's CPU per 1k tokens in both runs goes into the evidence."""
    st, ht = max(tokens[0], 1), max(tokens[1], 1)
    grown = []
    for role, name in helpers.items():
        a, b = short.cpu_s.get(role), heavy.cpu_s.get(role)
        if a is None or b is None or a <= 0:
            continue
        ratio = (b / ht) / (a / st)
        evidence.append(
            f"{name} CPU per 1k tokens: {1000 * b / ht:.3g} CPU-s with the task's answers, "
            f"{1000 * a / st:.3g} with answers {LENGTH_CUT}x shorter ({ratio:.2f}x)"
        )
        busy = heavy.cores.get(role, 0.0) >= LENGTH_MIN_CORES
        if ratio >= LENGTH_GROWTH and busy and short.helper(role) and heavy.helper(role):
            grown.append((b / ht - a / st, role))
    if not grown:
        return None
    role = max(grown)[1]
    evidence.append(
        f"the {helpers[role]}'s CPU per token grows with the answer's length (it runs no model: "
        "its work per token should not depend on it), so it is looked in"
    )
    return role


def outside_model(profile: FunctionProfile) -> FunctionProfile:
    """The profile without the samples taken in the model's forward pass; `samples` stays the
    whole profile's, so shares are of all the process's samples."""
    stacks = {s: n for s, n in profile.stacks.items() if MODEL_FORWARD not in s}
    return profile.model_copy(update={"stacks": stacks})
