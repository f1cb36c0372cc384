"""Start, resume and finish agent runs: the graph wired to a store, a policy and a checkpointer.

The checkpoint file sits next to the run store (`<db>.checkpoints.sqlite`, private like the
store); the LangGraph thread id is the run id. Checkpoints are redacted as they are written
(`checkpoint_serde`), and a finished run's checkpoints are deleted: only the run store keeps it.
A run that crashed or was interrupted continues from its last checkpoint (`resume_run`); a run
waiting at the review interrupt continues once its proposal is decided (`resume_after_review`,
called by the review UI from any process).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command
from pydantic import BaseModel, Field

from infra_agent.agent.checkpoint_serde import RedactingSerializer
from infra_agent.agent.configuration import AgentContext, DeferredPolicy, RunConfig, build_policy
from infra_agent.agent.graph import builder
from infra_agent.agent.handoff import best_improved
from infra_agent.agent.runlog import RunLog
from infra_agent.agent.state import AgentState, ExperimentOutcome, Usage
from infra_agent.config import Settings
from infra_agent.errors import UserError
from infra_agent.experiments import run_experiment, task_fingerprint
from infra_agent.experiments.executors import Executor, create_executor
from infra_agent.private import private_sqlite
from infra_agent.sandboxes.host import capture_environment
from infra_agent.store import RunStore, open_store
from infra_agent.store.records import ProposalStatus, RiskLevel, RunRecord, RunStatus
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

_STATE_TYPES = [
    ("infra_agent.agent.state", name)
    for name in ("Message", "ExperimentOutcome", "Usage", "Budget")
] + [
    ("infra_agent.store.records", "ToolCall"),
    ("infra_agent.store.records", "ProposalStatus"),
    ("infra_agent.store.verdict", "Verdict"),
    ("infra_agent.store.verdict", "Flag"),
]


def checkpoint_path(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + ".checkpoints.sqlite")


@contextmanager
def compiled_graph(
    store_path: Path,
) -> Iterator[CompiledStateGraph[AgentState, AgentContext, AgentState, AgentState]]:
    """The agent graph with its SQLite checkpointer next to the run store."""
    path = private_sqlite(checkpoint_path(store_path))
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
    conn.execute("PRAGMA secure_delete=ON")  # a pruned checkpoint's pages are zeroed
    try:
        saver = SqliteSaver(conn, serde=RedactingSerializer(allowed_msgpack_modules=_STATE_TYPES))
        yield builder.compile(checkpointer=saver)
    finally:
        conn.close()


def prune_checkpoints(saver: SqliteSaver, run_id: str) -> None:
    """Delete a finished run's checkpoints (the run store keeps the run) and their WAL frames."""
    saver.delete_thread(run_id)
    saver.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


class ProposalSummary(BaseModel):
    id: str
    status: ProposalStatus
    risk: RiskLevel
    patch_id: str
    expected_gain: float | None = None


class RunOutcome(BaseModel):
    """What `infra-agent optimize` reports at the end (or when it stops to wait for review)."""

    run_id: str
    task: str
    policy: str
    policy_reason: str
    status: RunStatus
    stop_reason: str | None = None
    experiments: list[ExperimentOutcome] = Field(default_factory=list)
    best: ExperimentOutcome | None = None
    """The best IMPROVED experiment (its CI excludes no-change), if any."""
    proposals: list[ProposalSummary] = Field(default_factory=list)
    applied: dict[str, str] = Field(default_factory=dict)
    usage: Usage = Field(default_factory=Usage)
    store: str = ""
    next_steps: list[str] = Field(default_factory=list)
    """What a person can do now (open the review UI, resume), as commands."""


def find_run_task(config: RunConfig, search_path: Iterable[Path] = ()) -> Task:
    """The run's task: its recorded folder, else by name (`search_path`: the configured
    `settings.tasks.search_path`)."""
    return find_task(config.task_root or config.task, search_path)


