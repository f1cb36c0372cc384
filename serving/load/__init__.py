"""The load a serving task sends: request datasets (`datasets`), the async load generator for
SGLang's `/generate` and OpenAI `/v1/completions` (`generator`), a workload run's metrics
(`metrics`: throughput, TTFT/TPOT percentiles, goodput) and stress reproduction (`stress`)."""
