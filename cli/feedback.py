"""`infra-agent feedback accuracy|timeline|bench|gil`: the dense-feedback instruments on a
person's own files and code, without a task (`infra-agent feedback run NAME --task T`, from
`cli/tools.py`, runs the agent's instruments on a task's workspace).

Each command prints the instrument's typed record as one JSON document with `--json`, or its
short rendering otherwise. When a run store is configured (`--db`, INFRA_AGENT_DB or the config
file), the result is also stored as a `FeedbackRecord` (with `--run-id` to attach it to a run).
User code is named `package.module:function` or `path/to/file.py:function`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.panel import Panel

from infra_agent.cli.context import current
from infra_agent.errors import UserError
from infra_agent.output import emit, err_console

app = typer.Typer(
    help="Dense-feedback instruments: accuracy diff, timeline, microbenchmark, GIL on your own "
    "code; `run NAME --task T`: the agent's instruments on a task.",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
RunIdOpt = Annotated[
    str | None, typer.Option("--run-id", help="Attach the stored result to this run.")
]


def store_feedback(
    instrument: str, record: dict[str, Any], text: str, run_id: str | None = None
) -> None:
    """Store an instrument's result as a `FeedbackRecord` when a run store is configured."""
    if current().settings().store.db is not None:
        from infra_agent.store.records import FeedbackRecord

        fb = FeedbackRecord(run_id=run_id, instrument=instrument, record=record, rendering=text)
        current().store().put_feedback(fb)
        err_console.print(f"stored as {fb.id}", style="dim")


def _finish(
    instrument: str, record: BaseModel, text: str, *, as_json: bool, run_id: str | None
) -> None:
    """Store the result when a store is configured, then print it."""
    store_feedback(instrument, record.model_dump(mode="json"), text, run_id)

    def render(console: Console) -> None:
        console.print(Panel(text, title=f"feedback {instrument}", expand=False), markup=False)

    emit(record, render, as_json=as_json)


