"""The conversation with no wasted turns (issue 34), replayed with the scripted model: the first
message shows a serving task's deployment, the system prompt names only the tools offered (the
sparse arm's no instrument), read_file pages a 400-line module in two answers, search hits name
their enclosing class and function, and each reply's budget line warns at 75% and 90%."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from infra_agent.agent import prompts
from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.prompts import system_prompt, task_message
from infra_agent.agent.runner import start_run
from infra_agent.agent.state import Budget
from infra_agent.config import load_settings
from infra_agent.serving.env import find_sglang_env
from infra_agent.store import open_store
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.registry import find_task, list_tasks
from infra_agent.tasks.tree import WorkspaceTree
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import AGENT_TOOLS, default_registry

EVERY_TOOL = [t.name for t in AGENT_TOOLS]
INSTRUMENTS = [t.name for t in AGENT_TOOLS if t.kind == "instrument"]


def _replay(tmp_path: Path, task: str, replies: list[dict[str, Any]], **config: Any) -> list[Any]:
    """Run the scripted model through the real graph; the run's steps as stored."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(replies))
    db = tmp_path / "runs.db"
    settings = load_settings(overrides={"store.db": str(db)})
    outcome = start_run(RunConfig(task=task, policy="scripted", script=str(script), **config), settings)  # fmt: skip
    store = open_store(db)
    try:
        return store.steps(outcome.run_id)
    finally:
        store.close()


def _answers(steps: list[Any], name: str) -> list[str]:
    return [s.content for s in steps if s.role == "tool" and s.name == name]


def _named(text: str) -> set[str]:
    return {n for n in EVERY_TOOL if re.search(rf"\b{n}\b", text)}


def _fake_package(tmp_path: Path) -> WorkspaceTree:
    """A small stand-in for the installed SGLang tree (the real one needs SGLang's venv)."""
    root = tmp_path / "site"
    (root / "sglang" / "srt").mkdir(parents=True, exist_ok=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "server_args.py").write_text("x = 1\n")
    return WorkspaceTree(root=root, top="sglang")


def _serving_copy(tmp_path: Path, extra_args: str) -> Task:
    """sglang-slow-decode with `extra_args` added to its deployment's server arguments."""
    folder = tmp_path / "sglang-slow-decode"
    shutil.copytree(find_task("sglang-slow-decode").root, folder)
    spec = folder / "deployment.toml"
    text = spec.read_text().replace("[deployment.server_args]\n", f"[deployment.server_args]\n{extra_args}")  # fmt: skip
    spec.write_text(text)
    return find_task(str(folder))


def test_the_first_message_shows_the_deployment_the_harness_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launch command, device, dtype, attention backend and model config, read from the
    task's own deployment spec and the generated model's config: changing the spec changes them."""
    monkeypatch.setattr(prompts, "workspace_tree", lambda task: _fake_package(tmp_path))
    task = find_task("sglang-slow-decode")
    text = task_message(task, "throughput", Budget(), "f" * 64, {})
    launch = next(line for line in text.splitlines() if line.startswith("  launch: "))
    assert "OMP_NUM_THREADS=1" in launch  # the deployment's own environment
    assert "/bin/python -m sglang.launch_server --model-path <" in launch
    assert launch.endswith("--device cpu --random-seed 0 --max-total-tokens 32768 --sleep-on-idle --host 127.0.0.1 --port <free port>")  # fmt: skip
    amx = "amx_tile" in Path("/proc/cpuinfo").read_text()
    assert f"device cpu; dtype auto -> bfloat16 (the model config's torch_dtype); attention backend {'intel_amx' if amx else 'torch_native'}" in text  # fmt: skip
    for shape in ("hidden_size 128", "num_attention_heads 4", "num_key_value_heads 2", "head size 32", "vocab_size 1024"):  # fmt: skip
        assert shape in text, shape
    assert "workload: 32 requests of 256 random tokens -> 32 tokens" in text

    changed = _serving_copy(tmp_path, 'dtype = "float32"\nattention-backend = "triton"\n')
    text = task_message(changed, "throughput", Budget(), "f" * 64, {})
    assert "--dtype float32 --attention-backend triton" in text
    assert "device cpu; dtype float32; attention backend triton" in text
    ctx = ToolContext(task=changed, store=open_store(tmp_path / "r.db"), run_id="r")
    described = default_registry().call("describe_task", "{}", ctx).content
    block = text[text.index("deployment (") : text.index("\n\nWorkspace")]
    assert block in described  # describe_task shows the same deployment


@pytest.mark.skipif(find_sglang_env() is None, reason="the SGLang package tree needs its venv")
def test_a_replayed_sparse_run_on_a_serving_task_sees_the_deployment_and_no_instrument(
    tmp_path: Path,
) -> None:
    steps = _replay(
        tmp_path, "sglang-slow-decode",
        [{"tool_calls": [{"name": "describe_task", "arguments": {}}]},
         {"tool_calls": [{"name": "finish", "arguments": {"summary": "read only"}}]}],
        feedback="sparse",
    )  # fmt: skip
    system, first = steps[0].content, steps[1].content
    assert "-m sglang.launch_server" in first and "attention backend " in first
    assert "num_attention_heads 4" in first
    assert not _named(system) & set(INSTRUMENTS) and "instrument" not in system
    assert "lookup_skeletons" not in system and "propose_knobs" not in system
    assert "-m sglang.launch_server" in _answers(steps, "describe_task")[0]


@pytest.mark.parametrize("feedback", ["dense", "sparse"])
def test_the_prompt_names_only_tools_that_are_offered(
    feedback: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For every bundled task (kernel, python, serving) and both arms: each tool the system
    prompt or the first message names is in the run's tool list; the sparse prompt names no
    instrument and no skeleton lookup."""
    real = prompts.workspace_tree
    monkeypatch.setattr(prompts, "workspace_tree", lambda task: _fake_package(tmp_path) if task.manifest.workspace.package else real(task))  # fmt: skip
    kinds = set()
    for task in list_tasks():
        tools = default_registry(feedback, task)
        offered = set(tools.names())
        system = system_prompt(tools)
        first = task_message(task, "throughput", Budget(), "f" * 64, {})
        assert _named(system) <= offered, (task.name, _named(system) - offered)
        assert _named(first) <= offered, (task.name, _named(first) - offered)
        if feedback == "sparse":
            assert "instrument" not in system and not _named(system) & set(INSTRUMENTS)
            assert "lookup_skeletons" not in system
        else:  # the dense prompt names every instrument it offers
            assert {n for n in INSTRUMENTS if n in offered} <= _named(system)
        assert ("propose_knobs" in system) == bool(task.manifest.knobs), task.name
        kinds.add(task.manifest.kind)
    assert kinds >= {"serving", "python"}


