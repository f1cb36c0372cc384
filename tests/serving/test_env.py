"""The SGLang environment's install: one process at a time, the others wait for it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from infra_agent.serving import env as sglang_env


def test_a_second_caller_waits_for_the_install_instead_of_removing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFRA_AGENT_CACHE", str(tmp_path))
    release, waiting = threading.Event(), threading.Event()
    installs: list[str] = []
    removed_during_install: list[bool] = []

    def fake_run(argv: list[str], quiet: bool) -> None:
        if argv[1:3] == ["-m", "venv"]:  # the venv step: python appears
            (Path(argv[3]) / "bin").mkdir(parents=True)
            (Path(argv[3]) / "bin" / "python").write_text("")
            installs.append(argv[3])
        else:  # pip: slow, until the test lets it finish
            assert release.wait(30)
            removed_during_install.append(not Path(argv[0]).exists())

    def fake_print(*args: object, **kwargs: object) -> None:
        if "waiting for another process" in str(args[0]):
            waiting.set()

    monkeypatch.setattr(sglang_env, "_run", fake_run)
    monkeypatch.setattr(sglang_env, "print", fake_print, raising=False)
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(sglang_env.ensure_sglang_env("9.9")))
    first.start()
    while not installs:  # the first caller is installing
        first.join(0.01)
    second = threading.Thread(target=lambda: results.append(sglang_env.ensure_sglang_env("9.9")))
    second.start()
    assert waiting.wait(30), "the second caller did not wait for the install"
    release.set()
    first.join(30)
    second.join(30)
    assert len(installs) == 1 and removed_during_install == [False]
    assert results == [sglang_env.sglang_env_path("9.9")] * 2
    assert sglang_env.find_sglang_env("9.9") == results[0]
