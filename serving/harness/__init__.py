"""The harnesses serving tasks subclass: `ServingHarness` (`base`: one SGLang server per arm,
measured by a workload, its answers judged by `answers` and `accuracy`), `LogprobHarness`
(`logprobs`: returned log-probabilities against the un-injected engine, `reference`) and
`LoadCorruptionHarness` (`corruption`: outputs under load against the same tokens scored alone,
`corruption_diagnosis`). A task's `harness.py` imports its base class from here."""

from infra_agent.serving.harness.base import ServingHarness

__all__ = ["ServingHarness"]
