"""Runs exported as verified, reviewer-labelled training data (ATIF, OpenAI SFT, RL rows).

Python API:
- `build.load_run(store, run) -> RunBundle`, `build.build_trajectory(bundle, redactor=,
  weights=) -> atif.Trajectory`: one run as the canonical ATIF-v1.4-shaped record (steps, tool
  calls, observations, tokens/cost/logprobs, patches with experiment evidence and verdicts,
  proposals with review decisions, rewards, environment fingerprint), redacted and validated.
- `export.export_dataset(store, fmt, out, parquet=, flt=ExportFilter(...), redactor=, weights=,
  jobs=) -> ExportSummary`: one JSONL or Parquet file, atomically, rows redacted and validated
  per batch first. `rows.run_row(bundle, fmt, weights)`: an openai-sft / rl row straight from the
  store records (the export's fast path; equal to `formats.sft_row` / `rl_row` of the Trajectory);
  `trusted.load_trusted_runs(store, runs, review)`: the bundles for it from the store's parsed
  JSON bodies without validating them again (what the export uses; `trusted_bodies=False` for
  validated records, same bytes).
- `formats`: row models (`SftRow`, `RlRow`), their Arrow schemas, `trajectory_from_parquet_row`.
- `rewards`: named reward components with weights (`DEFAULT_WEIGHTS`, `parse_weights`,
  `reweight`); the table of definitions is in that module's docstring.
- `redact.redact_text(text)`: secrets out of text (store writers call it before writing);
  `redact.Redactor.from_environment(patterns, extra=...)` for a configured redactor, with
  `texts(list)` / `table(pa.Table)` redacting a whole batch (one RE2 pass picks the candidates).
- `environment.capture_environment()`: package versions and hardware, for the agent to keep in
  `RunRecord.config["environment"]` at run start (exports then carry it).
CLI: `infra-agent export --format openai-sft|rl|atif --out PATH [--parquet] [filters]`.
"""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.trajectories":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.trajectories")
