"""The agent loop as a LangGraph graph.

    baseline -> propose -> tools -> experiment* -> reflect -> propose ... (until budget or finish)
                                                          -> submit -> review (interrupt) -> apply

`propose` asks the policy for the next reply; `tools` answers its instant tool calls; `experiment`
verifies the reply's patches, one per step (each checkpointed when done) or, with an executor,
all at once, each admitted by the same budget check; `reflect` keeps the best proven result and
decides whether to go on (when a budget runs out the policy gets one last reply, offered only
`finish`, to see the final results and write its summary); `submit`, `review` and `apply` hand
the best IMPROVED patch to a person and apply what was approved (agent/handoff.py). The run
record is the runner's to keep. Each side effect is looked up in the store before it is repeated: a
resumed run never re-runs an experiment or re-submits a proposal.
"""

from __future__ import annotations

import json
import time
from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from infra_agent.agent.configuration import AgentContext, run_context
from infra_agent.agent.handoff import apply, best_improved, review, submit
from infra_agent.agent.prompts import LAST_TURN_NOTE, LAST_TURN_REFUSAL, system_prompt, task_message
from infra_agent.agent.state import AgentState, ExperimentOutcome, Message
from infra_agent.errors import UserError
from infra_agent.experiments.executors import Executor, ExperimentRequest, run_batch
from infra_agent.experiments.extend import extendable
from infra_agent.experiments.verdict_text import verdict_text
from infra_agent.store.records import ExperimentRecord, ToolCall
from infra_agent.store.verdict import Flag, Verdict
from infra_agent.tasks.patch import Patch
from infra_agent.tools.base import ToolResult
from infra_agent.tools.kept_servers import SERVER_MEMORY

EXPERIMENT_TOOL = "run_experiment"
FINISH_TOOL = "finish"


def _timed(update: dict[str, Any], state: AgentState, started: float) -> dict[str, Any]:
    usage = update.get("usage", state.usage).model_copy()
    usage.wall_s += time.monotonic() - started
    return update | {"usage": usage}


def _answer(ctx: AgentContext, call: ToolCall, result: ToolResult) -> Message:
    message = Message(role="tool", content=result.content, tool_call_id=call.id, name=call.name)
    ctx.log.message(message, error=result.error)
    return message


def _with_budget(result: ToolResult, line: str) -> ToolResult:
    """The answer with the reply's budget line at its end (`Usage.budget_line`)."""
    return result.model_copy(update={"content": f"{result.content}\n{line}"})


