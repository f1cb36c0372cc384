"""The review web UI end to end: `infra-agent review serve` in a subprocess, driven by headless
Chromium (Debian's, through Playwright) and by plain HTTP for the refusal cases."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import tomllib
from recorded_samples import replay_timing
from support import stoppable

from infra_agent.review.queue import review_outcome, submit_proposal
from infra_agent.store import open_store
from infra_agent.store.records import (
    ExperimentRecord,
    ProposalStatus,
    RunRecord,
    RunStatus,
    StepRecord,
    ToolCall,
)
from infra_agent.store.verdict import Flag

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "review"
TOKEN = "test-token-0123456789"
BOB_TOKEN = "bob-token-0123456789"
REASONING = "The loop is the cost; reading the file shows whether queue supports slicing."
LONG_ARGS = json.dumps({"path": "scheduler.py", "start_line": 1, "note": "x" * 300})
TOOL_ERROR = "search_files: regex '(' is invalid (missing ), unterminated subpattern at position 0)"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/setup-system.sh)"
    ),
]


@dataclass
class AgentRun:
    """A real agent run (scripted policy, real experiment) that stops at the review interrupt."""

    thread: threading.Thread
    outcome: list[Any]
    """[RunOutcome] once start_run returned, or [exception]."""


@dataclass
class Served:
    base: str
    """http://r-<random>.localhost:PORT: the name Chromium resolves to loopback by itself."""
    store_path: Path
    home: Path
    ids: dict[str, str]
    task_root: Path
    stale_task_root: Path
    agent: AgentRun

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    @property
    def authority(self) -> str:
        return self.base.removeprefix("http://")

    def client(self) -> httpx.Client:
        """An HTTP client of the server: to 127.0.0.1, under the server's name (only browsers
        resolve `*.localhost` names by themselves)."""
        return httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}", headers={"host": self.authority},
            follow_redirects=False, timeout=30,
        )  # fmt: skip

    def connection(self) -> http.client.HTTPConnection:
        """A raw HTTP connection (for URLs and bodies httpx refuses); send Host: `authority`."""
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)


def _start_agent_run(root: Path) -> AgentRun:
    """`optimize` on the bundled example-matmul task with a scripted model that proposes the
    matmul fix, verifies it and finishes: the run submits its proposal and waits for review."""
    from infra_agent.agent.configuration import RunConfig
    from infra_agent.agent.runner import start_run
    from infra_agent.config import load_settings
    from infra_agent.tasks.registry import find_task

    # The run reaches the review interrupt only if its experiment is IMPROVED, and it measures
    # while this module's other tests drive Chromium and the server (in this process): measured
    # here, the verdict once came out otherwise ("agent run did not stop for review"). So a copy
    # of the bundled task reports a recorded real experiment of this fix (3.4x) in place of its
    # clock; the arms still run and check the patched code on every sample.
    task_root = root / "example-matmul"
    shutil.copytree(find_task("example-matmul").root, task_root)
    replay_timing(task_root, "matmul-reference")
    diff = (task_root / "reference.patch").read_text()
    script = [
        {"content": "The projection builds an m x k x n temporary; a BLAS product should be far faster.",
         "tool_calls": [{"name": "propose_patch", "arguments": {"diff": diff, "rationale": "Use x @ w instead of broadcast-and-sum."}}]},
        {"content": "Verify it against baseline.", "tool_calls": [{"name": "run_experiment", "arguments": {"patch_id": "{{last_patch_id}}"}}]},
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"summary": "x @ w replaces the broadcast-and-sum."}}]},
    ]  # fmt: skip
    (root / "script.json").write_text(json.dumps(script))
    settings = load_settings(overrides={"store.db": str(root / "runs.db")}, cwd=root)
    config = RunConfig(
        task=str(task_root),
        objective="latency",
        policy="scripted",
        script=str(root / "script.json"),
    )
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(start_run(config, settings))
        except BaseException as exc:  # reported by the test that needs it
            outcome.append(exc)

    thread = threading.Thread(target=run, name="agent-run", daemon=True)
    thread.start()
    return AgentRun(thread=thread, outcome=outcome)


