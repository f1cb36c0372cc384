"""The judgement core: every interval and every verdict in the tree is computed here.

One `Comparison` (baseline vs candidate on one metric: the improvement factor and its interval)
under one `Rule` (the task's minimum effect, its plausibility bound) gives one `Decision`
(IMPROVED, REGRESSED or NO_CHANGE, with its reasons and flags). The experiment's verdict
(experiments.measure) and the microbenchmark's word (feedback.bench: FASTER, SLOWER, SAME,
AMBIGUOUS, `Decision.word`) are two views of that one rule.

- `bootstrap`: `compare_samples` -> `Comparison` (paired or unpaired bootstrap, noise flags).
- `decision`: `decide(Comparison, Rule, ratios) -> Decision`: the minimum-effect rule, the sign
  test's veto, the noisy and suspicious flags.
- `intervals`: the sign test's interval, binomial tails, Clopper-Pearson, Poisson upper bound,
  Wilson, pass@k.
- `rates`: rare events judged on pooled counts (exact interval of the rate ratio).
- `power`: what a measurement can detect, the pairs a wanted resolution needs.
- `constraints`: secondary metrics shown within their limit, or broken.
- `describe`: percentiles of a sample (no interval, but the one home of quantiles).

Where it sits: right above `store/` in the layer order (tests/test_layers.py), below every other
folder, so that both `feedback/` (the microbenchmark) and `experiments/` (the cascade) import
it. It imports nothing of the project but store's typed records (`store.verdict`: the Verdict,
Flag and StopReason enums) and the root's `errors`. `tests/test_judgement_core.py` fails when an
interval or a verdict is computed outside it.
"""

from infra_agent.judgement.bootstrap import compare_samples
from infra_agent.judgement.comparison import BenchVerdict, Comparison
from infra_agent.judgement.decision import (
    BENCH_RULE,
    SUSPICIOUS,
    Decision,
    Rule,
    beyond_min_effect,
    decide,
)

__all__ = [
    "BENCH_RULE",
    "SUSPICIOUS",
    "BenchVerdict",
    "Comparison",
    "Decision",
    "Rule",
    "beyond_min_effect",
    "compare_samples",
    "decide",
]
