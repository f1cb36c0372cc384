"""sglang-real-rl-rollout-stall: streamed rollouts that ask for log-probabilities slow down.

The serving harness with the rollout client's request shape: every request streams increments
(the deployment's `incremental-streaming-output`) and asks for the log-probability of each output
token, its top-N alternatives and their text (params `top_logprobs_num`,
`return_text_in_logprobs`, read by `ServingHarness.load`), as RL rollout and evaluation clients
do. This file names the deployment.
"""

from pathlib import Path

from infra_agent.serving.harness import ServingHarness


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"
