"""The corruption harness's measure, offline: how far a turn's distributions under load are from
the same tokens scored alone (`logprob_shift`), and which turns count as corrupted."""

from __future__ import annotations

import math

import pytest

from infra_agent.serving.harness.corruption import LoadCorruptionHarness, Scored, logprob_shift


def flat(ids: list[int], p: float = 0.04) -> dict[int, float]:
    """A top-k list of a flat distribution, as the tiny model gives (top probability ~0.04)."""
    return {t: math.log(p) for t in ids}


def test_same_distribution_has_no_shift() -> None:
    assert logprob_shift(flat([1, 2, 3]), flat([3, 2, 1])) == 0.0


def test_a_shift_among_common_tokens_is_measured_in_nats() -> None:
    loaded = {1: -3.0, 2: -3.2, 3: -3.4}
    alone = {1: -3.0, 2: -3.5, 3: -3.4}
    assert logprob_shift(loaded, alone) == pytest.approx(0.3)


def test_a_token_in_one_list_only_counts_by_its_lower_bound() -> None:
    # Token 4 is at -2.0 under load; alone it is not in the top 3, so at most -3.4 there.
    loaded = {1: -3.0, 2: -3.2, 4: -2.0}
    alone = {1: -3.0, 2: -3.2, 3: -3.4}
    assert logprob_shift(loaded, alone) == pytest.approx(1.4)
    # Swapping the last place between near ties is no shift (what batching noise does).
    assert logprob_shift({1: -3.0, 2: -3.40}, {1: -3.0, 3: -3.41}) == pytest.approx(0.01)


def test_a_missing_distribution_is_no_evidence() -> None:
    assert logprob_shift({}, flat([1])) == 0.0


def test_corrupted_turns_are_those_past_the_threshold() -> None:
    """Total variation would not see this: the tiny model's flat distributions move a few 0.01
    of top-k mass for a context change that moves log-probs by half a nat."""
    harness = LoadCorruptionHarness.__new__(LoadCorruptionHarness)
    harness.params = {"corruption_nats": 0.1}
    clean = Scored(prompt=[1], output=[2], top=[], max_shift_nats=0.035)
    bad = Scored(prompt=[1], output=[2], top=[], max_shift_nats=0.5)
    assert harness.corrupted([clean, bad]) == [bad]