def _copy_with(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "task"
    shutil.copytree(find_task("decode-split-norm").root, folder)
    for name, text in files.items():
        (folder / "workspace" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "workspace" / name).write_text(text)
    return folder


def test_read_file_pages_a_400_line_module_in_two_replies(tmp_path: Path) -> None:
    """Lines as long as SGLang's longest 400-line modules (25k characters with line numbers):
    asked for 400 lines, the first answer stops at its stated cap and says where to go on; the
    second reaches the end."""
    line = "        self.running_batch = self.update_running_batch(batch)  # ok"
    task = _copy_with(tmp_path, {"module.py": "".join(f"{line}{i}\n" for i in range(1, 401))})
    ctx = ToolContext(task=find_task(str(task)), store=open_store(tmp_path / "r.db"), run_id="r")
    ask = {"path": "module.py", "max_lines": 400}
    head = default_registry().call("read_file", json.dumps(ask), ctx).content.split("\n")[0]
    cont = int(head.rsplit("start_line=", 1)[1])
    (tmp_path / "run").mkdir()
    steps = _replay(
        tmp_path / "run", str(task),
        [{"tool_calls": [{"name": "read_file", "arguments": ask}]},
         {"tool_calls": [{"name": "read_file", "arguments": {**ask, "start_line": cont}}]}],
    )  # fmt: skip
    first, second = _answers(steps, "read_file")
    assert first.startswith(f"module.py: lines 1-{cont - 1} of 400 (asked for 400; one answer holds at most 16,000 characters); continue with start_line={cont}\n")  # fmt: skip
    assert 200 < cont < 400
    assert second.startswith(f"module.py: lines {cont}-400 of 400\n")
    shown = [ln for text in (first, second) for ln in text.split("\n") if ln.endswith(tuple("0123456789")) and "ok" in ln]  # fmt: skip
    assert [int(ln.split()[0]) for ln in shown] == list(range(1, 401))  # every line, once
    assert all("characters cut" not in text for text in (first, second))


SCHEDULER = '''"""A stand-in scheduler."""

LIMIT = 4  # running_batch limit


class Scheduler:
    def __init__(self) -> None:
        self.running_batch = []

    def event_loop(self) -> None:
        def step() -> None:
            self.running_batch = self.running_batch[:LIMIT]

        step()


def helper() -> int:
    return len([]) + LIMIT
'''


def test_search_hits_name_their_scope_and_an_empty_glob_is_told_apart(tmp_path: Path) -> None:
    task = _copy_with(tmp_path, {
        "scheduler.py": SCHEDULER,
        "mem_cache/radix.py": "x = 1\n",
        "mem_cache/allocator/pool.py": "def free_segment(s):\n    return s  # free_segment\n",
    })  # fmt: skip
    search = [
        {"regex": r"running_batch|LIMIT", "pattern": "scheduler.py"},
        {"regex": "x", "pattern": "sglang/srt/**/*.py"},
        {"regex": "no_such_name", "pattern": "*.py"},
        {"regex": "def free_segment", "pattern": "mem_cache/*.py"},
        {"regex": "def free_segment", "pattern": "mem_cache/**/*.py", "context": 2},
        {"regex": "def free_segment", "pattern": "mem_cache/alloc*"},
    ]
    steps = _replay(tmp_path, str(task), [{"tool_calls": [{"name": "search_files", "arguments": a}]} for a in search])  # fmt: skip
    hits, no_file, no_line, not_below, with_context, a_folder = _answers(steps, "search_files")
    assert hits.splitlines()[:4] == [
        "scheduler.py:3: LIMIT = 4  # running_batch limit",  # module level: no scope
        "scheduler.py:8 (in Scheduler.__init__): self.running_batch = []",
        "scheduler.py:12 (in Scheduler.event_loop.step): self.running_batch = self.running_batch[:LIMIT]",
        "scheduler.py:18 (in helper): return len([]) + LIMIT",
    ]  # fmt: skip
    assert no_file.startswith("no file matches the glob 'sglang/srt/**/*.py' (nothing searched")
    assert no_line.startswith("no line matches /no_such_name/ in the 5 files matching '*.py'")
    # A relay run searched 'mem_cache/*.py' for a function in mem_cache/allocator/ and read
    # 'no line matches' as 'no such function': the answer says where '*' did not reach.
    assert not_below.startswith(
        "no line matches /def free_segment/ in the 1 file matching 'mem_cache/*.py'; '*' stays "
        "within one folder: 'mem_cache/**/*.py' reaches 1 more file in subfolders, where 1 line "
        "matches"
    ), not_below
    # A relay run spent three replies reading three gates that turned out off by default: a
    # hit's next lines come with it when asked.
    assert with_context.splitlines()[:2] == [
        "mem_cache/allocator/pool.py:1 (in free_segment): def free_segment(s):",
        "      2|     return s  # free_segment",
    ], with_context
    # A glob that names a folder (a relay run: 'sglang/kernels/ops/sampling*') says so.
    assert a_folder.startswith(
        "no file matches the glob 'mem_cache/alloc*' (nothing searched; see list_files); it names "
        "folders (mem_cache/allocator): 'mem_cache/allocator/**' searches inside"
    ), a_folder


def test_the_budget_line_names_every_budget_and_warns_at_75_and_90_percent(
    tmp_path: Path,
) -> None:
    """Tokens reach 40%, 78%, 91% of their budget on the recorded usage; replies 1, 2, 3 of 4:
    the warnings come as each passes 75% and 90%, before the run stops on one."""
    listing = {"name": "list_files", "arguments": {}}
    replies = [
        {"tool_calls": [listing], "prompt_tokens": 350, "completion_tokens": 50},
        {"tool_calls": [listing], "prompt_tokens": 350, "completion_tokens": 30},
        {"tool_calls": [listing], "prompt_tokens": 120, "completion_tokens": 10},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "s"}}]},
    ]
    budget = Budget(tokens=1000, turns=4, experiments=2, cost_usd=0.0)
    steps = _replay(tmp_path, "decode-split-norm", replies, budget=budget)
    first, second, third = (text[text.index("[budget used: ") :] for text in _answers(steps, "list_files"))  # fmt: skip
    assert first.startswith("[budget used: replies 1/4, tokens 400/1,000, experiments 0/2, cost $0.00 (no limit), time ")  # fmt: skip
    assert first.endswith("/3600 s]") and "warning" not in first  # 40% of the tokens
    assert second.split("\n")[1] == (
        "[budget warning: tokens 78% used (past 75%; 220 left). The run stops at the first "
        "budget used up: plan to finish before then.]"
    )
    warning = third.split("\n")[1]
    assert "replies 75% used (past 75%; 1 left)" in warning
    assert "tokens 91% used (past 90%; 90 left)" in warning
    assert "budget line" in steps[0].content  # the system prompt says what the line is


