"""compare_samples: verdicts on synthetic samples with known effects, determinism, bad input."""

import numpy as np
import pytest

from infra_agent.errors import UserError
from infra_agent.feedback.bench import compare_samples


def _times(median: float, n: int, seed: int, spread: float = 0.02) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(median * (1 + spread * rng.standard_normal(n)))


def test_slower_candidate_is_slower_with_speedup_below_one() -> None:
    c = compare_samples(_times(1.0, 40, 1), _times(1.2, 40, 2), higher_is_better=False)
    assert c.verdict == "SLOWER"
    assert c.ci_high < 1.0
    assert 0.8 < c.speedup < 0.87


def test_throughput_orientation_higher_is_better() -> None:
    c = compare_samples(_times(100, 40, 1), _times(120, 40, 2), higher_is_better=True)
    assert c.verdict == "FASTER"
    assert c.ci_low > 1.0 and 1.15 < c.speedup < 1.25


def test_identical_distributions_are_same() -> None:
    c = compare_samples(
        _times(1.0, 60, 1, 0.005), _times(1.0, 60, 2, 0.005), higher_is_better=False
    )
    assert c.verdict == "SAME"
    assert c.ci_low < 1.0 < c.ci_high


def test_too_few_or_too_noisy_is_ambiguous_with_flags() -> None:
    c = compare_samples([1.0, 1.5], [1.2, 0.9], higher_is_better=False)
    assert c.verdict == "AMBIGUOUS"
    assert "few_samples" in c.noise
    noisy = compare_samples(
        _times(1.0, 20, 1, 0.3), _times(1.0, 20, 2, 0.3), higher_is_better=False
    )
    assert noisy.verdict == "AMBIGUOUS"
    assert "high_iqr" in noisy.noise


def test_drift_is_flagged() -> None:
    drifting = list(np.linspace(1.0, 1.3, 30))
    c = compare_samples(drifting, _times(1.0, 30, 3), higher_is_better=False)
    assert "drift" in c.noise


def test_deterministic_for_a_seed_and_paired_mode() -> None:
    a, b = _times(1.0, 30, 1, 0.05), _times(1.05, 30, 2, 0.05)
    assert compare_samples(a, b, higher_is_better=False) == compare_samples(
        a, b, higher_is_better=False
    )
    p = compare_samples(a, b, higher_is_better=False, paired=True)
    assert "paired" in p.method and p.n_baseline == 30


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [1.0, 0.0]])
def test_bad_samples_raise_user_error(bad: list[float]) -> None:
    with pytest.raises(UserError):
        compare_samples(bad, [1.0, 2.0, 3.0], higher_is_better=False)
    with pytest.raises(UserError):
        compare_samples([1.0, 2.0], [1.0], higher_is_better=False, paired=True)