@contextmanager
def _user_code(what: str) -> Iterator[None]:
    """A failure inside the user's code becomes a one-line error naming it."""
    try:
        yield
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise UserError(
            f"{what} raised {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        ) from exc


def _paths_or_code(arg: str) -> dict[str, Any]:
    """A dump directory, or user code run under `capture()` (its dict result, else its probes)."""
    from infra_agent.feedback.accuracy import capture, load_dump
    from infra_agent.feedback.bench.usercode import load_callable

    if Path(arg).is_dir():
        return load_dump(arg)
    fn = load_callable(arg)
    with capture() as probes, _user_code(arg):
        result = fn()
    if isinstance(result, dict) and result:
        return result
    if not probes:
        raise UserError(f"{arg} returned no dict of tensors and called probe() nowhere")
    return probes


@app.command()
def accuracy(
    baseline: Annotated[
        str | None, typer.Argument(help="Dump directory or module:function.")
    ] = None,
    candidate: Annotated[
        str | None, typer.Argument(help="Dump directory or module:function.")
    ] = None,
    reference: Annotated[
        str | None, typer.Option("--reference", help="Float64 path: dump directory or code.")
    ] = None,
    rtol: Annotated[
        float | None, typer.Option(help="Relative tolerance (default per dtype).")
    ] = None,
    atol: Annotated[
        float | None, typer.Option(help="Absolute tolerance (default per dtype).")
    ] = None,
    sweep: Annotated[
        str | None,
        typer.Option("--sweep", help="module:function(size) -> (candidate, reference) tensors."),
    ] = None,
    sizes: Annotated[str, typer.Option(help="Sizes for --sweep, comma-separated.")] = "",
    as_json: JsonOpt = False,
    run_id: RunIdOpt = None,
) -> None:
    """Compare two execution paths probe by probe (or measure error growth with --sweep)."""
    from infra_agent.feedback.accuracy import compare_paths, error_sweep
    from infra_agent.feedback.bench.usercode import load_callable

    if sweep is not None:
        try:
            size_list = [int(s) for s in sizes.split(",") if s.strip()]
        except ValueError as exc:
            raise UserError(f"--sizes must be comma-separated integers, got {sizes!r}") from exc
        with _user_code(sweep):
            growth = error_sweep(load_callable(sweep), size_list)
        _finish("accuracy", growth, growth.render(), as_json=as_json, run_id=run_id)
        return
    if baseline is None or candidate is None:
        raise UserError(
            "give BASELINE and CANDIDATE (dump directories or module:function), or --sweep"
        )
    ref = _paths_or_code(reference) if reference else None
    report = compare_paths(
        _paths_or_code(baseline), _paths_or_code(candidate), reference=ref, rtol=rtol, atol=atol
    )
    _finish("accuracy", report, report.render(), as_json=as_json, run_id=run_id)


def _parse_classes(items: list[str]) -> dict[str, str] | None:
    if not items:
        return None
    classes = {}
    for item in items:
        name, sep, expr = item.partition("=")
        if not sep or not name.strip() or not expr:
            raise UserError(f"--class {item!r}: expected NAME=REGEX")
        classes[name.strip()] = expr
    return classes


def _timeline_events(target: list[str], repeat: int) -> tuple[list[Any], str]:
    from infra_agent.feedback.bench.usercode import load_callable
    from infra_agent.feedback.timeline import load_trace, profile_callable, profile_script

    first = target[0]
    path = Path(first)
    if path.is_file() and not first.endswith(".py"):
        return load_trace(path), str(path)
    if ":" in first and not path.is_file():
        fn = load_callable(first)
        with _user_code(first):
            return profile_callable(fn, repeat=repeat), first
    if first.endswith(".py"):
        with tempfile.TemporaryDirectory(prefix="infra-agent-trace-") as tmp:
            return profile_script(target, Path(tmp) / "trace.json"), " ".join(target)
    raise UserError(f"{first!r} is not a trace file, a module:function or a Python script")


@app.command()
def timeline(
    target: Annotated[
        list[str],
        typer.Argument(
            help="Trace file (Kineto JSON / nsys SQLite), module:function, or script.py ARGS."
        ),
    ],
    overlap_a: Annotated[
        str | None, typer.Option("--overlap-a", help="Regex of class A (e.g. kv_transfer).")
    ] = None,
    overlap_b: Annotated[
        str | None, typer.Option("--overlap-b", help="Regex of class B (e.g. dispatch).")
    ] = None,
    classes: Annotated[
        list[str],
        typer.Option("--class", help="NAME=REGEX event class (repeat; replaces defaults)."),
    ] = [],  # noqa: B006 - typer needs a literal default
    against: Annotated[
        Path | None, typer.Option("--against", help="Baseline trace to diff against.")
    ] = None,
    repeat: Annotated[int, typer.Option(help="Calls of a module:function target.")] = 1,
    as_json: JsonOpt = False,
    run_id: RunIdOpt = None,
) -> None:
    """Where the time goes: per-thread/stream breakdown, top ops, launch gaps, overlap of A under B."""
    from infra_agent.feedback.timeline import diff_summaries, load_trace, summarize

    if (overlap_a is None) != (overlap_b is None):
        raise UserError("give both --overlap-a and --overlap-b")
    overlaps = [(overlap_a, overlap_b)] if overlap_a and overlap_b else []
    cls = _parse_classes(classes)
    events, source = _timeline_events(target, repeat)
    summary = summarize(events, classes=cls, overlaps=overlaps, source=source)
    if against is not None:
        base = summarize(load_trace(against), classes=cls, overlaps=overlaps, source=str(against))
        diff = diff_summaries(base, summary)
        _finish("timeline", diff, diff.render(), as_json=as_json, run_id=run_id)
        return
    _finish("timeline", summary, summary.render(), as_json=as_json, run_id=run_id)


@app.command()
def bench(
    baseline: Annotated[
        str, typer.Argument(help="module:function, file.py:function, or a command.")
    ],
    candidate: Annotated[str, typer.Argument(help="Same kind as BASELINE.")],
    shell: Annotated[
        bool, typer.Option("--shell", help="BASELINE/CANDIDATE are shell commands.")
    ] = False,
    worker: Annotated[
        bool, typer.Option("--worker", help="Run each function in its own Python process.")
    ] = False,
    device: Annotated[str, typer.Option(help="cpu or cuda (CUDA events).")] = "cpu",
    clock: Annotated[
        str, typer.Option(help="wall (perf_counter) or cpu (thread CPU time; busy machines).")
    ] = "wall",
    budget_s: Annotated[float, typer.Option(help="Time budget, seconds.")] = 10.0,
    ci_width: Annotated[
        float, typer.Option(help="Stop when the CI is this narrow (relative).")
    ] = 0.02,
    equivalence: Annotated[float, typer.Option(help="SAME band half-width (relative).")] = 0.02,
    min_sample_ms: Annotated[float, typer.Option(help="Minimum duration of one sample, ms.")] = 5.0,
    flush_l2: Annotated[
        bool, typer.Option("--flush-l2", help="Flush L2 before samples (cuda).")
    ] = False,
    cuda_graph: Annotated[
        bool, typer.Option("--cuda-graph", help="Replay a CUDA graph (cuda).")
    ] = False,
    counters: Annotated[
        bool, typer.Option("--counters", help="Hardware counters via ncu.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    as_json: JsonOpt = False,
    run_id: RunIdOpt = None,
) -> None:
    """Time BASELINE and CANDIDATE interleaved until the speedup's 95% CI is narrow enough."""
    from infra_agent.feedback.bench import CommandTarget, WorkerTarget, make_target, run_bench
    from infra_agent.feedback.bench.targets import Target
    from infra_agent.feedback.bench.usercode import load_callable

    arms: list[Target] = []
    try:
        for spec in (baseline, candidate):
            if shell:
                arms.append(CommandTarget(spec))
            elif worker:
                arms.append(WorkerTarget(spec))
            else:
                fn = load_callable(spec)
                arms.append(
                    make_target(
                        fn, device=device, clock=clock, flush_l2=flush_l2, cuda_graph=cuda_graph
                    )
                )
    except BaseException:
        for arm in arms:
            arm.close()
        raise
    with _user_code("benchmarked code"):
        result = run_bench(
            arms[0],
            arms[1],
            min_sample_s=min_sample_ms / 1e3,
            ci_width=ci_width,
            equivalence=equivalence,
            budget_s=budget_s,
            seed=seed,
            with_counters=counters,
            names=(baseline, candidate),
        )
    _finish("bench", result, result.render(), as_json=as_json, run_id=run_id)


@app.command()
def gil(
    command: Annotated[
        list[str] | None,
        typer.Argument(help="Command to start and trace (script.py runs with Python)."),
    ] = None,
    pid: Annotated[int | None, typer.Option("--pid", help="Attach to a running process.")] = None,
    duration_s: Annotated[float, typer.Option(help="Sampling time, seconds.")] = 5.0,
    interval_s: Annotated[
        float | None,
        typer.Option(
            help="Time between snapshots, seconds (default 0.1 with record, 1.0 with dump).",
            min=0.001,
        ),
    ] = None,
    sampler: Annotated[
        str | None,
        typer.Option(
            help="record: long-lived py-spy recorders, ~1 ms pause per snapshot (default); "
            "dump: one py-spy dump per snapshot, same-instant blame, ~100 ms pause each."
        ),
    ] = None,
    native: Annotated[
        bool, typer.Option("--native/--no-native", help="Native frames (needed to see GIL waits).")
    ] = True,
    startup_s: Annotated[float, typer.Option(help="Wait before sampling a started command.")] = 0.5,
    as_json: JsonOpt = False,
    run_id: RunIdOpt = None,
) -> None:
    """Who holds the GIL, who waits for it, and in which frames (py-spy)."""
    from infra_agent.feedback.gil import trace_command, trace_pid

    if (pid is None) == (not command):
        raise UserError("give either --pid PID or a COMMAND to start, not both")
    if sampler not in (None, "record", "dump"):
        raise UserError(f"--sampler must be 'record' or 'dump', not '{sampler}'")
    chosen: Any = sampler
    if pid is not None:
        report = trace_pid(
            pid, duration_s=duration_s, interval_s=interval_s, native=native, sampler=chosen
        )
    else:
        assert command is not None
        report = trace_command(
            command,
            duration_s=duration_s,
            interval_s=interval_s,
            startup_s=startup_s,
            native=native,
            sampler=chosen,
        )
    _finish("gil", report, report.render(), as_json=as_json, run_id=run_id)