def _context(
    run: RunRecord,
    config: RunConfig,
    settings: Settings,
    store: RunStore,
    on_event: Callable[[str], None],
) -> AgentContext:
    task = find_run_task(config, settings.tasks.search_path)
    policy = DeferredPolicy(
        lambda: build_policy(config, settings.llm, task), config.policy, run.model
    )
    tool_context = ToolContext(
        task=task,
        store=store,
        run_id=run.id,
        sandbox=config.sandbox,
        params=config.params,
        author=policy.model or policy.name,
    )
    return AgentContext(
        config=config,
        task=task,
        store=store,
        policy=policy,
        tools=default_registry(config.feedback, task),
        tool_context=tool_context,
        log=RunLog(store, run.id),
        run_experiment=run_experiment,
        executor=_executor(config),
        fingerprint=task_fingerprint(task),
        review_policy=settings.review.policy,
        max_patch_bytes=settings.sandbox.max_patch_bytes,
        on_event=on_event,
    )


def _executor(config: RunConfig) -> Executor | None:
    if config.executor is None:
        return None
    options = {"parallel": config.parallel} if config.executor == "local" else {}
    return create_executor(config.executor, **options)


def _drive(
    run: RunRecord,
    graph_input: Any,
    settings: Settings,
    store: RunStore,
    store_path: Path,
    on_state: Callable[[dict[str, Any]], None] | None,
    on_event: Callable[[str], None],
) -> RunOutcome:
    config = RunConfig.model_validate(run.config)
    context = _context(run, config, settings, store, on_event)
    thread: RunnableConfig = {"configurable": {"thread_id": run.id}}
    with compiled_graph(store_path) as graph:
        try:
            stream = graph.stream(
                graph_input,
                thread,
                context=context,  # type: ignore[arg-type]
                stream_mode="values",
                durability="sync",
            )
            for values in stream:
                if on_state is not None and isinstance(values, dict):
                    on_state(values)
        except KeyboardInterrupt:
            _set_status(store, run.id, RunStatus.INTERRUPTED, "interrupted (Ctrl-C); resumable")
            raise
        except BaseException as exc:
            _set_status(
                store, run.id, RunStatus.FAILED, f"failed: {type(exc).__name__}: {exc}"[:300]
            )
            raise
        finally:
            context.tool_context.close()  # the servers the run's looks kept
            if context.executor is not None:
                context.executor.shutdown()
        snapshot = graph.get_state(thread)
        if not snapshot.next and isinstance(graph.checkpointer, SqliteSaver):
            prune_checkpoints(graph.checkpointer, run.id)
    values = snapshot.values if isinstance(snapshot.values, dict) else {}
    state = AgentState(**{k: v for k, v in values.items() if k in AgentState.__dataclass_fields__})
    if snapshot.interrupts:
        _set_status(store, run.id, RunStatus.WAITING_REVIEW, None)
    elif not snapshot.next:
        _set_status(store, run.id, RunStatus.FINISHED, _summary(state))
    return outcome(store, store_path, run.id, state, config)


def _summary(state: AgentState) -> str:
    """The finished run in a sentence: its best proven result, what was applied, why it stopped."""
    best = best_improved(state)
    found = (
        f"best {best.patch_summary}: {best.speedup:.3f}x (IMPROVED)"
        if best is not None and best.speedup
        else "no IMPROVED configuration found"
    )
    applied = f"; applied {len(state.applied)} proposal(s)" if state.applied else ""
    return f"{found}{applied}; stopped: {state.stop_reason}"


def _set_status(store: RunStore, run_id: str, status: RunStatus, summary: str | None) -> None:
    run = store.get_run(run_id)
    if run is not None:
        run.status = status
        if summary is not None:
            run.summary = summary
        store.put_run(run)


