"""The `local` backend: a private workspace copy and confined child processes on this host.

Every command runs in its own session/process group, under bubblewrap where available (else
`unshare`, else unconfined, each recorded), with rlimits, a scrubbed environment, and marker
variables so anything it starts can be found and killed. `exec` wraps the command in a tiny
shell that counts the processes still alive in its pid namespace once the command returned
(`ExecResult.stray_processes`); the namespace's end then kills them.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from infra_agent.sandboxes import cgroups, cleanup, confinement, limits, processes
from infra_agent.sandboxes.base import ExecResult, Sandbox, SandboxProcess, SandboxSpec
from infra_agent.sandboxes.environment import scrubbed_environment
from infra_agent.sandboxes.workspace import PrivateCopy

# Counts the pid namespace's processes before and after the command (shell builtins only, so
# counting forks nothing), reports strays on fd {fd}, which the command itself never gets.
_COUNTING_SHELL = (
    'b=0; for p in /proc/[0-9]*; do b=$((b+1)); done; "$@" {fd}>&-; rc=$?; '
    "a=0; for p in /proc/[0-9]*; do a=$((a+1)); done; echo $((a-b)) >&{fd}; exit $rc"
)


class LocalSandbox(Sandbox):
    backend = "local"

    def __init__(self, workspace: Path, spec: SandboxSpec) -> None:
        super().__init__(workspace, spec)
        self.id = uuid.uuid4().hex[:12]
        self._counter = itertools.count(1)
        self._spawned: list[SandboxProcess] = []
        self._markers: dict[int, str] = {}
        self._confinements: dict[Path, confinement.Confinement] = {}
        self._closed = False
        self.uid = confinement.allocate_uid()
        self._copy = PrivateCopy(workspace.resolve(), owner_uid=self.uid)
        self._cgroup: cgroups.Cgroup | None = None
        cleanup.register(self)
        try:
            self._hidden = self._hide(spec.hidden_paths)
            self._mode = self._choose_mode()
            self._cgroup = cgroups.Cgroup.create(
                self.id, memory_mb=spec.memory_mb, max_processes=spec.max_processes
            )
        except BaseException:
            self.cleanup()
            raise

    # -- the interface --------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self._copy.root

    def isolation(self) -> tuple[list[str], list[str]]:
        probe = self._confinement(self.root)
        rl_force, rl_missing = limits.describe(self.spec, uid=probe.run_uid)
        in_force = [*probe.in_force, *rl_force, "env:scrubbed", "pgroup:own-session"]
        missing = [*probe.missing, *rl_missing]
        if self._cgroup is not None:
            in_force += ["cgroup:tracked", *self._cgroup.limits]
        else:
            missing.append("cgroup (not writable here): no resident-memory or sandbox pids limit")
        if self._hidden_in_workspace:
            in_force.append(f"hidden:{self._hidden_in_workspace} removed from the workspace copy")
        return in_force, missing

    def exec(
        self, argv: list[str], *, timeout_s: float, stdin: bytes | None = None, cwd: str = "."
    ) -> ExecResult:
        self._check_open()
        n = next(self._counter)
        out_path, err_path, count_path = (self._copy.state / f"{n}.{s}" for s in "oec")
        # the shell's count is only meaningful in a pid namespace
        counting = self._mode != "none" and os.path.exists("/bin/bash")
        started = time.monotonic()
        oom_before = self._cgroup.oom_kills() if self._cgroup else 0
        with open(out_path, "wb") as out, open(err_path, "wb") as err, open(count_path, "wb") as c:
            script = _COUNTING_SHELL.format(fd=c.fileno())
            # bash, not sh: the fd number may have two digits, which dash cannot redirect
            wrapped = ["/bin/bash", "-c", script, "bash", *argv] if counting else argv
            proc = self._start(
                wrapped,
                n,
                cwd,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(c.fileno(),) if counting else (),
            )
            # A timer kills at the deadline, so the wait itself blocks in waitpid (no polling
            # latency, unlike communicate(timeout=...)).
            expired = threading.Event()

            def expire() -> None:
                expired.set()
                self._kill_process_tree(proc.pid, n)

            timer = threading.Timer(timeout_s, expire)
            timer.start()
            try:
                proc.communicate(input=stdin)
            finally:
                timer.cancel()
                # Even in a pid namespace: bubblewrap may return before the kernel has finished
                # killing the namespace's other processes.
                leftover = self._kill_process_tree(proc.pid, n)
                proc.wait()
            timed_out = expired.is_set()
        duration = time.monotonic() - started
        returncode = -9 if timed_out else limits.signed_status(proc.returncode)
        counted = count_path.read_text().strip() if count_path.exists() else ""
        strays = int(counted) if counted.lstrip("-").isdigit() else leftover
        return ExecResult(
            returncode=returncode,
            stdout=_read_capped(out_path),
            stderr=_read_capped(err_path),
            duration_s=duration,
            timed_out=timed_out,
            killed_reason="timeout" if timed_out else self._killed_reason(returncode, oom_before),
            stray_processes=0 if timed_out else max(strays, 0),
        )

    def spawn(self, argv: list[str], *, cwd: str = ".") -> SandboxProcess:
        self._check_open()
        n = next(self._counter)
        err_path = self._copy.state / f"{n}.spawn.e"
        with open(err_path, "wb") as err:
            proc = self._start(
                argv, n, cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
            )
        handle = SandboxProcess(
            pid=proc.pid, stdin=proc.stdin, stdout=proc.stdout, stderr_path=err_path, handle=proc
        )
        self._markers[proc.pid] = self._process_marker(n)
        self._spawned.append(handle)
        return handle

    def kill(self, process: SandboxProcess) -> int:
        proc = process.handle
        assert isinstance(proc, subprocess.Popen)
        marker = self._markers.pop(proc.pid, "")
        among = self._cgroup.pids if self._cgroup else None
        alive = len(processes.marked_pids(processes.PROCESS_VAR, marker, among)) if marker else 0
        processes.kill_group(proc.pid)
        if marker:
            processes.kill_marked(processes.PROCESS_VAR, marker, among=among)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        if process in self._spawned:
            self._spawned.remove(process)
        return alive

    def cleanup(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for process in list(self._spawned):
                self.kill(process)
            processes.kill_marked(processes.SANDBOX_VAR, self.id)
            if self._cgroup is not None:
                self._cgroup.remove()
        finally:
            self._copy.destroy()
            cleanup.unregister(self)

    def write_file(self, relpath: str, data: bytes) -> None:
        super().write_file(relpath, data)
        self._copy.fix_ownership()

    # -- internals ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("sandbox was cleaned up")

    def _process_marker(self, n: int) -> str:
        return f"{self.id}-{n}"

    def _choose_mode(self) -> str:
        if confinement.bwrap_binary():
            return "bwrap"
        if os.geteuid() == 0 and confinement.unshare_binary():
            return "unshare"
        return "none"

    def _confinement(self, cwd: Path) -> confinement.Confinement:
        if cwd not in self._confinements:
            self._confinements[cwd] = self._build_confinement(cwd)
        return self._confinements[cwd]

    def _build_confinement(self, cwd: Path) -> confinement.Confinement:
        if self._mode == "bwrap":
            return confinement.bubblewrap(
                self.spec,
                workspace=self.root,
                cwd=cwd,
                hidden=self._hidden,
                bwrap=confinement.bwrap_binary() or "bwrap",
                uid=self.uid,
            )
        if self._mode == "unshare":
            return confinement.unshare(
                self.spec,
                hidden=self._hidden,
                unshare_bin=confinement.unshare_binary() or "",
                uid=self.uid,
            )
        return confinement.unconfined(self.spec, hidden=self._hidden)

    def _hide(self, paths: list[Path]) -> list[Path]:
        """Remove hidden paths inside the workspace from the copy; return the ones outside."""
        outside = []
        self._hidden_in_workspace = 0
        source = self.source.resolve()
        for path in (Path(p).resolve() for p in paths):
            if path.is_relative_to(source):
                self._hidden_in_workspace += self._copy.remove(path.relative_to(source))
            else:
                outside.append(path)
        return outside

    def _start(self, argv: list[str], n: int, cwd: str, **popen: Any) -> subprocess.Popen[bytes]:
        self._copy.fix_ownership()
        host_cwd = self._resolve(cwd)
        env = scrubbed_environment(
            os.environ,
            home=str(self.root),
            python_bin=str(Path(sys.executable).parent),
            secret_patterns=self.spec.secret_env_patterns,
            extra=self.spec.env,
        )
        env[processes.SANDBOX_VAR] = self.id
        env[processes.PROCESS_VAR] = self._process_marker(n)
        if self.spec.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.spec.gpus))
        prefix = self._confinement(host_cwd).prefix
        return processes.launch(
            [*prefix, *argv],
            cwd=host_cwd,
            env=env,
            start_new_session=True,
            preexec_fn=limits.child_setup(
                self.spec, self._cgroup.join_file_paths() if self._cgroup else None
            ),
            **popen,
        )

    def _killed_reason(self, returncode: int, oom_before: int) -> str | None:
        if returncode == -9 and self._cgroup and self._cgroup.oom_kills() > oom_before:
            return "memory"
        return limits.killed_reason(returncode)

    def _kill_process_tree(self, pgid: int, n: int) -> int:
        """Kill the command's group and anything carrying its marker; how many were found."""
        processes.kill_group(pgid)
        among = self._cgroup.pids if self._cgroup else None
        return processes.kill_marked(processes.PROCESS_VAR, self._process_marker(n), among=among)


def _read_capped(path: Path) -> str:
    with open(path, "rb") as f:
        data = f.read(limits.MAX_OUTPUT_BYTES)
    return data.decode("utf-8", errors="replace")
