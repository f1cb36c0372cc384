"""Source changes through the PYTHONPATH overlay: private per arm, the installed SGLang untouched,
everything unchanged reached through links (with its bytecode caches)."""

from pathlib import Path

import pytest
from support import needs_sglang_env

from infra_agent.errors import UserError
from infra_agent.serving.overlay import (
    build_overlay,
    changed_modules,
    installed_package,
    served_view,
)

pytestmark = needs_sglang_env()
REL = "sglang/srt/layers/sampler.py"


def copy_module(workspace: Path, rel: str) -> Path:
    target = workspace / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes((installed_package().parent / rel).read_bytes())
    return target


def test_unchanged_workspace_needs_no_overlay(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    copy_module(ws, REL)
    assert changed_modules(ws, [REL]) == []
    assert build_overlay(ws, [REL], tmp_path / "overlay") is None


def test_overlay_is_private_and_leaves_the_install_alone(tmp_path: Path) -> None:
    installed = installed_package() / "srt/layers/sampler.py"
    before = (installed.read_bytes(), installed.stat().st_ino, installed.stat().st_mtime_ns)
    arms = []
    for name in ("a", "b"):
        ws = tmp_path / f"ws-{name}"
        path = copy_module(ws, REL)
        path.write_text(path.read_text() + f"\nOVERLAY_MARK = {name!r}\n")
        overlay = build_overlay(ws, [REL], tmp_path / f"overlay-{name}")
        assert overlay is not None
        arms.append(overlay)
    a, b = (o / REL for o in arms)
    assert a.read_text().endswith("OVERLAY_MARK = 'a'\n") and b.read_text().endswith(
        "OVERLAY_MARK = 'b'\n"
    )
    assert not a.is_symlink()
    assert (installed.read_bytes(), installed.stat().st_ino, installed.stat().st_mtime_ns) == before
    # The rest of the package is there as links into the install, so `import sglang` works and
    # unchanged modules keep their bytecode caches; the changed module's cache is not linked.
    layers = arms[0] / "sglang/srt/layers"
    assert (arms[0] / "sglang/srt/server_args.py").is_symlink()
    assert (layers / "linear.py").resolve() == (installed.parent / "linear.py").resolve()
    cache = layers / "__pycache__"
    assert cache.is_dir() and not cache.is_symlink()
    assert not any(p.name.startswith("sampler.") for p in cache.iterdir())
    assert all(p.is_symlink() for p in cache.iterdir())


def test_a_new_module_is_overlaid(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    new = ws / "sglang/srt/extra_module.py"
    new.parent.mkdir(parents=True)
    new.write_text("VALUE = 1\n")
    overlay = build_overlay(ws, ["sglang/srt/extra_module.py"], tmp_path / "overlay")
    assert (
        overlay is not None
        and (overlay / "sglang/srt/extra_module.py").read_text() == "VALUE = 1\n"
    )


def test_paths_outside_sglang_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="inside the sglang package"):
        changed_modules(tmp_path, ["../etc/passwd"])
    with pytest.raises(UserError, match="missing from the workspace"):
        changed_modules(tmp_path, ["sglang/no/such_module.py"])


def test_served_view_covers_each_original_and_its_bytecode(tmp_path: Path) -> None:
    """What a confined server's file view binds: the changed module over its installed original,
    the original's bytecode caches hidden; unchanged and new modules need nothing."""
    ws = tmp_path / "ws"
    path = copy_module(ws, REL)
    path.write_text(path.read_text() + "\nINJECTED = True\n")
    new = ws / "sglang/srt/extra_module.py"
    new.write_text("VALUE = 1\n")
    files = [REL, "sglang/srt/extra_module.py"]
    overlay = build_overlay(ws, files, tmp_path / "overlay")
    assert overlay is not None
    replaced, caches = served_view(overlay)
    original = installed_package() / "srt/layers/sampler.py"
    assert replaced == {original: overlay / REL}
    assert replaced[original].read_text().endswith("INJECTED = True\n")
    assert caches, "the installed package has bytecode for the sampler"
    assert all(
        c.parent == original.parent / "__pycache__" and c.name.startswith("sampler.")
        for c in caches
    )