def test_a_full_search_answer_says_how_to_go_on(tmp_path: Path) -> None:
    """A relay run's long search was cut mid-hit ('[... 2207 more characters cut]') with no way
    to see the rest but a narrower search: the answer holds whole hits and names the `skip`
    that continues, and that skip shows the rest."""
    line = "    running_batch = merge(running_batch, waiting_queue)  # " + "x" * 100 + "\n"
    task = _copy_with(tmp_path, {"many.py": line * 80})
    search = [{"regex": "running_batch", "pattern": "many.py", "max_hits": 100}]
    steps = _replay(tmp_path, str(task), [{"tool_calls": [{"name": "search_files", "arguments": a}]} for a in search])  # fmt: skip
    (first,) = _answers(steps, "search_files")
    assert "more characters cut" not in first
    tail = next(t for t in first.splitlines() if t.startswith("[answer full after "))
    shown = int(tail.split()[3])
    assert 0 < shown < 80 and tail.endswith(f"search again with skip={shown} for the rest]")
    # Why it stopped short of max_hits, and what is left:
    assert f"{80 - shown} more hits found" in tail
    rest = [{"regex": "running_batch", "pattern": "many.py", "skip": shown}]
    (tmp_path / "2").mkdir()
    steps = _replay(tmp_path / "2", str(task), [{"tool_calls": [{"name": "search_files", "arguments": a}]} for a in rest])  # fmt: skip
    (second,) = _answers(steps, "search_files")
    assert second.startswith(f"many.py:{shown + 1}: running_batch"), second[:100]
