"""infra-agent: an LLM agent that optimizes LLM serving systems, proving every change by experiment.

The repository root is this package. Its folders are the architecture:
`agent/` decides, `tools/` is what the agent may call, `feedback/` measures, `sandboxes/` isolates
and executes, `tasks/` defines what is optimized, `experiments/` judges a patch, `serving/` drives
a real SGLang server, `store/` records every run, `review/` is the human approval queue and
`trajectories/` exports runs as training data.
"""

__version__ = "0.1.0"
