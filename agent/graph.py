"""The agent loop as a LangGraph graph.

    baseline -> propose -> tools -> experiment* -> reflect -> propose ... (until budget or finish)
                                                          -> submit -> review (interrupt) -> apply

`propose` asks the policy for the next reply; `tools` answers its instant tool calls (reading
code, instruments, proposing patches); `experiment` runs one verification per step, so every
finished experiment is checkpointed; `reflect` keeps the best proven result and decides whether to
go on; `submit` sends the best IMPROVED patch to the review queue; `review` waits for the human
(LangGraph `interrupt`), and `apply` applies what was approved. Every node is idempotent up to its
first side effect, and each side effect is looked up in the store before it is repeated: a resumed
run never re-runs an experiment or re-submits a proposal that already exists.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.prompts import SYSTEM_PROMPT, task_message
from infra_agent.agent.runlog import RunLog
from infra_agent.agent.state import AgentState, Budget, ExperimentOutcome, Message
from infra_agent.errors import UserError
from infra_agent.store import RunStore
from infra_agent.store.records import ExperimentRecord, ProposalStatus, RunStatus, ToolCall
from infra_agent.tasks.manifest import Task
from infra_agent.tools.base import ToolRegistry, ToolResult
from infra_agent.tools.context import ToolContext

EXPERIMENT_TOOL = "run_experiment"
FINISH_TOOL = "finish"


@dataclass
class AgentContext:
    """What the nodes use but the checkpoint does not hold: live objects, rebuilt on resume."""

    config: RunConfig
    task: Task
    store: RunStore
    policy: Any
    tools: ToolRegistry
    tool_context: ToolContext
    log: RunLog
    run_experiment: Callable[..., ExperimentRecord]
    """`infra_agent.experiments.run_experiment` or a parallel executor with its signature."""
    executor: Any = None
    """An `experiments.executors.Executor` running a reply's experiments as a batch, or None."""
    fingerprint: str = ""
    on_event: Callable[[str], None] = field(default=lambda text: None)
    """Progress text for the live view (current step)."""

    def budget(self, state: AgentState) -> Budget:
        """The run's budget, extended for each revision a reviewer asked for."""
        b = self.config.budget
        extra = state.revisions
        return b.model_copy(
            update={"experiments": b.experiments + 2 * extra, "turns": b.turns + 10 * extra}
        )


def _ctx(runtime: Runtime[AgentContext]) -> AgentContext:
    assert runtime.context is not None
    return runtime.context


def _timed(update: dict[str, Any], state: AgentState, started: float) -> dict[str, Any]:
    usage = update.get("usage", state.usage).model_copy()
    usage.wall_s += time.monotonic() - started
    update["usage"] = usage
    return update


def _answer(ctx: AgentContext, call: ToolCall, result: ToolResult) -> Message:
    message = Message(role="tool", content=result.content, tool_call_id=call.id, name=call.name)
    ctx.log.message(message, error=result.error)
    return message


# -- nodes -------------------------------------------------------------------------------------


