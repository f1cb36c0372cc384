"""The reviewer approval queue: risk policy, queue, web UI and CLI.

- `risk.py`: a proposal's risk level and whether it may skip a human; the TOML policy format is
  documented there, and `default_policy.toml` is the bundled policy (`[review] policy = FILE` in
  infra-agent.toml replaces it).
- `queue.py`: `submit_proposal` (the agent's entry), `decide` (compare-and-set, bound to the
  patch hash recomputed from the stored bytes, refused on stale evidence), `review_outcome`
  (what the agent reads); `reverify.py`: a fresh experiment on the bytes stored now.
- `apply.py`: after a decision, resume the waiting agent run or apply the approved patch (git
  branch `infra-agent/<proposal-id>`, or the deployment's argument file).
- `web/`: `infra-agent review serve` (its own `r-<random>.localhost` name, token login, CSRF,
  checks before any body is read, server-rendered pages); `infra_agent.cli.review`: the
  terminal mirror (`list | show | approve | reject | request-changes | reverify | apply | serve`).
"""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.review":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.review")