def _seed(root: Path, kit: SimpleNamespace) -> tuple[dict[str, str], Path, Path]:
    store = open_store(root / "runs.db")
    task = kit.make_task(root / "toy-sched")
    toml = task.root / "task.toml"  # a precision floor, so a 2.09x error can pass (and say why)
    toml.write_text(toml.read_text() + "[tolerance]\nf64_floor = 1e-6\n")
    from infra_agent.tasks.manifest import load_task

    task = load_task(task.root)
    ids: dict[str, str] = {}

    run = RunRecord(
        task=task.name,
        objective="latency",
        policy="scripted",
        model="scripted-llm",
        status=RunStatus.FINISHED,
    )
    store.put_run(run)
    store.add_step(
        StepRecord(
            run_id=run.id,
            role="user",
            content="Make next_batch faster without changing its output.",
        )
    )
    store.add_step(
        StepRecord(
            run_id=run.id, role="assistant", content="The loop appends one request at a time; slicing should be faster.",
            tool_calls=[ToolCall(id="c1", name="run_experiment", arguments='{"patch": "scheduler.diff"}')],
        )
    )  # fmt: skip
    store.add_step(
        StepRecord(
            run_id=run.id,
            role="tool",
            name="run_experiment",
            tool_call_id="c1",
            content="IMPROVED 1.3x",
        )
    )
    # Two calls in one reply (one with long arguments), reasoning, and a tool that fails.
    store.add_step(
        StepRecord(
            run_id=run.id, role="assistant", content="", reasoning_content=REASONING,
            tool_calls=[ToolCall(id="c2", name="read_file", arguments=LONG_ARGS),
                        ToolCall(id="c3", name="search_files", arguments='{"regex": "("}')],
        )
    )  # fmt: skip
    store.add_step(
        StepRecord(
            run_id=run.id, role="tool", name="read_file", tool_call_id="c2", content="1  def next_batch",
        )
    )  # fmt: skip
    store.add_step(
        StepRecord(
            run_id=run.id, role="tool", name="search_files", tool_call_id="c3",
            content=f"error: {TOOL_ERROR}", error=TOOL_ERROR,
        )
    )  # fmt: skip

    def propose(
        key: str,
        diff: str,
        *,
        run_id: str | None,
        speedup: float,
        extra: dict[str, object] | None = None,
        on=task,
        tweak: Callable[[ExperimentRecord], None] = lambda exp: None,
    ) -> None:
        patch = kit.diff_patch(diff)
        exp: ExperimentRecord = kit.experiment_for(on, patch, speedup=speedup)
        exp.result.evidence.extra.update(extra or {})
        tweak(exp)
        ids[key] = submit_proposal(
            store,
            task=on,
            patch=patch,
            experiment=exp,
            rationale=f"{key}: slice the queue",
            run_id=run_id,
        ).id

    sweep = {
        "points": [
            {"size": 2**k, "max_abs": 1e-7 * 2 ** (k / 2), "rmse": 1e-8, "rel_diff": 1e-7}
            for k in range(6, 13)
        ]
    }
    accuracy = {
        "verdict": "PASS", "first_divergence": "layer3.attn_out", "reasons": ["first divergence at layer3.attn_out, within the probe tolerance"],
        "probes": [{"name": "layer3.attn_out", "diff": {"rel_diff": 2e-6, "max_abs": 3e-5}, "blame": "candidate"}],
    }  # fmt: skip
    propose(
        "main",
        kit.SCHED_DIFF,
        run_id=run.id,
        speedup=1.31,
        extra={
            "sweep": sweep,
            "accuracy": accuracy,
            "vendor_blob": {"odd": [1, {"x": None}], "html": "<img src=x onerror=alert(1)>"},
        },
        tweak=lambda exp: setattr(exp.result.evidence.correctness, "candidate_err_f64", 2.09e-7),
    )
    propose("reject", kit.SCHED_DIFF.replace("Slicing", "Slices"), run_id=None, speedup=1.12)
    propose("changes", kit.SCHED_DIFF.replace("Slicing", "A slice"), run_id=None, speedup=1.05)
    propose("race", kit.SCHED_DIFF.replace("Slicing", "Slice it"), run_id=None, speedup=1.02)
    propose("refusals", kit.SCHED_DIFF.replace("Slicing", "Cut"), run_id=None, speedup=1.01)
    propose("tampered", kit.SCHED_DIFF.replace("Slicing", "Slices it"), run_id=None, speedup=1.03)
    propose("replay", kit.SCHED_DIFF.replace("Slicing", "Cutting"), run_id=None, speedup=1.04)

    def noisy(exp: ExperimentRecord) -> None:
        """The highest point estimate, a wide CI, noise flags, and times near zero."""
        perf = exp.result.evidence.performance
        perf.speedup, perf.ci_low, perf.ci_high = 3.0, 1.02, 5.5
        perf.noise = ["high_iqr", "drift"]
        perf.baseline_samples = [0.3 + 0.12 * i for i in range(24)]
        perf.candidate_samples = [0.02 + 0.04 * i for i in range(24)]
        exp.result.flags = [Flag.NOISY]

    propose(
        "noisy",
        kit.SCHED_DIFF.replace("Slicing", "Sliced up"),
        run_id=None,
        speedup=3.0,
        tweak=noisy,
    )

    knobs = kit.knob_patch_record({"max_batch": 32})
    ids["knobs"] = submit_proposal(
        store, task=task, patch=knobs, experiment=kit.experiment_for(task, knobs, speedup=1.3),
        rationale="knobs: bigger batches", run_id=None,
    ).id  # fmt: skip

    # A copy of the bundled example task: its evidence goes stale when its workspace changes
    # upstream, and re-verification runs a real experiment on it.
    from infra_agent.tasks.manifest import load_task

    stale_task = load_task(kit.matmul_copy(root, "matmul-copy"))
    reference = (stale_task.root / "reference.patch").read_text()
    propose("stale", reference, run_id=None, speedup=1.4, on=stale_task)
    projection = stale_task.workspace / "projection.py"
    projection.write_text("# upstream: reviewed 2026-11\n" + projection.read_text())

    propose("malformed", kit.SCHED_DIFF.replace("Slicing", "Sliced"), run_id=None, speedup=1.01)
    bad_exp = store.get_proposal(ids["malformed"]).experiment_ids[0]
    tampered = store.get_proposal(ids["tampered"]).patch_id
    store.close()
    kit.edit_stored_patch(  # edited in place after it was measured: its id kept
        root / "runs.db",
        tampered,
        lambda d: d.replace("queue[:max_batch]", "queue[:max_batch + 1]"),
    )
    with sqlite3.connect(root / "runs.db") as conn:  # evidence written by a future/buggy version
        conn.execute(
            "UPDATE experiments SET body=? WHERE id=?",
            (
                json.dumps(
                    {"id": bad_exp, "result": {"verdict": "WEIRD"}, "note": "from the future"}
                ),
                bad_exp,
            ),
        )
    return ids, task.root, stale_task.root