def baseline(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Write the method and the task into the conversation, and record what baseline is."""
    ctx = run_context(runtime)
    if state.messages:
        return {"phase": "baseline"}
    ctx.on_event("baseline")
    system = Message(role="system", content=system_prompt(ctx.tools))
    task = task_message(
        ctx.task, ctx.config.objective, ctx.config.budget, ctx.fingerprint, ctx.config.params
    )
    user = Message(role="user", content=task)
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
    ctx, started = run_context(runtime), time.monotonic()
    ctx.on_event(f"asking the {ctx.policy.name} policy")
    schemas = ctx.tools.schemas()
    if state.last_turn:  # the budget is used up: only the summary is left to write
        schemas = [s for s in schemas if s["function"]["name"] == FINISH_TOOL]
    turn = ctx.policy.next_turn(state, schemas)
    usage = state.usage.model_copy()
    usage.tokens += turn.prompt_tokens + turn.completion_tokens
    usage.cost_usd += turn.cost_usd
    for err in turn.errors:
        text = f"model request failed (attempt {err.attempt}, {err.kind})"
        ctx.log.harness(text, error=err.message, name="model")
    update: dict[str, Any] = {"phase": "propose", "pending": [], "usage": usage}
    if (message := turn.message) is None:
        update["model_failures"] = failures = state.model_failures + 1
        if failures >= ctx.config.max_model_failures:
            update["stop_reason"] = f"model unavailable: {failures} requests failed after retries"
        return _timed(update, state, started)
    usage.turns += 1
    ctx.log.message(
        message, prompt_tokens=turn.prompt_tokens, completion_tokens=turn.completion_tokens,
        cached_prompt_tokens=turn.cached_prompt_tokens, reasoning_tokens=turn.reasoning_tokens,
        cost_usd=turn.cost_usd, logprobs=turn.logprobs,
    )  # fmt: skip
    update |= {"model_failures": 0, "messages": [*state.messages, message]}
    if message.tool_calls:
        update["pending"] = list(message.tool_calls)
        return _timed(update, state, started)
    offered = [FINISH_TOOL] if state.last_turn else ctx.tools.names()
    error = (
        "your reply called no tool. Every reply must call at least one of the tools "
        f"({', '.join(offered)}) with JSON arguments; call finish to stop."
    )
    line = usage.budget_line(ctx.budget(state))
    note = Message(role="user", content=f"error: {error}\n{line}")
    ctx.log.message(note, error=error)
    update["messages"].append(note)
    return _timed(update | _invalid(state, ctx), state, started)


def _invalid(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    """One more reply without a valid tool call (the run stops after too many in a row)."""
    invalid = state.invalid_replies + 1
    update: dict[str, Any] = {"invalid_replies": invalid}
    if invalid >= ctx.config.max_invalid_replies:
        update["stop_reason"] = f"{invalid} consecutive replies without a valid tool call"
    return update


def tools(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Answer the reply's instant tool calls in order; leave experiments for the next node."""
    ctx, started = run_context(runtime), time.monotonic()
    ctx.tool_context.known_patches = list(state.patches)
    ctx.tool_context.looks_used = state.usage.looks  # the looks budget (tools.looks)
    ctx.tool_context.looks_limit = ctx.budget(state).looks
    answered: list[tuple[ToolCall, ToolResult]] = []
    deferred: list[ToolCall] = []
    update: dict[str, Any] = {"phase": "tools", "invalid_replies": 0}
    valid = 0
    for call in state.pending:
        parsed = ctx.tools.parse(call.name, call.arguments)
        if isinstance(parsed, str):
            answered.append((call, ToolResult.failure(parsed)))
            continue
        valid += 1
        tool, params = parsed
        if state.last_turn and tool.name != FINISH_TOOL:
            answered.append((call, ToolResult.failure(f"not run: {LAST_TURN_REFUSAL}")))
        elif tool.name == EXPERIMENT_TOOL:
            deferred.append(call)
        elif tool.name == FINISH_TOOL:
            update["stop_reason"] = f"the {ctx.policy.name} policy called finish"
            update["finish_summary"] = getattr(params, "summary", "")
            answered.append((call, ToolResult(content="stopping; submitting the best proven patch")))  # fmt: skip
        else:
            ctx.on_event(f"tool {call.name}")
            answered.append((call, ctx.tools.call(call.name, call.arguments, ctx.tool_context)))
    usage = state.usage.model_copy(update={"looks": ctx.tool_context.looks_used})
    if answered and not deferred:  # the reply's last answer (else its last experiment's)
        wall_s = usage.wall_s + time.monotonic() - started  # the tools' time counts
        line = usage.model_copy(update={"wall_s": wall_s}).budget_line(ctx.budget(state))
        answered[-1] = (answered[-1][0], _with_budget(answered[-1][1], line))
    messages = [*state.messages, *(_answer(ctx, call, result) for call, result in answered)]
    update |= {"messages": messages, "pending": deferred, "patches": list(ctx.tool_context.known_patches), "usage": usage}  # fmt: skip
    if not valid:
        update |= _invalid(state, ctx)
    return _timed(update, state, started)


def experiment(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Verify the reply's patches: the first pending one, or with an executor all of them as one
    parallel batch. Each is admitted only while no budget is used up (experiments, wall time,
    tokens, cost, turns); a patch measured before in this run is answered from its record. A
    call with `extend` continues an unresolved NO_CHANGE of this run on its patch
    (experiments.extend), or is refused in one line."""
    ctx, started = run_context(runtime), time.monotonic()
    parallel = ctx.executor is not None and len(state.pending) > 1
    batch = state.pending if parallel else state.pending[:1]
    usage, budget, answers = state.usage.model_copy(), ctx.budget(state), {}
    known: dict[str, ExperimentOutcome | None] = {e.patch_id: e for e in state.experiments}
    admitted: list[tuple[ToolCall, Patch]] = []
    extends: dict[str, ExperimentRecord] = {}  # call id -> the experiment it continues
    for call in batch:
        args = json.loads(call.arguments)
        patch_id, extend = args.get("patch_id") or "", args.get("extend")
        patch_id = ctx.tool_context.full_patch_id(patch_id)
        done = known.get(patch_id)
        if done is not None and done.verdict is Verdict.FAILED:
            known.pop(patch_id)  # FAILED measured nothing (a baseline's or a harness's failure too)
        if patch_id in known and not extend:  # asked again: answer from the record, spend nothing
            done = known[patch_id]
            seen = f" ({done.experiment_id}): {done.verdict.value}, speedup {done.speedup}" if done else ""  # fmt: skip
            answers[call.id] = ToolResult(content=f"already measured in this run{seen}; not re-run")
            continue
        spent = usage.model_copy(update={"experiments": usage.experiments + len(admitted)})
        try:
            if exhausted := spent.exhausted(budget):
                raise UserError(f"not run: {exhausted}")
            if extend:
                extends[call.id] = earlier = extendable(ctx.store, state.run_id, extend)
                patch_id = earlier.patch_id
            admitted.append((call, ctx.tool_context.patch(patch_id)))
            known[patch_id] = None
        except UserError as exc:
            answers[call.id] = ToolResult.failure(str(exc))
    # A resumed run finds what it ran by patch and, for an extension, the experiment extended
    # (among the experiments not answered yet: a patch whose baseline failed is run anew).
    answered = {o.experiment_id for o in state.experiments}
    stored = {(e.patch_id, _extended_from(e)): e for e in ctx.store.experiments(state.run_id)
              if e.id not in answered}  # fmt: skip
    continues = {call_id: earlier.id for call_id, earlier in extends.items()}
    todo = [(c, p) for c, p in admitted if (p.hash, continues.get(c.id)) not in stored]
    records = _run(ctx, state, todo, ctx.executor if parallel else None, extends)
    # The budget line below counts the time these experiments just took.
    usage.wall_s += time.monotonic() - started
    started = time.monotonic()
    outcomes = list(state.experiments)
    for call, patch in admitted:
        record = records.get(call.id) or stored.get((patch.hash, continues.get(call.id)))
        if isinstance(record, str) or record is None:  # the experiment could not start
            answers[call.id] = ToolResult.failure(record or "not run")
            continue
        reused = call.id not in records
        outcome = ExperimentOutcome.of(record, ctx.store.get_patch(record.patch_id), reused=reused)
        outcomes.append(outcome)
        text = verdict_text(record, ctx.task.manifest)
        if Flag.BASELINE_FAILED in outcome.flags:  # the unpatched engine failed, not the patch
            text += "\nNot charged to the experiment budget: the baseline failed; this patch may be run again."
        else:
            usage.experiments += 1
            if outcome.verdict is Verdict.FAILED:
                text += (
                    "\nFAILED measured nothing: this patch may be run again (another experiment)."
                )
        answers[call.id] = ToolResult(content=text, data={"experiment_id": record.id})
    rest = state.pending[len(batch) :]
    if not rest:  # the reply's last answer
        last = batch[-1].id
        answers[last] = _with_budget(answers[last], usage.budget_line(budget))
    messages = [*state.messages, *(_answer(ctx, call, answers[call.id]) for call in batch)]
    update = {"phase": "experiment", "pending": rest, "messages": messages,
              "experiments": outcomes, "usage": usage}  # fmt: skip
    return _timed(update, state, started)


def _extended_from(record: ExperimentRecord) -> str | None:
    """The experiment `record` continued (experiments.extend), else None."""
    perf = record.result.evidence.performance
    return perf.extended_from if perf is not None else None


def _run(
    ctx: AgentContext,
    state: AgentState,
    todo: list[tuple[ToolCall, Patch]],
    executor: Executor | None,
    extends: dict[str, ExperimentRecord],
) -> dict[str, ExperimentRecord | str]:
    """Call id -> the record of its experiment, run here one after the other or on `executor` all
    at once (or why it could not start), an extension from the record in `extends`. Each is
    logged and stored before this returns."""
    seed = ctx.config.seed + len(state.experiments)
    # An experiment starts two servers (baseline and candidate) for each patch: the run's
    # paused look servers give way first where the machine's memory would not hold them.
    ctx.tool_context.look_servers.make_room(2 * len(todo) * SERVER_MEMORY)
    for _, patch in todo:
        ctx.log.harness(f"experiment started on patch {patch.hash}", name="experiment")
    out: dict[str, ExperimentRecord | str] = {}
    if executor is None:
        for call, patch in todo:
            where = f"experiment on {patch.hash[:12]}"
            ctx.on_event(where)
            try:
                checked = ctx.tool_context.checked_patch(patch.hash)  # as proposing checked it
                out[call.id] = ctx.run_experiment(
                    ctx.task, checked, sandbox=ctx.config.sandbox, params=ctx.config.params or None,
                    store=ctx.store, run_id=state.run_id, seed=seed, extend=extends.get(call.id),
                    progress=lambda stage: ctx.on_event(f"{where}: {stage}"),  # noqa: B023
                    max_patch_bytes=ctx.max_patch_bytes,
                )  # fmt: skip
            except UserError as exc:
                out[call.id] = str(exc)
        return out
    ctx.on_event(f"{len(todo)} experiments in parallel on the {ctx.config.executor} executor")
    requests = [
        ExperimentRequest(id=call.id, task=str(ctx.task.root), patch=patch, sandbox=ctx.config.sandbox,
                          params=ctx.config.params, seed=seed + i, run_id=state.run_id,
                          extend=extends.get(call.id), max_patch_bytes=ctx.max_patch_bytes)
        for i, (call, patch) in enumerate(todo)
    ]  # fmt: skip
    for done in run_batch(executor, requests):
        ctx.store.put_experiment(done.record)
        out[done.request_id] = done.record
    return out


def reflect(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Keep the best proven result; stop at the first limit reached or when the policy finished.
    The first time a budget runs out the policy gets one last reply instead (only `finish`
    offered), so that it sees the last result and writes its summary; then the run stops."""
    ctx = run_context(runtime)
    reason = state.stop_reason or state.usage.exhausted(ctx.budget(state))
    if reason and not state.stop_reason and not state.last_turn:
        note = Message(role="user", content=LAST_TURN_NOTE.format(reason=reason))
        ctx.log.message(note)
        left = state.usage.budget_line(ctx.budget(state))
        ctx.log.harness(f"decision: last reply (only finish): {reason}; {left}", name="decision")
        return {"phase": "reflect", "stop_reason": None, "last_turn": True,
                "messages": [*state.messages, note]}  # fmt: skip
    if reason or state.phase == "experiment":  # after each experiment, and when stopping
        best = best_improved(state)
        best_text = (
            f"best so far {best.patch_summary}: {best.speedup:.3f}x (CI {best.ci_low:.3f}-{best.ci_high:.3f})"
            if best is not None and best.ci_low is not None and best.ci_high is not None
            else "no IMPROVED result yet"
        )  # fmt: skip
        decision = f"stop: {reason}" if reason else "continue"
        left = state.usage.budget_line(ctx.budget(state))
        ctx.log.harness(f"decision: {decision}; {best_text}; {left}", name="decision")
    return {"phase": "reflect", "stop_reason": reason}


builder = StateGraph(AgentState, context_schema=AgentContext)
for node in (baseline, propose, tools, experiment, reflect, submit, review, apply):
    builder.add_node(node.__name__, node)
builder.add_edge(START, "baseline")
builder.add_edge("baseline", "propose")
builder.add_conditional_edges("propose", lambda s: "tools" if s.pending else "reflect", ["tools", "reflect"])  # fmt: skip
builder.add_conditional_edges("tools", lambda s: "experiment" if s.pending else "reflect", ["experiment", "reflect"])  # fmt: skip
builder.add_conditional_edges("experiment", lambda s: "experiment" if s.pending else "reflect", ["experiment", "reflect"])  # fmt: skip
builder.add_conditional_edges("reflect", lambda s: "submit" if s.stop_reason else "propose", ["submit", "propose"])  # fmt: skip
builder.add_edge("submit", "review")
builder.add_conditional_edges("review", lambda s: "apply" if s.stop_reason else "propose", ["propose", "apply"])  # fmt: skip
builder.add_edge("apply", END)
