"""`infra-agent optimize`: run the agent loop on a task, live, and report what it proved;
`infra-agent skeletons list|show|save`: the optimization patterns the agent looks up."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from infra_agent.agent.policies import POLICIES
from infra_agent.errors import UserError
from infra_agent.store.records import ProposalStatus, RunStatus


def register(app: typer.Typer) -> None:
    app.add_typer(skeletons_app, name="skeletons")

    @app.command()
    def optimize(
        task: str = typer.Option(
            None, "--task", help="Task name or folder (default: settings tasks.default)."
        ),
        target: str = typer.Option(
            None,
            "--target",
            help="throughput | latency | accuracy (default: the task's objective).",
        ),
        policy: str = typer.Option(
            "auto", "--policy", help=f"auto | {' | '.join(POLICIES)} (scripted: test equipment)."
        ),
        budget: str = typer.Option(
            None,
            "--budget",
            help="Experiments ('8') or 'experiments=8,wall=30m,tokens=200k,turns=40,cost=2,looks=16'.",
        ),
        sandbox: str = typer.Option(
            None, "--sandbox", help="local | docker (default: settings sandbox.backend)."
        ),
        resume: str = typer.Option(
            None, "--resume", help="Continue run RUN_ID from its last checkpoint."
        ),
        script: Path = typer.Option(
            None, "--script", help="Replies to replay with --policy scripted."
        ),
        strategy: str = typer.Option(
            "tpe", "--search-strategy", help="tpe (Optuna) | random (search policy)."
        ),
        batch: int = typer.Option(1, "--batch", help="Configurations per search step."),
        executor: str = typer.Option(
            None, "--executor", help="local | ray: run a step's experiments in parallel."
        ),
        parallel: int = typer.Option(
            2, "--parallel", help="Experiments at once with --executor local."
        ),
        param: list[str] = typer.Option(
            [], "--param", help="Task scale parameter NAME=VALUE (repeatable)."
        ),
        seed: int = typer.Option(0, "--seed", help="Seed for experiments and the search."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Optimize a task: measure, propose patches, verify each by experiment, queue for review."""
        from infra_agent.agent.configuration import RunConfig, resolve_policy
        from infra_agent.agent.runner import find_run_task, resume_run, start_run
        from infra_agent.agent.state import Budget
        from infra_agent.agent.view import LiveView, render_outcome
        from infra_agent.cli.context import current
        from infra_agent.cli.options import parse_budget, parse_params
        from infra_agent.experiments.arms import effective_params
        from infra_agent.output import emit, err_console

        settings = current().settings()
        run_id: list[str] = []
        if resume:
            if task or script or budget:
                raise UserError(
                    "--resume continues a run with its own task, policy and budget; drop the other options"
                )
            from infra_agent.store import open_store

            path = settings.store.path()
            found = open_store(path, readonly=True).get_run(resume) if path.exists() else None
            if found is None:
                raise UserError(f"no run '{resume}' in {path}")
            stored = RunConfig.model_validate(found.config)
            title, run_budget = (
                f"resuming {resume} ({found.task}, {stored.policy} policy)",
                stored.budget,
            )
            run_id.append(resume)
        else:
            if executor not in (None, "local", "ray"):
                raise UserError(f"--executor: '{executor}' is not local or ray")
            if strategy not in ("tpe", "random"):
                raise UserError(f"--search-strategy: '{strategy}' is not tpe or random")
            chosen, reason = resolve_policy(policy, settings.llm, script)
            the_task = find_run_task(
                RunConfig(task=task or settings.tasks.default), settings.tasks.search_path
            )
            objective = target or the_task.manifest.objective
            m = the_task.manifest
            if objective != m.objective:
                why = (
                    "experiments measure only its primary objective's metric so far"
                    if objective in m.objectives
                    else f"it has no '{objective}' objective"
                )
                raise UserError(
                    f"--target {objective}: task {the_task.name} optimizes {m.objective} "
                    f"(metric {m.metric.name}); {why}"
                )
            run_budget = Budget(**parse_budget(budget))
            overrides = parse_params(param)
            typed = effective_params(m, overrides)  # unknown names refused before a run starts
            config = RunConfig(
                task=task or settings.tasks.default,
                task_root=str(the_task.root),
                objective=objective,
                policy=chosen,
                policy_reason=reason,
                budget=run_budget,
                sandbox=sandbox or settings.sandbox.backend,
                params={name: typed[name] for name in overrides},
                script=str(script.resolve()) if script else None,
                search_strategy=strategy,  # type: ignore[arg-type]
                search_batch=batch,
                executor=executor,  # type: ignore[arg-type]
                parallel=parallel,
                seed=seed,
            )
            err_console.print(reason)
            title = f"optimize {the_task.name} ({objective}) with the {chosen} policy"
        view = LiveView(err_console, title, run_budget)

        def on_run(new_id: str) -> None:
            run_id.append(new_id)
            view.event(f"run {new_id}")

        try:
            with view:
                if resume:
                    outcome = resume_run(resume, settings, on_state=view.state, on_event=view.event)
                else:
                    outcome = start_run(
                        config,
                        settings,
                        on_run=lambda run: on_run(run.id),
                        on_state=view.state,
                        on_event=view.event,
                    )
        except KeyboardInterrupt:
            rid = run_id[-1] if run_id else "RUN_ID"
            err_console.print(
                f"interrupted; resume with: infra-agent --db {settings.store.path()} optimize --resume {rid}"
            )
            sys.exit(130)
        emit(outcome, lambda console: render_outcome(outcome, console), as_json=as_json)
        if outcome.status is RunStatus.FAILED:
            raise typer.Exit(1)


