"""A patched SGLang server is confined like any candidate: one real experiment on an injected task
whose candidate patch attacks at start-up, the way an agent's source patch would run.

The patched `sglang/launch_server.py` tries, from the server's launcher: SIGSTOP, renice and
re-pin (sched_setaffinity) of PID 1, of this test (the harness) and of a stand-in for the other
arm's server, reading their /proc/PID/mem and environ, finding other SGLang processes, reading
the un-injected original of the task's injected module (and its bytecode) through the
installed site-packages, seeing the task folder or the run store; it prints what it got, then
double-forks a helper. Every attempt fails, the helper makes the experiment REJECTED with the
mechanism named, and nothing of it outlives the experiment. One candidate start covers all of
it (the start fails at the first readiness poll after the double fork): about one baseline
server start in all. The stand-in tests of the same mechanisms (a frozen helper) are in
test_pause.py.
"""

import difflib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra_agent.experiments import rules
from infra_agent.sandboxes import fileview, proctree
from infra_agent.sandboxes.processes import pids_with_cmdline
from infra_agent.serving.env import find_sglang_env
from infra_agent.serving.overlay import installed_package
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.patch import parse_diff
from infra_agent.tasks.registry import find_task

pytestmark = [
    pytest.mark.timeout(2400),
    pytest.mark.slow,
    pytest.mark.sglang,
    pytest.mark.skipif(
        find_sglang_env() is None,
        reason="SGLang environment not created (python -m infra_agent.serving.env --ensure)",
    ),
    pytest.mark.skipif(
        fileview.unavailable() is not None or os.geteuid() != 0,
        reason=f"no confinement for servers here: {fileview.unavailable() or 'not root'}",
    ),
]
TASK = find_task("sglang-slow-decode")
INJECTED = "sglang/srt/layers/attention/torch_native_backend.py"
INJECTED_MARK = "per_req_query_padded"
"""A name the task's inject.patch adds: present in the served module, absent in the original."""
PATCHED = "sglang/launch_server.py"

ATTACK = """
import json as _json, os as _os, signal as _signal, sys as _sys

def _attack():
    found = {{}}

    def attempt(name, fn):
        try:
            fn()
            found[name] = "succeeded"
        except Exception as exc:
            found[name] = type(exc).__name__

    for who, pid in (("pid1", 1), ("victim", {victim}), ("harness", {harness})):
        attempt("sigstop:" + who, lambda: _os.kill(pid, _signal.SIGSTOP))
        attempt("renice:" + who, lambda: _os.setpriority(_os.PRIO_PROCESS, pid, 19))
        attempt("affinity:" + who, lambda: _os.sched_setaffinity(pid, {{0}}))
        attempt("mem:" + who, lambda: open("/proc/%d/mem" % pid, "rb").read(1))
        attempt("environ:" + who, lambda: open("/proc/%d/environ" % pid, "rb").read(1))
    found["pids"] = sorted(int(p) for p in _os.listdir("/proc") if p.isdigit())
    found["self"] = _os.getpid()
    for entry in _sys.path:
        original = _os.path.join(entry, {injected!r})
        if entry.endswith("site-packages") and _os.path.exists(original):
            text = open(original).read()
            found["original"] = "served" if {mark!r} in text else "ORIGINAL"
            cache = _os.path.join(_os.path.dirname(original), "__pycache__")
            stem = _os.path.basename(original)[:-3] + "."
            found["original_bytecode"] = []
            for name in _os.listdir(cache):
                if name.startswith(stem):
                    try:
                        data = open(_os.path.join(cache, name), "rb").read()
                        found["original_bytecode"].append(len(data))
                    except OSError as exc:
                        found["original_bytecode"].append(type(exc).__name__)
    found["task_folder"] = _os.path.exists({task_root!r})
    found["run_store"] = _os.path.exists({store!r})
    found["uid"] = _os.getuid()
    print("ATTACK " + _json.dumps(found), flush=True)
    if _os.fork() == 0:
        if _os.fork() == 0:
            _os.execv(_sys.executable, [_sys.executable, "-c",
                      "import time\\nwhile 1: time.sleep(0.05)", {helper!r}])
        _os._exit(0)
    _os.wait()

if _os.environ.get("ATTACKED") is None:  # SGLang's spawned children import this module too
    _os.environ["ATTACKED"] = "1"
    _attack()
"""


