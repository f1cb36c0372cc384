"""Runs exported as verified, reviewer-labelled training data (ATIF, OpenAI SFT, RL rows).

One path: `build.load_runs(store, runs, review)` reads a run's records; `build.build_trajectory(
bundle, weights)` makes its canonical, versioned record (`atif.Trajectory`: ATIF v1.4 plus
infra-agent's typed extension: steps, tool calls, observations, tokens/cost/logprobs, patches
with experiment evidence and verdicts, proposals with review decisions, rewards, the recorded
environment); each format is a function from that record to a row (`formats.FORMATS`), and
`export.export_dataset(store, fmt, out, parquet=, flt=, redactor=, weights=, jobs=)` writes the
rows as one JSONL or Parquet file with the same columns and values, redacted, validated, atomically.
`arrow.read_rows(path)` reads either file back. `rewards`: named reward components with weights
(the table of definitions is in that module's docstring). Redaction lives beside the store
(`infra_agent.redact`).
CLI: `infra-agent export --format openai-sft|rl|atif --out PATH [--parquet] [filters]`.
"""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.trajectories":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.trajectories")