def baseline(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Write the method and the task into the conversation, and record what baseline is."""
    ctx = _ctx(runtime)
    if state.messages:
        return {"phase": "baseline"}
    ctx.on_event("baseline")
    system = Message(role="system", content=SYSTEM_PROMPT)
    user = Message(
        role="user",
        content=task_message(ctx.task, ctx.config.objective, ctx.config.budget, ctx.fingerprint),
    )
    if not ctx.store.steps(state.run_id):  # a resume after a crash here must not log twice
        ctx.log.message(system)
        ctx.log.message(user)
        defaults = {n: k.default for n, k in ctx.task.manifest.knobs.items()}
        ctx.log.harness(
            f"baseline: task {ctx.task.name} workspace fingerprint {ctx.fingerprint[:12]}, "
            f"default knobs {json.dumps(defaults, default=str)}",
            name="baseline",
        )
    return {"messages": [system, user], "phase": "baseline"}


def propose(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Ask the policy for its next reply; log it (and every failed request) as it comes."""
    ctx, started = _ctx(runtime), time.monotonic()
    ctx.on_event(f"asking the {ctx.policy.name} policy")
    turn = ctx.policy.next_turn(state, ctx.tools.schemas())
    usage = state.usage.model_copy()
    usage.tokens += turn.prompt_tokens + turn.completion_tokens
    usage.cost_usd += turn.cost_usd
    for err in turn.errors:
        ctx.log.harness(
            f"model request failed (attempt {err.attempt}, {err.kind})",
            error=err.message,
            name="model",
        )
    update: dict[str, Any] = {"phase": "propose", "pending": [], "usage": usage}
    if turn.message is None:
        failures = state.model_failures + 1
        update["model_failures"] = failures
        if failures >= ctx.config.max_model_failures:
            update["stop_reason"] = f"model unavailable: {failures} requests failed after retries"
        return _timed(update, state, started)
    usage.turns += 1
    message = turn.message
    ctx.log.message(
        message,
        prompt_tokens=turn.prompt_tokens,
        completion_tokens=turn.completion_tokens,
        cost_usd=turn.cost_usd,
        logprobs=turn.logprobs,
    )
    messages = [*state.messages, message]
    update.update(model_failures=0, usage=usage)
    if not message.tool_calls:
        error = (
            "your reply called no tool. Every reply must call at least one of the tools "
            f"({', '.join(ctx.tools.names())}) with JSON arguments; call finish to stop."
        )
        note = Message(role="user", content=f"error: {error}")
        ctx.log.message(note, error=error)
        messages.append(note)
        invalid = state.invalid_replies + 1
        update["invalid_replies"] = invalid
        if invalid >= ctx.config.max_invalid_replies:
            update["stop_reason"] = f"{invalid} consecutive replies without a valid tool call"
    else:
        update["pending"] = list(message.tool_calls)
    update["messages"] = messages
    return _timed(update, state, started)


def tools(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Answer the reply's instant tool calls in order; leave experiments for the next node."""
    ctx, started = _ctx(runtime), time.monotonic()
    ctx.tool_context.known_patches = list(state.patches)
    messages, deferred = list(state.messages), []
    update: dict[str, Any] = {"phase": "tools"}
    valid = 0
    for call in state.pending:
        parsed = ctx.tools.parse(call.name, call.arguments)
        if isinstance(parsed, str):
            messages.append(_answer(ctx, call, ToolResult.failure(parsed)))
            continue
        valid += 1
        tool, params = parsed
        if tool.name == EXPERIMENT_TOOL:
            deferred.append(call)
        elif tool.name == FINISH_TOOL:
            update["stop_reason"] = f"the {ctx.policy.name} policy called finish"
            update["finish_summary"] = getattr(params, "summary", "")
            messages.append(
                _answer(ctx, call, ToolResult(content="stopping; submitting the best proven patch"))
            )
        else:
            ctx.on_event(f"tool {call.name}")
            messages.append(
                _answer(ctx, call, ctx.tools.call(call.name, call.arguments, ctx.tool_context))
            )
    update.update(
        messages=messages,
        pending=deferred,
        patches=list(ctx.tool_context.known_patches),
        invalid_replies=0 if valid else state.invalid_replies + 1,
    )
    if not valid and update["invalid_replies"] >= ctx.config.max_invalid_replies:
        update["stop_reason"] = (
            f"{update['invalid_replies']} consecutive replies without a valid tool call"
        )
    return _timed(update, state, started)


def _outcome(record: ExperimentRecord, ctx: AgentContext, reused: bool) -> ExperimentOutcome:
    perf = record.result.evidence.performance
    patch = ctx.store.get_patch(record.patch_id)
    knobs = dict(patch.knobs) if patch is not None else {}
    if patch is not None and patch.kind.value == "diff":
        summary = "diff: " + (", ".join(patch.files) or "?")
    else:
        summary = ", ".join(f"{k}={v}" for k, v in knobs.items()) or "defaults"
    return ExperimentOutcome(
        experiment_id=record.id,
        patch_id=record.patch_id,
        patch_summary=summary,
        knobs=knobs,
        verdict=record.result.verdict.value,
        flags=[f.value for f in record.result.flags],
        speedup=perf.speedup if perf else None,
        ci_low=perf.ci_low if perf else None,
        ci_high=perf.ci_high if perf else None,
        duration_s=record.duration_s,
        reused=reused,
    )


def experiment(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Run the first pending experiment (one per step, so each is checkpointed when done), or,
    with an executor, all pending ones as one parallel batch."""
    ctx, started = _ctx(runtime), time.monotonic()
    if ctx.executor is not None and len(state.pending) > 1:
        return _timed(experiment_batch(state, ctx), state, started)
    call, rest = state.pending[0], state.pending[1:]
    update: dict[str, Any] = {"phase": "experiment", "pending": rest}
    patch_id = json.loads(call.arguments).get("patch_id", "")
    done = [e for e in state.experiments if e.patch_id == patch_id]
    if done:  # asked again: answer from the record, spend nothing
        result = ToolResult(
            content=f"already measured in this run ({done[-1].experiment_id}): "
            f"{done[-1].verdict}, speedup {done[-1].speedup}; not re-run"
        )
        update["messages"] = [*state.messages, _answer(ctx, call, result)]
        return _timed(update, state, started)
    exhausted = state.usage.exhausted(ctx.budget(state))
    if exhausted:
        result = ToolResult.failure(f"not run: {exhausted}")
        update["messages"] = [*state.messages, _answer(ctx, call, result)]
        return _timed(update, state, started)
    stored = [e for e in ctx.store.experiments(state.run_id) if e.patch_id == patch_id]
    reused = bool(stored)
    try:
        patch = ctx.tool_context.patch(patch_id)
        if stored:  # finished before a crash, after the store write and before the checkpoint
            record = stored[-1]
        else:
            ctx.on_event(f"experiment on {patch_id[:12]}")
            ctx.log.harness(f"experiment started on patch {patch_id}", name="experiment")
            record = ctx.run_experiment(
                ctx.task,
                patch,
                sandbox=ctx.config.sandbox,
                params=ctx.config.params or None,
                store=ctx.store,
                run_id=state.run_id,
                progress=lambda stage: ctx.on_event(f"experiment on {patch_id[:12]}: {stage}"),
                seed=ctx.config.seed + len(state.experiments),
            )
    except UserError as exc:
        update["messages"] = [*state.messages, _answer(ctx, call, ToolResult.failure(str(exc)))]
        return _timed(update, state, started)
    outcome = _outcome(record, ctx, reused)
    usage = state.usage.model_copy()
    usage.experiments += 1
    budget = ctx.budget(state)
    left = f"\n[budget: {usage.left(budget)}]"
    result = ToolResult(
        content=f"experiment {record.id} on patch {patch_id[:12]}: {record.result.render()}{left}",
        data={"experiment_id": record.id},
    )
    update.update(
        usage=usage,
        experiments=[*state.experiments, outcome],
        messages=[*state.messages, _answer(ctx, call, result)],
    )
    return _timed(update, state, started)


def experiment_batch(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """Run every pending experiment on the executor at once (within the experiment budget)."""
    from infra_agent.experiments.executors import ExperimentRequest, run_batch

    messages, outcomes = list(state.messages), list(state.experiments)
    usage = state.usage.model_copy()
    budget = ctx.budget(state)
    measured = {e.patch_id for e in outcomes}
    stored = {e.patch_id: e for e in ctx.store.experiments(state.run_id)}
    batch: list[tuple[ToolCall, Any]] = []
    for call in state.pending:
        patch_id = json.loads(call.arguments).get("patch_id", "")
        if patch_id in measured:
            messages.append(
                _answer(
                    ctx,
                    call,
                    ToolResult(
                        content=f"already measured in this run; not re-run ({patch_id[:12]})"
                    ),
                )
            )
            continue
        if usage.experiments + len(batch) >= budget.experiments:
            messages.append(
                _answer(ctx, call, ToolResult.failure("not run: experiment budget used"))
            )
            continue
        try:
            batch.append((call, ctx.tool_context.patch(patch_id)))
        except UserError as exc:
            messages.append(_answer(ctx, call, ToolResult.failure(str(exc))))
        measured.add(patch_id)
    todo = [(c, p) for c, p in batch if p.hash not in stored]
    ctx.on_event(f"{len(todo)} experiments in parallel on the {ctx.config.executor} executor")
    for _, patch in todo:
        ctx.log.harness(f"experiment started on patch {patch.hash}", name="experiment")
    requests = [
        ExperimentRequest(
            id=call.id,
            task=str(ctx.task.root),
            patch=patch,
            sandbox=ctx.config.sandbox,
            params=ctx.config.params,
            seed=ctx.config.seed + len(outcomes) + i,
            run_id=state.run_id,
        )  # fmt: skip
        for i, (call, patch) in enumerate(todo)
    ]
    records = (
        {o.request_id: o.record for o in run_batch(ctx.executor, requests)} if requests else {}
    )
    for call, patch in batch:
        record = records.get(call.id) or stored[patch.hash]
        if call.id in records:
            ctx.store.put_experiment(record)
        outcome = _outcome(record, ctx, reused=call.id not in records)
        usage.experiments += 1
        outcomes.append(outcome)
        text = f"experiment {record.id} on patch {patch.hash[:12]}: {record.result.render()}"
        messages.append(
            _answer(ctx, call, ToolResult(content=f"{text}\n[budget: {usage.left(budget)}]"))
        )
    return {
        "phase": "experiment",
        "pending": [],
        "messages": messages,
        "experiments": outcomes,
        "usage": usage,
    }


def best_improved(state: AgentState) -> ExperimentOutcome | None:
    """The proven winner: IMPROVED with the highest speedup (ties: the earliest)."""
    wins = [e for e in state.experiments if e.verdict == "IMPROVED" and e.speedup is not None]
    return max(wins, key=lambda e: e.speedup or 0.0) if wins else None


def reflect(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Keep the best proven result; stop at the first limit reached or when the policy finished."""
    ctx = _ctx(runtime)
    reason = state.stop_reason or state.usage.exhausted(ctx.budget(state))
    best = best_improved(state)
    best_text = (
        f"best so far {best.patch_summary}: {best.speedup:.3f}x (CI {best.ci_low:.3f}-{best.ci_high:.3f})"
        if best is not None and best.ci_low is not None and best.ci_high is not None
        else "no IMPROVED result yet"
    )
    if reason or state.phase == "experiment":  # after each experiment, and when stopping
        decision = f"stop: {reason}" if reason else "continue"
        ctx.log.harness(
            f"decision: {decision}; {best_text}; {state.usage.left(ctx.budget(state))}",
            name="decision",
        )
    return {"phase": "reflect", "stop_reason": reason}


def submit(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Send the best IMPROVED patch to the review queue (once, even across resumes)."""
    from infra_agent.review.queue import submit_proposal

    ctx = _ctx(runtime)
    best = best_improved(state)
    if best is None:
        ctx.log.harness("nothing to submit: no experiment came out IMPROVED", name="decision")
        return {"phase": "submit"}
    existing = [
        p for p in ctx.store.proposals(run_id=state.run_id) if p.patch_hash == best.patch_id
    ]
    if existing:
        ids = [p.id for p in existing if p.id not in state.proposals]
        return {"phase": "submit", "proposals": [*state.proposals, *ids]}
    record = ctx.store.get_experiment(best.experiment_id)
    assert record is not None
    ctx.on_event("submitting to the review queue")
    rationale = state.finish_summary or ctx.tool_context.patch(best.patch_id).rationale
    proposal = submit_proposal(
        ctx.store,
        task=ctx.task,
        patch=ctx.tool_context.patch(best.patch_id),
        experiment=record,
        rationale=rationale,
        run_id=state.run_id,
    )
    ctx.log.harness(
        f"proposal {proposal.id} submitted: patch {best.patch_id[:12]} ({best.patch_summary}), "
        f"{best.speedup:.3f}x, risk {proposal.risk.value}, status {proposal.status.value}",
        name="proposal",
    )
    return {"phase": "submit", "proposals": [*state.proposals, proposal.id]}


def review(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Wait (interrupt) while a proposal is pending; the decision is read from the store."""
    ctx = _ctx(runtime)

    def statuses() -> dict[str, str]:
        out = {}
        for pid in state.proposals:
            p = ctx.store.get_proposal(pid)
            out[pid] = p.status.value if p is not None else "missing"
        return out

    current = statuses()
    while any(s == ProposalStatus.PENDING.value for s in current.values()):
        run = ctx.store.get_run(state.run_id)
        if run is not None and run.status != RunStatus.WAITING_REVIEW:
            run.status = RunStatus.WAITING_REVIEW
            ctx.store.put_run(run)
        # Everything above is idempotent: on resume this node runs again from its start.
        interrupt(
            {
                "run_id": state.run_id,
                "waiting_for": [p for p, s in current.items() if s == "pending"],
            }
        )
        current = statuses()
    update: dict[str, Any] = {"phase": "review", "review": current}
    for pid, status in current.items():
        if pid in state.review and state.review[pid] == status:
            continue
        ctx.log.harness(f"review: proposal {pid} is {status}", name="review")
        if (
            status == ProposalStatus.CHANGES_REQUESTED.value
            and state.revisions < ctx.config.max_revisions
        ):
            from infra_agent.review.queue import review_outcome

            note = Message(
                role="user",
                content="Reviewer feedback:\n" + review_outcome(ctx.store, pid).render(),
            )
            ctx.log.message(note)
            update.update(
                messages=[*state.messages, note],
                revisions=state.revisions + 1,
                stop_reason=None,
                finish_summary="",
            )
    return update


def apply(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Apply every approved proposal of this run, then close the run."""
    from infra_agent.review.apply import apply_approved

    ctx = _ctx(runtime)
    applied = dict(state.applied)
    for pid, status in state.review.items():
        if pid in applied or status not in ("approved", "applied"):
            continue
        proposal = ctx.store.get_proposal(pid)
        if proposal is not None and proposal.status == ProposalStatus.APPROVED:
            ctx.on_event(f"applying {pid}")
            try:
                proposal = apply_approved(
                    ctx.store, pid, reviewer=f"infra-agent run {state.run_id}"
                )
            except UserError as exc:  # e.g. the stored patch changed after approval
                ctx.log.harness(f"proposal {pid} not applied", error=str(exc), name="apply")
                continue
        where = proposal.applied_to if proposal is not None else "?"
        ctx.log.harness(f"applied proposal {pid}: {where}", name="apply")
        applied[pid] = where
    run = ctx.store.get_run(state.run_id)
    if run is not None:
        best = best_improved(state)
        run.status = RunStatus.FINISHED
        run.summary = (
            (
                f"best {best.patch_summary}: {best.speedup:.3f}x (IMPROVED)"
                if best is not None and best.speedup
                else "no IMPROVED configuration found"
            )
            + (f"; applied {len(applied)} proposal(s)" if applied else "")
            + f"; stopped: {state.stop_reason}"
        )
        ctx.store.put_run(run)
    return {"phase": "done", "applied": applied}


# -- routing -----------------------------------------------------------------------------------


def after_propose(state: AgentState) -> str:
    return "tools" if state.pending else "reflect"


def after_tools(state: AgentState) -> str:
    return "experiment" if state.pending else "reflect"


def after_experiment(state: AgentState) -> str:
    return "experiment" if state.pending else "reflect"


def after_reflect(state: AgentState) -> str:
    return "submit" if state.stop_reason else "propose"


def after_review(state: AgentState) -> str:
    return "propose" if state.stop_reason is None else "apply"


builder = StateGraph(AgentState, context_schema=AgentContext)
builder.add_node("baseline", baseline)
builder.add_node("propose", propose)
builder.add_node("tools", tools)
builder.add_node("experiment", experiment)
builder.add_node("reflect", reflect)
builder.add_node("submit", submit)
builder.add_node("review", review)
builder.add_node("apply", apply)
builder.add_edge(START, "baseline")
builder.add_edge("baseline", "propose")
builder.add_conditional_edges("propose", after_propose, ["tools", "reflect"])
builder.add_conditional_edges("tools", after_tools, ["experiment", "reflect"])
builder.add_conditional_edges("experiment", after_experiment, ["experiment", "reflect"])
builder.add_conditional_edges("reflect", after_reflect, ["submit", "propose"])
builder.add_edge("submit", "review")
builder.add_conditional_edges("review", after_review, ["propose", "apply"])
builder.add_edge("apply", END)
