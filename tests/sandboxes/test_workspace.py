"""`sweep_stale`: a sandbox folder outlives its owner only until the next sandbox is made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infra_agent.sandboxes.workspace import PREFIX, sweep_stale


def test_folders_of_dead_and_zombie_owners_are_removed_live_ones_kept(tmp_path: Path) -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits, not yet reaped
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        pass
    folders = {
        who: tmp_path / f"{PREFIX}{pid}-x{who}"
        for who, pid in {"dead": exited.pid, "zombie": zombie.pid, "live": os.getpid()}.items()
    }
    for folder in folders.values():
        (folder / "ws").mkdir(parents=True)
    unrelated = tmp_path / "someone-else-123-"
    unrelated.mkdir()
    try:
        assert sweep_stale(tmp_path) == 2
    finally:
        zombie.wait()
    assert {who for who, f in folders.items() if f.exists()} == {"live"} and unrelated.exists()