def outcome(
    store: RunStore, store_path: Path, run_id: str, state: AgentState, config: RunConfig
) -> RunOutcome:
    run = store.get_run(run_id)
    assert run is not None
    proposals = []
    for pid in state.proposals:
        p = store.get_proposal(pid)
        if p is not None:
            proposals.append(
                ProposalSummary(
                    id=p.id,
                    status=p.status,
                    risk=p.risk,
                    patch_id=p.patch_id,
                    expected_gain=p.expected_gain,
                )
            )
    db = f"--db {store_path} " if store_path else ""
    steps = []
    if run.status == RunStatus.WAITING_REVIEW:
        steps.append(
            f"infra-agent {db}review serve   (open the review UI; approving resumes this run)"
        )
        steps.append(f"infra-agent {db}review list")
    elif run.status in (RunStatus.INTERRUPTED, RunStatus.FAILED, RunStatus.RUNNING):
        steps.append(f"infra-agent {db}optimize --resume {run_id}")
    steps.append(f"infra-agent {db}runs show {run_id}")
    return RunOutcome(
        run_id=run_id,
        task=run.task,
        policy=run.policy,
        policy_reason=config.policy_reason,
        status=run.status,
        stop_reason=state.stop_reason,
        experiments=state.experiments,
        best=best_improved(state),
        proposals=proposals,
        applied=state.applied,
        usage=state.usage,
        store=str(store_path),
        next_steps=steps,
    )


def start_run(
    config: RunConfig,
    settings: Settings,
    *,
    on_run: Callable[[RunRecord], None] | None = None,
    on_state: Callable[[dict[str, Any]], None] | None = None,
    on_event: Callable[[str], None] = lambda text: None,
) -> RunOutcome:
    """Start a new run and drive it until it finishes, stops to wait for review, or fails."""
    store_path = settings.store.path()
    store = open_store(store_path)
    task = find_run_task(config, settings.tasks.search_path)
    tools = default_registry(config.feedback, task).names()
    config = config.model_copy(update={"task_root": str(task.root), "tools": tools})
    policy = build_policy(config, settings.llm, task)  # fail on bad input before recording a run
    run = RunRecord(
        task=task.name,
        objective=config.objective,
        policy=config.policy,
        model=policy.model,
        config=config.model_dump(mode="json"),
        environment=capture_environment(config.sandbox),
    )
    store.put_run(run)
    if on_run is not None:
        on_run(run)
    try:
        return _drive(
            run, AgentState(run_id=run.id), settings, store, store_path, on_state, on_event
        )
    finally:
        store.close()


def resume_run(
    run_id: str,
    settings: Settings,
    *,
    on_state: Callable[[dict[str, Any]], None] | None = None,
    on_event: Callable[[str], None] = lambda text: None,
    review_only: bool = False,
) -> RunOutcome:
    """Continue a run from its last checkpoint: after a crash or Ctrl-C, or after a review."""
    store_path = settings.store.path()
    store = open_store(store_path)
    try:
        run = store.get_run(run_id)
        if run is None:
            raise UserError(f"no run '{run_id}' in {store_path}")
        if run.status == RunStatus.FINISHED:
            raise UserError(f"run {run_id} already finished ({run.summary or 'finished'})")
        with compiled_graph(store_path) as graph:
            snapshot = graph.get_state({"configurable": {"thread_id": run_id}})
        if not snapshot.values and not snapshot.next:
            raise UserError(f"run {run_id} has no checkpoint in {checkpoint_path(store_path)}")
        # `next` leaves out a task whose writes were saved before a kill and the step after it not
        # yet checkpointed; such a step still has its tasks, a finished graph has none.
        if not snapshot.next and not snapshot.tasks:
            raise UserError(f"run {run_id} already finished ({run.summary or run.status.value})")
        if review_only and not snapshot.interrupts:
            raise UserError(f"run {run_id} is not waiting for review (status {run.status.value})")
        graph_input: Any = Command(resume={"decided": True}) if snapshot.interrupts else None
        _set_status(store, run_id, RunStatus.RUNNING, None)
        return _drive(run, graph_input, settings, store, store_path, on_state, on_event)
    finally:
        store.close()


def resume_after_review(store_path: Path | str, run_id: str, settings: Settings) -> None:
    """Resume a run that waits at the review interrupt, from any process.

    The decision is read from the store (the proposal's status), so call this after
    `review.queue.decide`. An approved patch is applied; requested changes go back to the agent
    (which then needs its policy: the endpoint comes from `settings`, the caller's: the CLI
    passes its invocation's, another process loads them with `config.load_settings`); the run
    store is the one at `store_path` whatever `settings` name.
    Raises UserError if the run is unknown, finished, or not waiting for review.
    """
    store = settings.store.model_copy(update={"db": Path(store_path)})
    resume_run(run_id, settings.model_copy(update={"store": store}), review_only=True)