def _start(root: Path, kit: SimpleNamespace) -> Iterator[Served]:
    ids, task_root, stale_root = _seed(root, kit)
    agent = _start_agent_run(root)  # runs its experiment while the other tests use the server
    home = root / "home"
    config = root / "infra-agent.toml"  # a second reviewer, whose session another site tosses
    config.write_text(f'[review.tokens]\nbob = "{BOB_TOKEN}"\n')
    env = {**os.environ, "INFRA_AGENT_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra_agent.cli", "--config", str(config), "--db", str(root / "runs.db"), "review", "serve", "--port", "0", "--token", TOKEN, "--reviewer", "ana"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
        preexec_fn=stoppable,  # it is stopped with Ctrl-C below
    )  # fmt: skip
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            url = next((ln.split()[1] for ln in lines if ln.startswith("open:")), None)
            time.sleep(0.1)
        if url is None:
            raise RuntimeError(
                f"server did not start: {''.join(lines)} {proc.stderr.read() if proc.poll() is not None and proc.stderr else ''}"
            )
        assert re.fullmatch(
            rf"http://r-[0-9a-f]{{20}}\.localhost:\d+/proposals\?token={TOKEN}", url
        )
        yield Served(
            base=url.split("/proposals")[0],
            store_path=root / "runs.db",
            home=home,
            ids=ids,
            task_root=task_root,
            stale_task_root=stale_root,
            agent=agent,
        )
    finally:
        agent.thread.join(timeout=300)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)  # bounds a server that ignores Ctrl-C; it takes ~1 s
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # Ctrl-C stops the server cleanly (exit 130, the shell's code for SIGINT, with no
        # traceback), leaving nothing of its process group behind.
        err = proc.stderr.read() if proc.stderr else ""
        assert proc.returncode == 130, err
        assert "Traceback" not in err, err
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, kit: SimpleNamespace) -> Iterator[Served]:
    yield from _start(tmp_path_factory.mktemp("review-web"), kit)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(server: Served, browser):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{server.base}/proposals?token={TOKEN}")
    yield page
    context.close()


def _status(server: Served, key: str) -> ProposalStatus:
    store = open_store(server.store_path, readonly=True)
    try:
        return store.get_proposal(server.ids[key]).status
    finally:
        store.close()


def _decisions(server: Served, key: str) -> list:  # type: ignore[type-arg]
    store = open_store(server.store_path, readonly=True)
    try:
        return store.decisions(server.ids[key])
    finally:
        store.close()


