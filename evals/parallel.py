"""Attempts of an eval in parallel: each in its own process, pinned to its own CPU set.

Each attempt process runs `evals.attempt.run_attempt` (the same path as the sequential loop) and
writes its attempt and its run to the store itself, as the sequential loop does; the processes
share nothing else. The machine's cores are split into `parallel` non-overlapping sets, as the
local executor splits them between experiments, so two attempts' measurements never share a
core. An attempt process that dies leaves its attempt pending or running: `eval --resume`
continues it. Ctrl-C reaches every attempt process (one process group): each marks its run
interrupted, and the eval is resumable.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from multiprocessing.process import BaseProcess

from infra_agent.config import Settings
from infra_agent.errors import UserError
from infra_agent.evals.attempt import Progress, run_attempt
from infra_agent.evals.records import EvalStore
from infra_agent.sandboxes.cleanup import cleanup_all

_POLL_S = 0.2


def cpu_sets(parallel: int) -> list[list[int]]:
    """`parallel` non-overlapping sets of this process's cores, as even as they divide."""
    cores = sorted(os.sched_getaffinity(0))
    if parallel > len(cores):
        raise UserError(
            f"--parallel-attempts {parallel}: this machine has {len(cores)} cores for them "
            "(each attempt gets at least one of its own)"
        )
    per = len(cores) // parallel
    return [cores[i * per : (i + 1) * per] for i in range(parallel)]


def _attempt_process(settings: Settings, eval_id: str, attempt_id: str, cpus: list[int]) -> None:
    os.sched_setaffinity(0, cpus)
    evals = EvalStore(settings.store.path())
    try:
        record = evals.get_eval(eval_id)
        found = [a for a in evals.attempts(eval_id) if a.id == attempt_id]
        if record is None or not found:
            raise UserError(f"attempt {attempt_id} is not in the store")
        attempt = found[0]
        who = f"{attempt.profile}: " if attempt.profile else ""

        def progress(text: str) -> None:  # stderr: stdout may be the report's JSON
            print(f"{who}{attempt.task} #{attempt.index + 1}{text}", file=sys.stderr, flush=True)

        progress(f" started on cores {','.join(map(str, cpus))}")
        run_attempt(record, attempt, settings, evals, progress)
    finally:
        evals.close()
    # The attempt is recorded and its sandboxes are cleaned: end here, without the interpreter's
    # teardown of all an attempt imported and built, which held the attempt's cores 4-7 s at
    # load 8 on 2 cores (the next attempt waited for it). An exception still exits normally.
    cleanup_all()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_parallel(
    eval_id: str, attempt_ids: list[str], settings: Settings, parallel: int, progress: Progress
) -> None:
    """Run the attempts, at most `parallel` at once; returns when every process has ended."""
    ctx = mp.get_context("spawn")  # no inherited threads, store connections or locks
    free = cpu_sets(parallel)
    pending = list(attempt_ids)
    running: dict[BaseProcess, tuple[str, list[int]]] = {}
    try:
        while pending or running:
            while pending and free:
                attempt_id, cpus = pending.pop(0), free.pop(0)
                started = ctx.Process(
                    target=_attempt_process, args=(settings, eval_id, attempt_id, cpus)
                )
                started.start()
                running[started] = (attempt_id, cpus)
            time.sleep(_POLL_S)
            for ended in [p for p in running if not p.is_alive()]:
                ended.join()
                attempt_id, cpus = running.pop(ended)
                free.append(cpus)
                if ended.exitcode != 0:
                    progress(
                        f"  {attempt_id}: its process exited with {ended.exitcode}; "
                        "`eval --resume` continues it"
                    )
    finally:
        for process in running:  # Ctrl-C: the processes got it too; give them time to record
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join()
