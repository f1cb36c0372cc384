"""Static rules: what each group catches, what a task may allow, and what was already there."""

from __future__ import annotations

import pytest

from infra_agent.experiments.rules import new_violations, scan_source


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
