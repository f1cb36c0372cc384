"""What the benchmark runner times: a callable, a command, or a callable in a worker process.

Every target answers `sample(iterations) -> float`: seconds per iteration over one sample of
`iterations` back-to-back calls. Timers:
- CPU callables: `time.perf_counter_ns` around the loop (or `thread_time_ns` with clock="cpu").
- CUDA (when `torch.cuda.is_available()` and `device="cuda"`): CUDA events recorded on the
  current stream, `torch.cuda.synchronize()` before and after (so work on every stream is
  counted), optional L2 flush (writing a buffer twice the L2 size) before each sample outside
  the timed region, and an optional CUDA-graph mode (the callable captured once, replayed).
- Commands: wall time of one run of the command per sample (`iterations` runs).
- Worker processes: `module:function` run in a separate Python process (`feedback.bench.worker`)
  that times itself with `perf_counter_ns`, so the parent's state (GC, allocator) cannot leak
  between arms.
- Pipes (`PipeTarget`): any process already started (e.g. in a sandbox) that speaks the worker
  protocol on its stdin/stdout; each answer is awaited at most `timeout_s`.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from infra_agent.errors import UserError


class Target(Protocol):
    """One arm of a benchmark."""

    timer: str
    """How it is timed, in words (perf_counter_ns, cuda_events, cuda_graph, command_wall, worker)."""

    def sample(self, iterations: int) -> float:
        """Run `iterations` times back to back; return seconds per iteration."""
        ...

    def close(self) -> None: ...


class CallableTarget:
    """A zero-argument callable timed in this process.

    `clock="wall"` uses `perf_counter_ns` (what a user waits for). `clock="cpu"` uses
    `thread_time_ns`, the CPU time of the calling thread: it leaves out time the thread was
    descheduled, so it is far less noisy on a shared machine, but it misses time spent waiting
    (I/O, other threads, a GPU); use it only for single-threaded CPU-bound code.
    """

    def __init__(self, fn: Callable[[], Any], *, clock: str = "wall") -> None:
        if clock not in ("wall", "cpu"):
            raise UserError(f"unknown clock {clock!r}: expected 'wall' or 'cpu'")
        self.fn = fn
        self._now = time.perf_counter_ns if clock == "wall" else time.thread_time_ns
        self.timer = "perf_counter_ns" if clock == "wall" else "thread_time_ns"

    def sample(self, iterations: int) -> float:
        fn, now = self.fn, self._now
        start = now()
        for _ in range(iterations):
            fn()
        return (now() - start) / 1e9 / iterations

    def close(self) -> None:
        pass


class CudaTarget:
    """A callable launching CUDA work, timed with CUDA events after a full synchronize."""

    def __init__(
        self, fn: Callable[[], Any], *, flush_l2: bool = False, cuda_graph: bool = False
    ) -> None:
        import torch

        if not torch.cuda.is_available():
            raise UserError("device 'cuda' asked for, but torch.cuda.is_available() is False")
        self.torch = torch
        self.fn = fn
        self.flush_l2 = flush_l2
        self.timer = "cuda_graph" if cuda_graph else "cuda_events"
        self._flush_buf: Any = None
        if flush_l2:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            l2 = int(getattr(props, "L2_cache_size", 64 << 20) or 64 << 20)
            self._flush_buf = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
        self._graph: Any = None
        if cuda_graph:
            # Warm up on a side stream before capture, as torch.cuda.graphs requires.
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                fn()

    def sample(self, iterations: int) -> float:
        torch = self.torch
        if self._flush_buf is not None:
            self._flush_buf.zero_()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        run = self._graph.replay if self._graph is not None else self.fn
        start.record()
        for _ in range(iterations):
            run()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / 1e3 / iterations

    def close(self) -> None:
        self._graph = None
        self._flush_buf = None


class CommandTarget:
    """A shell command; one run per iteration, wall time with `perf_counter_ns`."""

    timer = "command_wall"

    def __init__(self, command: str, *, timeout_s: float = 600.0) -> None:
        if not command.strip():
            raise UserError("empty command to benchmark")
        self.command = command
        self.timeout_s = timeout_s

    def sample(self, iterations: int) -> float:
        start = time.perf_counter_ns()
        for _ in range(iterations):
            try:
                proc = subprocess.run(
                    self.command,
                    shell=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    timeout=self.timeout_s,
                )
            except subprocess.TimeoutExpired as exc:
                raise UserError(
                    f"command timed out after {self.timeout_s:.0f} s: {self.command}"
                ) from exc
            if proc.returncode != 0:
                tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
                raise UserError(
                    f"command exited with {proc.returncode}: {self.command} ({tail[0][:200]})"
                )
        return (time.perf_counter_ns() - start) / 1e9 / iterations

    def close(self) -> None:
        pass


class WorkerTarget:
    """`module:function` (or `file.py:function`) timed inside its own Python process.

    Protocol on the worker's stdin/stdout: the parent writes an iteration count per line, the
    worker answers with seconds per iteration (or `error <message>`).
    """

    timer = "worker:perf_counter_ns"

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infra_agent.feedback.bench.worker", spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        ready = self._read()
        if ready != "ready":
            raise UserError(f"benchmark worker for {spec} failed to start: {ready}")

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.close()
            last = err.strip().splitlines()[-1:] or ["worker exited"]
            return last[0][:300]
        return line

    def sample(self, iterations: int) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{iterations}\n")
        self.proc.stdin.flush()
        line = self._read()
        if line.startswith("error "):
            raise UserError(f"{self.spec} raised in the worker: {line[6:]}")
        try:
            return float(line)
        except ValueError as exc:
            raise UserError(f"benchmark worker for {self.spec} died: {line}") from exc

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
                self.proc.kill()
                self.proc.wait()


class PipeTarget:
    """A process started elsewhere (e.g. in a sandbox) speaking the worker protocol on binary
    pipes: it prints `ready` once loaded, then answers each iteration count written to its stdin
    with seconds per iteration (or `error <message>`) on its stdout.

    `describe_exit()` is called when the process stops answering, to say why (e.g. its stderr).
    """

    def __init__(
        self,
        stdin: Any,
        stdout: Any,
        *,
        name: str,
        timer: str = "sandbox:perf_counter_ns",
        timeout_s: float = 60.0,
        startup_timeout_s: float = 120.0,
        describe_exit: Callable[[], str] = lambda: "",
    ) -> None:
        self.stdin, self.name, self.timer = stdin, name, timer
        self.timeout_s = timeout_s
        self.describe_exit = describe_exit
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stdout,), daemon=True).start()
        ready = self._next(startup_timeout_s, "to start")
        if ready != "ready":
            raise UserError(f"{name} failed to start: {ready[:300]}")

    def _read(self, stdout: Any) -> None:
        try:
            for raw in stdout:
                self._lines.put(raw.decode(errors="replace").strip())
        except (OSError, ValueError):
            pass
        self._lines.put(None)

    def _next(self, timeout_s: float, doing: str) -> str:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise UserError(f"{self.name} took more than {timeout_s:g} s {doing}") from None
        if line is None:
            self._lines.put(None)  # later reads see the end too
            why = self.describe_exit().strip() or "no output"
            raise UserError(f"{self.name} exited: {why}")
        return line

    def sample(self, iterations: int) -> float:
        try:
            self.stdin.write(f"{iterations}\n".encode())
            self.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise UserError(f"{self.name} exited: {self.describe_exit().strip()}") from None
        line = self._next(self.timeout_s, f"for {iterations} calls")
        if line.startswith("error "):
            raise UserError(f"{self.name} raised: {line[6:]}")
        try:
            return float(line)
        except ValueError as exc:
            raise UserError(f"{self.name} answered {line[:200]!r}, not seconds") from exc

    def close(self) -> None:
        try:
            self.stdin.close()
        except (OSError, ValueError):
            pass
