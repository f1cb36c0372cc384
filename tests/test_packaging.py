"""One package, `infra_agent`: the architecture folders import only under it, installs work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import REPO

IMPORT_ALL = "import infra_agent.feedback, infra_agent.sandboxes, infra_agent.tasks, infra_agent.tools, infra_agent.agent"


def _py(
    code: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )


def test_architecture_imports_as_one_package(tmp_path: Path) -> None:
    result = _py(IMPORT_ALL + "; print('ok')", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_bare_names_do_not_resolve_to_this_project(tmp_path: Path) -> None:
    for name in ("tools", "tasks", "agent", "feedback", "sandboxes"):
        elsewhere = _py(f"import {name}", cwd=tmp_path)
        assert elsewhere.returncode != 0
        assert "ModuleNotFoundError" in elsewhere.stderr
        # Even from the repository root, the folder refuses to be imported under its bare name.
        in_repo = _py(f"import {name}", cwd=REPO)
        assert in_repo.returncode != 0
        assert (
            f"import it as infra_agent.{name}" in in_repo.stderr
            or "ModuleNotFoundError" in in_repo.stderr
        )


def test_regular_wheel_install_works(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next(wheels.glob("infra_agent-*.whl"))
    target = tmp_path / "site"
    inst = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert inst.returncode == 0, inst.stderr[-2000:]
    assert not (target / "infra_agent" / "setup.py").exists()
    assert not (target / "infra_agent" / ".venv").exists()
    code = IMPORT_ALL + "; import infra_agent; print(infra_agent.__file__)"
    result = _py(code, cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(target))
    # The bundled skeletons ship beside the tools that read them.
    skeletons = {
        p.name for p in (target / "infra_agent" / "tools" / "skeletons" / "bundled").glob("*.toml")
    }
    assert skeletons == {p.name for p in (REPO / "tools" / "skeletons" / "bundled").glob("*.toml")}
    assert skeletons, "no bundled skeleton in the source tree"
    # The CPU kernel shim (no package: SGLang servers put it on their PYTHONPATH) ships whole.
    shim = REPO / "serving" / "kernel_shim"
    shipped = target / "infra_agent" / "serving" / "kernel_shim"
    modules = {p.relative_to(shim) for p in shim.rglob("*.py")}
    assert modules, "no kernel shim module in the source tree"
    assert {p.relative_to(shipped) for p in shipped.rglob("*.py")} == modules
    # Bundled task folders ship as package data.
    bundled = target / "infra_agent" / "bundled_tasks"
    src_bundled = REPO / "bundled_tasks"
    tasks = {p.name for p in src_bundled.iterdir() if (p / "task.toml").is_file()}
    assert tasks, "no bundled task in the source tree"
    assert {p.name for p in bundled.iterdir()} >= tasks
    # ... where the installed registry finds them.
    found = _py(
        "from infra_agent.tasks.registry import find_task; print(find_task('example-matmul').root)",
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(bundled / "example-matmul")
