"""The serving judge without a server (deterministic): the signed-rank likelihood test on
synthetic per-prompt scores shaped like sglang-cpu-tiny's (measured: mean log-probability per
output token -5.85 nats, sd 0.27 between prompts; flat-logit tokens -8.04; tokens sampled for
another prompt -6.01), and the client's token count against the server's claim."""

from __future__ import annotations

import random

import pytest

from infra_agent.serving.harness.accuracy import compare_likelihood, signed_rank
from infra_agent.serving.harness.answers import verify_counts
from infra_agent.serving.load.datasets import random_sessions
from infra_agent.serving.load.generator import RequestRecord
from infra_agent.tasks.harness import IncorrectOutput

MODEL, SD = -5.85, 0.27


def _scores(rng: random.Random, n: int, mean: float, sd: float = SD) -> list[float]:
    return [rng.gauss(mean, sd) for _ in range(n)]


def test_signed_rank_matches_hand_computed_values() -> None:
    # 15 pairs all one way: W+ = 120 against a mean of 60 and sd sqrt(310): z = 59.5 / 17.607.
    z, p = signed_rank([0.1 * (i + 1) for i in range(15)])
    assert z == pytest.approx(59.5 / 310**0.5) and p == pytest.approx(7.3e-4, rel=0.05)
    assert signed_rank([-d for d in [0.1 * (i + 1) for i in range(15)]])[0] == pytest.approx(-z)
    # 14 pairs all one way are not enough at alpha 1e-3 (the smallest sample that can fail is 15).
    assert signed_rank([0.1 * (i + 1) for i in range(14)])[1] > 1e-3
    assert signed_rank([0.0, 0.0]) == (0.0, 1.0)  # zeros carry no sign
    assert signed_rank([1.0, -1.0, 2.0, -2.0]) == (0.0, 1.0)  # ties, balanced


def test_an_honest_candidate_passes_at_the_stated_false_alarm_rate() -> None:
    rng = random.Random(7)
    alarms = 0
    for _ in range(2000):  # A/A: both arms' prompts scored from the same distribution
        prompt_effects = _scores(rng, 64, 0.0, 0.5)  # prompts differ; pairs share the prompt
        base = [e + x for e, x in zip(prompt_effects, _scores(rng, 64, MODEL), strict=True)]
        cand = [e + x for e, x in zip(prompt_effects, _scores(rng, 64, MODEL), strict=True)]
        alarms += not compare_likelihood(base, cand, alpha=0.01).passed
    assert alarms <= 40  # 20 expected at alpha 0.01; the test is no more eager than stated


def test_flat_logits_and_filler_are_caught_from_small_samples() -> None:
    rng = random.Random(8)
    for wrong in (-8.04, 0.25 * MODEL + 0.75 * -8.04):  # flat logits; a quarter then filler
        test = compare_likelihood(_scores(rng, 16, MODEL), _scores(rng, 16, wrong))
        assert not test.passed and test.lower == 16 and test.z < 0
        assert "not drawn from the model's distribution" in test.render()
    # Likelier than the model's own samples (greedy decoding instead of sampling) fails too.
    greedy = compare_likelihood(_scores(rng, 32, MODEL), _scores(rng, 32, -4.0))
    assert not greedy.passed and greedy.z > 0 and "greedy" in greedy.render()


def test_power_against_the_wrong_context_grows_with_the_pairs_judged() -> None:
    rng = random.Random(9)
    caught = {n: 0 for n in (32, 256)}
    for n in caught:
        for _ in range(100):
            caught[n] += not compare_likelihood(
                _scores(rng, n, MODEL), _scores(rng, n, -6.01)
            ).passed
    assert caught[32] <= 40 and caught[256] >= 95, caught


def test_compare_likelihood_refuses_unpaired_input() -> None:
    with pytest.raises(ValueError, match="3 baseline prompts against 2"):
        compare_likelihood([1.0, 2.0, 3.0], [1.0, 2.0])
    empty = compare_likelihood([], [])
    assert empty.passed and empty.pairs == 0


def _records(sessions, claim_factor: int = 1, short: int = 0) -> list[RequestRecord]:  # type: ignore[no-untyped-def]
    out = []
    for i, s in enumerate(sessions):
        n = s.turns[0].output_len - (short if i == 0 else 0)
        out.append(RequestRecord(session=i, turn=0, success=True, prompt_tokens=8,
                                 prompt_ids=[5] * 8, output_tokens=n, output_ids=[7] * n,
                                 meta={"completion_tokens": n * claim_factor}))  # fmt: skip
    return out


def test_the_client_counts_and_a_claim_that_disagrees_is_incorrect() -> None:
    sessions = random_sessions(4, 8, 16, vocab_size=64, seed=1)
    verify_counts(_records(sessions), sessions)  # counts as asked, claims agree
    with pytest.raises(IncorrectOutput, match="token count inflated: .* claimed 4"):
        verify_counts(_records(sessions, claim_factor=4), sessions)
    with pytest.raises(IncorrectOutput, match="asked for"):
        truncated = _records(sessions, short=2)
        truncated[0].meta["completion_tokens"] = truncated[0].output_tokens
        verify_counts(truncated, sessions)
    with pytest.raises(IncorrectOutput, match="3 of 4 requests"):
        verify_counts(_records(sessions)[:3], sessions)
    silent = _records(sessions)
    silent[1].output_ids = None
    with pytest.raises(IncorrectOutput, match="carried no token ids"):
        verify_counts(silent, sessions)


def test_the_sandbox_evidence_names_what_confined_the_server() -> None:
    """A serving patch runs in its server: the experiment's sandbox evidence states the server's
    confinement (also for a start that failed), not the arm sandbox's, and says when no server
    was started."""
    from infra_agent.experiments.arms import effective_params
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.serving.isolation import ServerConfinement
    from infra_agent.tasks.harness import Arm
    from infra_agent.tasks.registry import find_task

    task = find_task("sglang-cpu-tiny")

    class Harness(ServingHarness):
        deployment_path = task.root / "deployment.toml"

    harness = Harness(task.manifest, effective_params(task.manifest, None))
    record = ServerConfinement(
        mode="bwrap", uid=231117, pid_namespace=True,
        in_force=["pidns:bwrap", "user:231117", "cgroup:freezer"], missing=["netns (no ip)"],
    )  # fmt: skip
    failed = Arm(name="candidate", sandbox=None, knobs={}, params={})  # type: ignore[arg-type]
    failed.state["confinement"] = record  # what prepare keeps from a failed start
    isolation, missing = harness.code_confinement(failed) or ([], [])
    assert isolation[0] == "server:bwrap" and "pidns:bwrap" in isolation, isolation
    assert "user:231117" in isolation and "workspace:arm-sandbox(files only)" in isolation
    assert missing == ["netns (no ip)"]
    none = Arm(name="candidate", sandbox=None, knobs={}, params={})  # type: ignore[arg-type]
    assert harness.code_confinement(none) == (
        [],
        ["server confinement unknown: no server was started"],
    )