skeletons_app = typer.Typer(help="Optimization skeletons: reusable patterns the agent looks up.")


@skeletons_app.command("list")
def list_skeletons(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """List the skeletons (bundled and learned from reviewed runs)."""
    from infra_agent.output import emit
    from infra_agent.tools.skeletons import load_skeletons

    found = load_skeletons()

    def render(console: Any) -> None:
        for s in found:
            console.print(f"{s.name:<32} {s.title}  [dim]({s.source})[/dim]")

    emit(found, render, as_json=as_json)


@skeletons_app.command("show")
def show_skeleton(name: str = typer.Argument(..., help="Skeleton name.")) -> None:
    """Show one skeleton: when it applies, how to test it, a worked example."""
    from infra_agent.tools.skeletons import load_skeletons

    for s in load_skeletons():
        if s.name == name:
            typer.echo(s.render())
            return
    raise UserError(f"no skeleton named '{name}' (see infra-agent skeletons list)")


@skeletons_app.command("save")
def save_from_proposal(
    proposal_id: str = typer.Argument(..., help="An approved or applied proposal."),
    name: str = typer.Option(..., "--name", help="Skeleton name (lowercase, dashes)."),
    title: str = typer.Option(..., "--title", help="One line: the pattern."),
) -> None:
    """Save a reviewed, proven patch as a new skeleton the agent can look up in later runs."""
    from pydantic import ValidationError

    from infra_agent.cli.context import current
    from infra_agent.tools.skeletons import save_skeleton, skeleton_from_proposal

    store = current().store(readonly=True)
    proposal = store.get_proposal(proposal_id)
    if proposal is None:
        raise UserError(f"proposal '{proposal_id}' not found")
    if proposal.status not in (ProposalStatus.APPROVED, ProposalStatus.APPLIED):
        raise UserError(
            f"proposal {proposal_id} is {proposal.status.value}; only reviewed, approved patches become skeletons"
        )
    patch = store.get_patch(proposal.patch_id)
    assert patch is not None
    diff = patch.diff or "knobs: " + ", ".join(f"{k}={v}" for k, v in patch.knobs.items())
    try:
        skeleton = skeleton_from_proposal(
            name,
            title,
            diff,
            proposal.rationale,
            proposal.run_id or proposal.id,
            proposal.expected_gain,
        )
    except ValidationError as exc:
        raise UserError(f"skeleton: {exc.errors()[0]['msg']}") from exc
    if patch.knobs:
        skeleton.knob_advice = {k: [v] for k, v in patch.knobs.items()}
    typer.echo(f"saved {save_skeleton(skeleton)}")
