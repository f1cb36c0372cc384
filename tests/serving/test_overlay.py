"""Source patches through the PYTHONPATH overlay: private per arm, the installed SGLang untouched."""

from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.serving.env import find_sglang_env
from infra_agent.serving.overlay import (
    add_module,
    build_overlay,
    changed_modules,
    installed_package,
)

pytestmark = pytest.mark.skipif(
    find_sglang_env() is None,
    reason="SGLang environment not created (python -m infra_agent.serving.env --ensure)",
)
REL = "sglang/srt/layers/sampler.py"


def test_unchanged_workspace_needs_no_overlay(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    add_module(ws, REL)
    assert changed_modules(ws, [REL]) == []
    assert build_overlay(ws, [REL], tmp_path / "overlay") is None


def test_overlay_is_private_and_leaves_the_install_alone(tmp_path: Path) -> None:
    installed = installed_package() / "srt/layers/sampler.py"
    before = (installed.read_bytes(), installed.stat().st_ino, installed.stat().st_mtime_ns)
    arms = []
    for name in ("a", "b"):
        ws = tmp_path / f"ws-{name}"
        add_module(ws, REL)
        path = ws / REL
        path.write_text(path.read_text() + f"\nOVERLAY_MARK = {name!r}\n")
        overlay = build_overlay(ws, [REL], tmp_path / f"overlay-{name}")
        assert overlay is not None
        arms.append(overlay)
    a, b = (o / REL for o in arms)
    assert a.read_text().endswith("OVERLAY_MARK = 'a'\n") and b.read_text().endswith(
        "OVERLAY_MARK = 'b'\n"
    )
    assert (installed.read_bytes(), installed.stat().st_ino, installed.stat().st_mtime_ns) == before
    # The rest of the package is there (linked), so `import sglang` from the overlay works.
    assert (arms[0] / "sglang/srt/server_args.py").is_file()


def test_paths_outside_sglang_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="inside the sglang package"):
        add_module(tmp_path, "../etc/passwd")
    with pytest.raises(UserError, match="has no module"):
        add_module(tmp_path, "sglang/no/such_module.py")
