"""sglang-logprob-drift: log-probabilities returned with sampled tokens, against the un-injected engine.

Everything is in `infra_agent.serving.harness.logprobs.LogprobHarness`; this file names the deployment.
"""

from pathlib import Path

from infra_agent.serving.harness.logprobs import LogprobHarness


class TaskHarness(LogprobHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"
