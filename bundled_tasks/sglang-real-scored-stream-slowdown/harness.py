"""sglang-real-scored-stream-slowdown: a streamed scoring job that asks for log-probabilities.

The serving harness with the scoring client's request shape: every request streams from the
native endpoint (cumulative chunks) and asks for the log-probability of each output token and of
its top-N alternatives (params `top_logprobs_num`, `return_text_in_logprobs`, read by
`ServingHarness.load`), as scoring and distillation clients do. This file names the deployment.
"""

from pathlib import Path

from infra_agent.serving.harness import ServingHarness


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"
