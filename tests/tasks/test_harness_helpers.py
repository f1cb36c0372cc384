"""Helpers that task harnesses share (tasks.harness). Expected bounds: chi2.ppf(0.95, 2k+2) / 2."""

import math

import pytest

from infra_agent.tasks.harness import poisson_upper, seeded_prompts


@pytest.mark.parametrize(("k", "expected"), [(0, -math.log(0.05)), (1, 4.7439), (10, 16.9622)])
def test_poisson_upper_matches_the_exact_bound(k: int, expected: float) -> None:
    assert poisson_upper(k) == pytest.approx(expected, abs=1e-3)


def test_seeded_prompts_depend_only_on_the_seed() -> None:
    assert seeded_prompts(5, 1) == seeded_prompts(5, 1)
    assert seeded_prompts(5, 1) != seeded_prompts(5, 2)
    assert all(0 <= p < 1 << 40 for p in seeded_prompts(100, 3))
