"""`python -m infra_agent.cli`: the `infra-agent` command."""

from infra_agent.cli import main

main()
