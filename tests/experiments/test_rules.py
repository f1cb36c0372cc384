"""Static rules: what each group catches, what a task may allow, and what was already there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infra_agent.experiments.rules import new_violations, scan_source
from infra_agent.tasks.patch import parse_diff
from infra_agent.tasks.registry import find_task
from infra_agent.tasks.tree import preview_apply, workspace_tree

BUNDLED = Path(__file__).parents[2] / "bundled_tasks"


def groups(source: str) -> set[str]:
    return {v.group for v in scan_source(source, "k.py")}


@pytest.mark.parametrize(
    ("source", "group"),
    [
        ("import socket", "network"),
        ("from urllib.request import urlopen", "network"),
        ("import requests", "network"),
        ("import subprocess", "processes"),
        ("import os\nos.system('ls')", "processes"),
        ("import os\nos.execv('/bin/sh', [])", "processes"),
        ("from os import fork", "processes"),
        ("import multiprocessing", "processes"),
        ("import threading", "threads"),
        ("from concurrent.futures import ThreadPoolExecutor", "threads"),
        ("import torch\ntorch.set_num_threads(8)", "threads"),
        ("import torch\nf = torch.jit.fork(g)", "threads"),
        ("import ctypes", "ctypes"),
        ("from torch.utils.cpp_extension import load_inline", "ctypes"),
        ("import time\ntime.perf_counter = lambda: 0", "timers"),
        ("import time as t\nsetattr(t, 'time', None)", "timers"),
        ("import torch\ntorch.cuda.synchronize = lambda: None", "timers"),
        ("import gc\ngc.get_objects()", "introspection"),
        ("import sys\nsys._getframe(1)", "introspection"),
        ("import inspect", "introspection"),
        ("x = f.__globals__", "introspection"),
        ("__builtins__['ev' + 'al']", "introspection"),
        ("import infra_agent", "harness"),
        ("from infra_agent.tasks import harness", "harness"),
        ("open('/etc/passwd')", "harness"),
        ("open('../harness.py')", "harness"),
        ("import os\nos.environ['OPENAI_API_KEY']", "harness"),
        ("import os\nos.getenv('TOKEN')", "harness"),
        ("from pathlib import Path\nPath.home()", "harness"),
        ("eval('1+1')", "dynamic"),
        ("exec(code)", "dynamic"),
        ("__import__('os')", "dynamic"),
        ("import importlib", "dynamic"),
        ("import pickle", "dynamic"),
        ("getattr(os, 'sys' + 'tem')", "dynamic"),
    ],
)
def test_each_group_is_detected(source: str, group: str) -> None:
    assert group in groups(source)


def test_ordinary_code_is_clean() -> None:
    source = (
        "import math\nimport torch\nfrom typing import Any\n\n"
        "def f(x: torch.Tensor, knobs: dict[str, Any]) -> torch.Tensor:\n"
        "    cache = {}\n    cache['k'] = x\n    y = torch.softmax(x, dim=-1) * math.sqrt(2)\n"
        "    return y @ x.T\n"
    )
    assert scan_source(source, "k.py") == []


def test_allow_lifts_a_group_but_never_harness_or_timers() -> None:
    after = {"k.py": "import threading\nimport time\ntime.time = None\nimport infra_agent\n"}
    found = {v.group for v in new_violations({"k.py": ""}, after, ["threads", "harness", "timers"])}
    assert found == {"timers", "harness"}


def test_only_what_the_patch_adds_counts() -> None:
    before = {"k.py": "import threading\n"}
    after = {"k.py": "import threading\n\nx = 1\n"}
    assert new_violations(before, after, []) == []
    after2 = {"k.py": "import threading\nimport threading\n"}
    assert [v.group for v in new_violations(before, after2, [])] == ["threads"]


def test_unparsable_code_and_non_python_files() -> None:
    assert [v.group for v in new_violations({}, {"k.py": "def (:"}, [])] == ["syntax"]
    assert new_violations({}, {"notes.md": "import socket"}, []) == []


# -- state kept across calls -----------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "_c = {}\ndef f(x):\n    _c[x] = x * 2\n    return _c[x]\n",
        "_c = {}\ndef f(x):\n    return _c.setdefault(hash(x), x * 2)\n",
        "_seen = []\ndef f(x):\n    _seen.append(x)\n    return x\n",
        "_last = None\ndef f(x):\n    global _last\n    _last = x\n    return x\n",
        "import functools\n@functools.lru_cache(maxsize=None)\ndef f(x):\n    return x\n",
        "from functools import cache\n@cache\ndef f(x):\n    return x\n",
        "from functools import lru_cache as memo\ndef g(x):\n    return x\nf = memo(None)(g)\n",
        "def f(x):\n    f.last = x\n    return x\n",
        "def f(x):\n    return f.memo.setdefault(x, x)\nf.memo = {}\n",
        "def f(x, _memo={}):\n    _memo[x] = x\n    return x\n",
        "import torch\n_buf = torch.zeros(4)\ndef f(x):\n    _buf.copy_(x)\n    return _buf\n",
        "class K:\n    memo = {}\n    def f(self, x):\n        K.memo[x] = x\n",
        "class S:\n    pass\n_s = S()\ndef f(x):\n    setattr(_s, 'last', x)\n",
    ],
    ids=[
        "item-store", "setdefault", "append", "global", "lru_cache", "cache", "call-form",
        "function-attribute", "function-attribute-container", "mutable-default",
        "in-place-buffer", "class-attribute", "setattr",
    ],
)  # fmt: skip
def test_state_across_calls_is_detected(source: str) -> None:
    assert "state" in groups(source), scan_source(source, "k.py")


@pytest.mark.parametrize(
    "source",
    [
        "def f(x):\n    out = {}\n    out['k'] = x\n    acc = []\n    acc.append(x)\n",
        "def f(cache, x):\n    cache[x] = 1\n    cache.append(x)\n",
        "class A:\n    def __init__(self):\n        self.c = {}\n    def f(self, x):\n"
        "        self.c[x] = x\n        self.c.update({})\n",
        "def f(xs):\n    acc = []\n    def g(v):\n        acc.append(v)\n    for x in xs:\n"
        "        g(x)\n    return acc\n",
        "_TABLE = {1: 2}\ndef f(x):\n    return _TABLE.get(x)\n",
        "_n = 0\ndef f(x):\n    global _n\n    return _n + x\n",
        "_c = {}\ndef f(x):\n    _c = {}\n    _c[x] = 1\n",
        "import torch\ndef f(x):\n    y = torch.zeros(3)\n    y.add_(x)\n    return y\n",
        "import functools\ndef f(xs):\n    return functools.reduce(lambda a, b: a + b, xs)\n",
        "_W = {}\n_W['scale'] = 2.0\n",
    ],
    ids=[
        "locals", "parameters", "instance", "closure-of-one-call", "read-only-table",
        "global-read", "shadowed", "local-tensor", "functools-reduce", "module-level-setup",
    ],
)  # fmt: skip
def test_state_within_one_call_is_not_flagged(source: str) -> None:
    assert "state" not in groups(source), scan_source(source, "k.py")


def test_state_can_be_allowed() -> None:
    after = {"k.py": "_c = {}\ndef f(x):\n    _c[x] = x\n"}
    assert [v.group for v in new_violations({}, after, [])] == ["state"]
    assert new_violations({}, after, ["state"]) == []


@pytest.mark.parametrize("name", [p.name for p in sorted(BUNDLED.iterdir()) if p.is_dir()])
def test_bundled_patches_pass_the_rules(name: str) -> None:
    """Every bundled task's own patches (reference fix, wrong fix) pass the static stage, applied
    to the tree the agent sees (an installed package's with the task's fault injected). The fault
    itself (inject.patch) makes the baseline: it is not a candidate."""
    task = find_task(name)
    tree = workspace_tree(task)
    for patch_file in sorted(p for p in task.root.glob("*.patch") if p.name != "inject.patch"):
        patch = parse_diff(patch_file.read_text())
        scratch = preview_apply(patch, task)
        try:
            before = {r: tree.read_text(r) if tree.is_file(r) else None for r in patch.files}
            after = {r: _read(scratch / "ws" / r) for r in patch.files}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        assert new_violations(before, after, task.manifest.allow) == [], patch_file.name


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


@pytest.mark.parametrize(
    ("source", "group"),
    [
        # a module reached as another module's attribute
        ("import queue\nqueue.threading.Thread(target=f).start()", "threads"),
        ("import logging\nt = logging.threading\nt.Thread(target=f)", "threads"),
        ("from queue import threading", "threads"),
        ("import shutil\nshutil.os.system('ls')", "processes"),
        ("import os\nos.sys.modules", "introspection"),
        ("import queue\nsetattr(queue.threading, 'Thread', None)", "timers"),
        ("import torch\nlib = torch.library.Library('aten', 'IMPL')", "ctypes"),
        ("import sys\nsys.modules['threading'].Thread(target=f)", "threads"),
        ("import os\nos.__dict__['system']('ls')", "processes"),
        # constant-string getattr / setattr
        ("import torch\ngetattr(torch, 'set_num_threads')(4)", "threads"),
        ("import os\ngetattr(os, 'system')('ls')", "processes"),
        ("import os\ngetattr(os, 'environ')", "harness"),
        ("import sys\ngetattr(sys, '_getframe')(1)", "introspection"),
        ("x = getattr(f, '__globals__')", "introspection"),
        ("import torch\ngetattr(torch, 'multiprocessing')", "processes"),
        ("import time\nsetattr(time, 'perf_counter', f)", "timers"),
        ("import torch\nsetattr(torch.Tensor, 'add', f)", "timers"),
        # __import__, importlib, builtins
        ("t = __import__('threading')\nt.Thread(target=f)", "threads"),
        ("import importlib\nimportlib.import_module('socket')", "network"),
        (
            "import importlib\ns = importlib.import_module('socket')\ns.create_connection(a)",
            "network",
        ),
        ("import builtins\nbuiltins.__import__('subprocess')", "processes"),
        ("import builtins\nbuiltins.exec('x = 1')", "dynamic"),
        ("import builtins\ng = builtins.getattr\ng(os, 'x' + 'y')", "dynamic"),
    ],
)
def test_rules_see_through_indirection(source: str, group: str) -> None:
    """Each spelling is caught as its real group even where a task allows `dynamic` and
    `introspection` (the groups an indirection itself might fall under)."""
    allowed = ["dynamic", "introspection"] if group not in ("dynamic", "introspection") else []
    found = new_violations({"k.py": None}, {"k.py": source}, allowed)
    assert group in {v.group for v in found}, [v.describe() for v in found]


@pytest.mark.parametrize(
    "source",
    [
        "import os\nos.path.join('a', 'b')",
        "import functools\nfunctools.partial(f, 1)",
        "import torch\ny = torch.nn.functional.relu(x)",
        "n = getattr(x, 'shape')[0]",
        "import json\njson.decoder.JSONDecodeError",
    ],
)
def test_indirection_reading_does_not_flag_ordinary_code(source: str) -> None:
    assert scan_source(source, "k.py") == []