def _no_horizontal_scroll(page) -> None:  # type: ignore[no-untyped-def]
    overflow = page.evaluate(
        """() => {
            const bad = [];
            // the same 1 px the element check allows: a fractional pixel of layout rounds
            // scrollWidth up (a full run once failed with no element sticking out)
            if (document.documentElement.scrollWidth > window.innerWidth + 1) {
                // name what sticks out, so a failure says which element and text
                const out = [...document.querySelectorAll('body *')].filter(
                    (e) => e.getBoundingClientRect().right > window.innerWidth + 1);
                const last = out[out.length - 1];
                bad.push('page' + (last ? ': ' + last.tagName + '#' + last.id + '.' +
                    last.className + ' ' + (last.textContent || '').slice(0, 120) : ''));
            }
            document.querySelectorAll('table').forEach((t, i) => {
                if (t.scrollWidth > t.parentElement.clientWidth + 1) bad.push('table ' + i + ' ' + (t.id || t.className));
            });
            return bad;
        }"""
    )
    assert overflow == []


def test_queue_then_proposal_evidence_then_approve_applies(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    assert page.url == f"{server.base}/proposals"  # token dropped from the URL after login
    _no_horizontal_scroll(page)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "queue.png"), full_page=True)
    rows = page.locator("table.queue tbody tr")
    shown = [rows.nth(i).get_attribute("data-proposal") for i in range(rows.count())]
    # The background agent run may already have queued its own (several-fold) proposal: the
    # order is checked among the seeded ones.
    ids = [i for i in shown if i in server.ids.values()]
    # By the CI's low end, not the point estimate: the noisy 3.0x (CI 1.02-5.5) ranks below 1.31x.
    assert ids[0] == server.ids["stale"]
    assert ids.index(server.ids["main"]) < ids.index(server.ids["reject"])
    assert ids.index(server.ids["main"]) < ids.index(server.ids["noisy"])
    noisy_row = page.inner_text(f"tr[data-proposal='{server.ids['noisy']}']")
    assert "noisy" in noisy_row and "noise: high_iqr, drift" in noisy_row
    assert "1.020x" in noisy_row and "point 3.000x" in noisy_row
    page.click(f"a[href='/proposals/{server.ids['main']}']")
    page.wait_for_selector("#diff")
    assert (
        page.locator("#diff .gd").count() >= 1 and page.locator("#diff .gi").count() >= 1
    )  # highlighted -/+ lines
    comparison = page.inner_text("#comparison")
    assert (
        "step_time_ms median (ms)" in comparison
        and "1.310x better" in comparison
        and "95% CI 1.260–1.360" in comparison
    )
    assert page.locator("#samples-plot svg circle").count() == 48 + 2  # 24 samples per arm + legend
    assert page.locator("#samples-plot .x-tick").count() >= 3
    assert "layer3.attn_out" in page.inner_text("#accuracy")
    rule = page.inner_text("#f64-rule")  # which tolerance let a worse error pass, and why
    assert "2.09x baseline's error vs float64, above the allowed 1.5x" in rule
    assert "precision floor 1.000e-06" in rule
    assert page.locator("figure.growth svg polyline").count() == 1
    assert '"odd"' in page.inner_text("#other-evidence")  # unknown evidence shown raw
    assert "<img src=x onerror=alert(1)>" in page.inner_text("#other-evidence")  # as text
    assert page.locator("#other-evidence img").count() == 0
    trajectory = page.text_content("#trajectory") or ""  # closed steps included
    assert "slicing should be faster" in trajectory and REASONING in trajectory
    two_calls = page.locator("#step-3 summary code.call-summary")
    assert two_calls.count() == 2  # one line each, never run together
    assert "more characters not shown" in two_calls.nth(0).inner_text()  # a cut says so
    assert json.loads(page.inner_text("#call-3-0 pre")) == json.loads(LONG_ARGS)  # whole below
    assert trajectory.count(TOOL_ERROR) == 1  # a tool's error is shown once
    assert page.get_attribute("#step-5 .answers a", "href") == "#call-3-1"
    page.click("#call-3-1 a")  # from the call to its result
    assert page.url.endswith("#step-5") and page.is_visible("#step-5 pre")
    _no_horizontal_scroll(page)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "proposal.png"), full_page=True)

    page.fill("#comment", "looks right")
    page.click("#approve")
    page.wait_for_selector("#applied")
    branch = f"infra-agent/{server.ids['main']}"
    assert branch in page.inner_text("#applied")
    assert _status(server, "main") == ProposalStatus.APPLIED
    assert [d.action.value for d in _decisions(server, "main")] == ["approve", "apply"]
    repo = server.home / "workspaces" / "toy-sched"
    shown = subprocess.run(
        ["git", "-C", str(repo), "show", f"{branch}:scheduler.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "return list(queue[:max_batch])" in shown
    assert "approve" in page.inner_text("#audit") and "looks right" in page.inner_text("#audit")


def test_reject_and_request_changes(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{server.base}/proposals/{server.ids['reject']}")
    page.fill("#comment", "not worth the churn")
    page.click("#reject")
    page.wait_for_selector(".status-rejected")
    assert _status(server, "reject") == ProposalStatus.REJECTED

    page.goto(f"{server.base}/proposals/{server.ids['changes']}")
    page.click("#request-changes")  # without a comment: refused, nothing changes
    assert "needs a comment" in page.inner_text("#error")
    assert _status(server, "changes") == ProposalStatus.PENDING
    page.fill("#comment", "keep the loop: queue may be a deque")
    page.click("#request-changes")
    page.wait_for_selector(".status-changes_requested")
    store = open_store(server.store_path, readonly=True)
    assert (
        "keep the loop: queue may be a deque"
        in review_outcome(store, server.ids["changes"]).render()
    )
    store.close()


def test_sign_out_ends_the_browser_session(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{server.base}/proposals/{server.ids['changes']}")
    page.click("#sign-out")
    assert "Your session has ended" in page.inner_text("#signed-out")
    response = page.goto(f"{server.base}/proposals/{server.ids['changes']}")
    assert response is not None and response.status == 401
    assert "not signed in" in page.inner_text("#refusal")


def test_stale_proposal_refused_until_reverified(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{server.base}/proposals/{server.ids['stale']}")
    assert "target changed" in page.inner_text("#stale")
    assert "Approve is disabled" in page.inner_text("#stale") and page.is_disabled("#approve")
    page.evaluate("document.getElementById('approve').disabled = false")  # the server refuses too
    page.click("#approve")
    page.wait_for_selector("#error")
    assert "cannot approve" in page.inner_text("#error") and "target changed" in page.inner_text(
        "#error"
    )
    assert _status(server, "stale") == ProposalStatus.PENDING
    assert _decisions(server, "stale") == []

    page.click("#reverify")  # a real experiment on the changed target, in the server's background
    page.wait_for_selector("#job")
    page.wait_for_function(  # the limit only bounds a broken job (it takes 20-60 s)
        "() => { const j = document.getElementById('job'); return j && j.dataset.state !== 'running'; }",
        timeout=400_000,
    )
    assert page.get_attribute("#job", "data-state") == "done", page.inner_text("#job")
    assert page.locator("#stale").count() == 0
    assert "Earlier experiments" in page.inner_text("main")
    page.click("#approve")
    page.wait_for_selector("#applied")
    assert [d.action.value for d in _decisions(server, "stale")] == ["reverify", "approve", "apply"]


def test_auto_approved_knob_change_is_applied_to_argument_file(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{server.base}/proposals?status=approved")
    page.click(f"a[href='/proposals/{server.ids['knobs']}']")
    assert "max_batch" in page.inner_text("#knobs") and "8 → 32" in page.inner_text("#knobs")
    assert "policy" in page.inner_text("#audit")  # auto-approved by the risk policy, audited
    page.click("#apply")
    page.wait_for_selector("#applied")
    args = server.home / "deployments" / "toy-sched" / "server_args.toml"
    assert str(args) in page.inner_text("#applied")
    assert tomllib.loads(args.read_text()) == {"server_args": {"max_batch": 32}}
    assert _status(server, "knobs") == ProposalStatus.APPLIED


def test_malformed_evidence_renders_raw(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    response = page.goto(f"{server.base}/proposals/{server.ids['malformed']}")
    assert response is not None and response.status == 200
    assert "from the future" in page.inner_text("#raw-evidence")


def _signed_in(server: Served, token: str = TOKEN) -> tuple[httpx.Client, str]:
    client = server.client()
    assert client.get(f"/proposals?token={token}").status_code == 303
    html = client.get(f"/proposals/{server.ids['refusals']}").text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert csrf is not None
    return client, csrf.group(1)


def test_requests_without_token_or_csrf_change_nothing(server: Served) -> None:
    pid = server.ids["refusals"]
    store = open_store(server.store_path, readonly=True)
    patch_hash = store.get_proposal(pid).patch_hash
    store.close()
    form = {"action": "approve", "patch_hash": patch_hash}
    anonymous = server.client()
    assert anonymous.get(f"/proposals/{pid}").status_code == 401
    assert anonymous.get("/proposals?token=wrong-token-xyz").status_code == 401
    assert anonymous.post(f"/proposals/{pid}/decide", data=form).status_code == 401
    client, csrf = _signed_in(server)
    assert client.post(f"/proposals/{pid}/decide", data=form).status_code == 403
    assert (
        client.post(f"/proposals/{pid}/decide", data={**form, "csrf_token": csrf + "x"}).status_code
        == 403
    )
    evil = {"origin": "http://evil.example"}
    assert (
        client.post(
            f"/proposals/{pid}/decide", data={**form, "csrf_token": csrf}, headers=evil
        ).status_code
        == 403
    )
    rebound = client.get(f"/proposals/{pid}", headers={"host": "attacker.example"})
    assert rebound.status_code == 403
    assert client.get(f"/proposals/{pid}/decide").status_code == 405  # no state change by GET
    null_origin = client.post(
        f"/proposals/{pid}/decide", data={**form, "csrf_token": csrf}, headers={"origin": "null"}
    )
    assert null_origin.status_code == 403 and "cross-origin" in null_origin.text
    assert _status(server, "refusals") == ProposalStatus.PENDING
    assert _decisions(server, "refusals") == []


def test_double_submission_one_wins(server: Served) -> None:
    pid = server.ids["race"]
    store = open_store(server.store_path, readonly=True)
    patch_hash = store.get_proposal(pid).patch_hash
    store.close()
    client, csrf = _signed_in(server)
    results: list[httpx.Response] = []

    def post(action: str) -> None:
        results.append(
            client.post(
                f"/proposals/{pid}/decide",
                data={
                    "action": action,
                    "patch_hash": patch_hash,
                    "csrf_token": csrf,
                    "comment": "x",
                },
            )
        )

    threads = [
        threading.Thread(target=post, args=(a,)) for a in ("reject", "reject", "request_changes")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results) == [303, 409, 409]
    assert all("already decided by ana" in r.text for r in results if r.status_code == 409)
    assert len(_decisions(server, "race")) == 1


def test_agent_run_waiting_for_review_resumes_and_applies(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    server.agent.thread.join(timeout=300)
    assert server.agent.outcome, "the agent run did not return"
    outcome = server.agent.outcome[0]
    assert not isinstance(outcome, BaseException), f"agent run failed: {outcome!r}"
    assert outcome.status == "waiting_review", (
        f"agent run did not stop for review: {outcome.stop_reason}; experiments {outcome.experiments}"
    )
    pid = outcome.proposals[0].id

    page.goto(f"{server.base}/proposals?task=example-matmul")
    page.click(f"a[href='/proposals/{pid}']")
    page.wait_for_selector("#diff")
    assert "x @ w" in page.inner_text("#diff")
    assert "IMPROVED" in page.inner_text("#verdict")
    assert "latency_ms median (ms)" in page.inner_text("#comparison")
    store = open_store(server.store_path, readonly=True)
    perf = store.get_experiment(
        store.get_proposal(pid).experiment_ids[-1]
    ).result.evidence.performance
    store.close()
    n_points = len(perf.baseline_samples) + len(perf.candidate_samples)
    assert n_points >= 8 and page.locator("#samples-plot svg circle").count() == n_points + 2
    assert "error vs float64" in page.inner_text("#comparison")
    assert "propose_patch" in page.inner_text("#trajectory")
    assert "waiting review" in page.inner_text("section.head")
    _no_horizontal_scroll(page)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "proposal-agent-run.png"), full_page=True)

    page.click("#approve")
    page.wait_for_selector("#resumption")
    # The page reloads itself while the run resumes in the server's background thread.
    page.wait_for_function(
        "() => { const r = document.getElementById('resumption'); return r && !/queued|resuming/.test(r.textContent); }",
        timeout=120_000,
    )
    assert "resumed (run now finished)" in page.inner_text("#resumption")
    assert "applied" in page.inner_text("section.head")
    store = open_store(server.store_path, readonly=True)
    proposal = store.get_proposal(pid)
    run = store.get_run(outcome.run_id)
    store.close()
    assert proposal.status == ProposalStatus.APPLIED and run.status == RunStatus.FINISHED
    branch = f"infra-agent/{pid}"
    assert branch in proposal.applied_to
    repo = server.home / "workspaces" / "example-matmul"
    shown = subprocess.run(
        ["git", "-C", str(repo), "show", f"{branch}:projection.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "return x @ w" in shown


def test_edited_diff_is_stale_and_cannot_be_approved(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{server.base}/proposals/{server.ids['tampered']}")
    assert "changed after it was verified" in page.inner_text("#stale")
    assert page.is_disabled("#approve")
    assert "queue[:max_batch + 1]" in page.inner_text("#diff")  # what is stored now is shown
    page.evaluate("document.getElementById('approve').disabled = false")
    page.click("#approve")
    assert "hash to" in page.inner_text("#error")
    assert _status(server, "tampered") == ProposalStatus.PENDING


def test_a_token_link_from_another_site_does_not_sign_in(server: Served, browser) -> None:  # type: ignore[no-untyped-def]
    context = browser.new_context()
    page = context.new_page()
    link = f"{server.base}/proposals?token={TOKEN}"
    context.route(
        "http://evil.example/**",
        lambda route: route.fulfill(
            content_type="text/html", body=f'<a id="go" href="{link}">review queue</a>'
        ),
    )
    page.goto("http://evil.example/")
    with page.expect_navigation():
        page.click("#go")
    assert "followed from another site" in page.inner_text("#refusal")
    assert not [c for c in context.cookies() if c["name"] == "infra_agent_review"]
    response = page.goto(f"{server.base}/proposals")
    assert response is not None and response.status == 401
    response = page.goto(link)  # the same link opened directly signs in
    assert response is not None and response.status == 200 and page.url.endswith("/proposals")
    context.close()
    for headers in ({"sec-fetch-site": "same-site"}, {"referer": "http://127.0.0.1:1/x"}):
        plain = server.client().get(link.removeprefix(server.base), headers=headers)
        assert plain.status_code == 403, headers


def test_long_urls_and_unknown_pages_get_the_short_html_refusal(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    conn = server.connection()  # httpx refuses such URLs
    conn.request("GET", f"/proposals?task={'x' * 200_000}", headers={"Host": server.authority})
    long = conn.getresponse()
    text = long.read().decode()
    conn.close()
    assert long.status == 414 and "text/html" in long.getheader("content-type", "")
    assert len(text) < 5000 and "characters refused (at most 8,192)" in text
    response = page.goto(f"{server.base}/proposals/{'p' * 6000}")  # an id is never echoed whole
    assert response is not None and response.status == 404
    refusal = page.inner_text("#refusal")
    assert len(refusal) < 300 and "more characters not shown" in refusal
    response = page.goto(f"{server.base}/proposals/{'p' * 60_000}")
    assert response is not None and response.status == 414
    assert len(page.inner_text("#refusal")) < 300
    for path, status in (("/nowhere", 404), (f"/proposals/{server.ids['refusals']}/decide", 405)):
        response = page.goto(server.base + path)
        assert response is not None and response.status == status
        assert response.headers["content-type"].startswith("text/html")
        assert page.locator("#refusal").count() == 1


def test_oversized_and_chunked_bodies_are_refused(server: Served) -> None:
    pid = server.ids["refusals"]
    client, csrf = _signed_in(server)
    cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    form = f"action=request_changes&csrf_token={csrf}&comment=".encode()
    # A 3 MiB body is announced, its first bytes sent: the refusal comes before the rest is read.
    # A chunked body has no length to check, so it is refused whole.
    for framing, status in (("content-length", 413), ("transfer-encoding", 411)):
        conn = server.connection()
        conn.putrequest("POST", f"/proposals/{pid}/decide", skip_host=True)
        conn.putheader("host", server.authority)
        conn.putheader("cookie", cookie)
        conn.putheader("content-type", "application/x-www-form-urlencoded")
        if framing == "content-length":
            conn.putheader("content-length", str(3 * 1024 * 1024))
            conn.endheaders(form + b"z" * 1024)
        else:
            conn.putheader("transfer-encoding", "chunked")
            conn.endheaders(b"%x\r\n%s\r\n0\r\n\r\n" % (len(form), form))
        response = conn.getresponse()
        text = response.read().decode()
        conn.close()
        assert response.status == status and "text/html" in response.getheader("content-type", "")
        assert "refused" in text and len(text) < 5000
    assert _status(server, "refusals") == ProposalStatus.PENDING
    assert _decisions(server, "refusals") == []


def test_request_changes_comment_is_capped(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    from infra_agent.review.queue import MAX_COMMENT_CHARS

    page.goto(f"{server.base}/proposals/{server.ids['refusals']}")
    assert page.get_attribute("#comment", "maxlength") == str(MAX_COMMENT_CHARS)
    page.evaluate("document.getElementById('comment').removeAttribute('maxlength')")
    page.fill("#comment", "y" * 1_000_000)  # a form that skips the browser's limit
    page.click("#request-changes")
    assert "1,000,000 characters; at most 8,000 go to the agent" in page.inner_text("#error")
    assert _status(server, "refusals") == ProposalStatus.PENDING


def test_per_sample_plot_axis_of_times_near_zero(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{server.base}/proposals/{server.ids['noisy']}")
    y_ticks = [float(t) for t in page.locator("#samples-plot .y-tick").all_text_contents()]
    assert min(y_ticks) == 0.0 and len(y_ticks) >= 3  # times: the axis stops at zero
    x_ticks = [int(t) for t in page.locator("#samples-plot .x-tick").all_text_contents()]
    assert x_ticks[0] == 1 and x_ticks[-1] <= 24 and len(x_ticks) >= 3
    assert "noise: high_iqr, drift" in page.inner_text("#measurement")


class _OtherLocalServer(http.server.ThreadingHTTPServer):
    """Another service on 127.0.0.1, on its own port, that the reviewer's browser visits. Its
    pages toss a session cookie of its choosing (by header and by script, host-only and for
    the whole `localhost` domain); whatever review cookie the browser sends it, it replays from
    its own process to the review server's port, reads the CSRF token and approves."""

    def __init__(self, review_port: int, target: str, toss: str) -> None:
        self.review_port, self.target, self.toss = review_port, target, toss
        self.cookies_seen: list[str] = []
        self.replies: list[int] = []
        super().__init__(("127.0.0.1", 0), _OtherPage)

    def replay(self, cookie: str) -> None:
        def call(method: str, path: str, body: str = "") -> tuple[int, str]:
            conn = http.client.HTTPConnection("127.0.0.1", self.review_port, timeout=30)
            headers = {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"}
            conn.request(method, path, body=body, headers=headers)
            reply = conn.getresponse()
            text = reply.read().decode(errors="replace")
            conn.close()
            self.replies.append(reply.status)
            return reply.status, text

        status, page = call("GET", f"/proposals/{self.target}")
        fields = dict(re.findall(r'name="(csrf_token|patch_hash)" value="([^"]+)"', page))
        if status == 200 and len(fields) == 2:
            form = f"action=approve&patch_hash={fields['patch_hash']}&csrf_token={fields['csrf_token']}"
            call("POST", f"/proposals/{self.target}/decide", form)


class _OtherPage(http.server.BaseHTTPRequestHandler):
    server: _OtherLocalServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        cookie = self.headers.get("Cookie") or ""
        self.server.cookies_seen.append(cookie)
        if "infra_agent_review=" in cookie:
            self.server.replay(cookie)
        toss = f"infra_agent_review={self.server.toss}; Path=/"
        body = f'<p id="other">another local service</p><script>document.cookie = "{toss}"; document.cookie = "{toss}; Domain=localhost";</script>'.encode()
        self.send_response(200)
        self.send_header("Set-Cookie", toss)
        self.send_header("Set-Cookie", f"{toss}; Domain=localhost")
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_another_local_server_can_neither_replay_nor_toss_the_session(page, server: Served) -> None:  # type: ignore[no-untyped-def]
    bob, _ = _signed_in(server, BOB_TOKEN)  # the session another site would plant
    other = _OtherLocalServer(server.port, server.ids["replay"], bob.cookies["infra_agent_review"])
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        assert "signed in as <b>ana</b>" in page.content()
        ana = {c["name"]: c["value"] for c in page.context.cookies()}["infra_agent_review"]
        for host in ("127.0.0.1", "localhost", "other.localhost"):
            page.goto(f"http://{host}:{other.server_address[1]}/")
            assert page.inner_text("#other") == "another local service"
        page.goto(f"{server.base}/proposals/{server.ids['replay']}")
        assert "signed in as <b>ana</b>" in page.content()  # not bob's: the toss did not land
    finally:
        other.shutdown()
        other.server_close()
    assert len(other.cookies_seen) >= 3 and not [c for c in other.cookies_seen if ana in c]
    assert 200 not in other.replies  # nothing replayed got a page
    assert (
        _status(server, "replay") == ProposalStatus.PENDING and _decisions(server, "replay") == []
    )
    page.click("#reject")
    page.wait_for_selector(".status-rejected")
    assert [d.reviewer for d in _decisions(server, "replay")] == ["ana"]