def attacking_patch(victim: int, helper: str, store: Path):  # -> Patch
    original = (installed_package().parent / PATCHED).read_text()
    lines = original.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("def "))
    attack = ATTACK.format(
        victim=victim,
        harness=os.getpid(),
        injected=INJECTED,
        mark=INJECTED_MARK,
        task_root=str(TASK.root),
        store=str(store),
        helper=helper,
    )
    new = lines[:at] + attack.splitlines(keepends=True) + ["\n", "\n"] + lines[at:]
    diff = difflib.unified_diff(lines, new, f"a/{PATCHED}", f"b/{PATCHED}")
    return parse_diff("".join(diff))


def test_a_patched_server_reaches_nothing_outside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over 60 s (88-137 s in suite runs at load 2-11): the experiment starts the injected task's
    baseline server (no other test here serves sglang-slow-decode's baseline to share) before
    the candidate's start runs the attack; the attack must run as a candidate's start does."""
    from infra_agent.experiments import run_experiment

    # The static rules would refuse this patch outright; confinement is what is tested here.
    monkeypatch.setattr(rules, "new_violations", lambda *args, **kwargs: [])
    store = tmp_path / "store"
    store.mkdir()
    monkeypatch.setenv("INFRA_AGENT_HOME", str(store))
    helper = f"attack-helper-{tmp_path.name}-{os.getpid()}"
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        nice, cpus = os.getpriority(os.PRIO_PROCESS, victim.pid), os.sched_getaffinity(victim.pid)
        started = time.monotonic()
        record = run_experiment(TASK, attacking_patch(victim.pid, helper, store))
        print(f"experiment took {time.monotonic() - started:.0f} s")
        result = record.result
        print(result.render())
        # Judged: the helper that left the server's tree is named in the verdict.
        assert result.verdict is Verdict.REJECTED, (result.render(), result.evidence.log_tail)
        assert any("left the server's process tree" in r for r in result.reasons), result.reasons
        # Nothing of the candidate outlives the experiment.
        assert pids_with_cmdline(helper) == []
        # What the patched server got, from its own log (the evidence's log tail).
        line = next(x for x in result.evidence.log_tail.splitlines() if x.startswith("ATTACK "))
        found = json.loads(line.removeprefix("ATTACK "))
        print(found)
        assert not [k for k, v in found.items() if v == "succeeded"], found
        # Its own pid namespace: its init and itself, no other server, no harness in sight.
        assert found["pids"] == [1, found["self"]], found
        assert found["uid"] != 0
        assert found["original"] == "served", found  # the original is not in its view
        # Its bytecode: an unreadable device node in its place (no byte of it comes back).
        assert found["original_bytecode"], found
        assert all(b in (0, "PermissionError") for b in found["original_bytecode"]), found
        assert found["task_folder"] is False and found["run_store"] is False
        # The evidence states what confined the patch: the server's confinement (its start
        # failed, and still ran the patch under it), not the arm sandbox's, which held the files.
        box = result.evidence.sandbox
        assert box is not None and box.isolation[0] == "server:bwrap", box
        assert "pidns:bwrap" in box.isolation, box
        assert "workspace:arm-sandbox(files only)" in box.isolation, box
        # ... and the victim really was left alone.
        assert (proctree.stat_fields(victim.pid) or ["?"])[0] not in "Tt"
        assert os.getpriority(os.PRIO_PROCESS, victim.pid) == nice
        assert os.sched_getaffinity(victim.pid) == cpus
    finally:
        victim.kill()
        victim.wait()
