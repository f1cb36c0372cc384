"""The SGLang environment: a separate virtual environment the project creates and caches.

SGLang (about 11 GB with its pinned torch and CUDA libraries) never goes into infra-agent's own
install: infra-agent drives it through its command line and HTTP API, as a real deployment does.

    ensure_sglang_env() -> Path      # the venv folder; created on first use (~4.5 min, 11 GB)
    python -m infra_agent.serving.env --ensure     # the same, for `make test` / CI, idempotent

The location is `$INFRA_AGENT_CACHE/sglang-<version>-venv` (default `~/.cache/infra-agent`). It
is deliberately not under `$INFRA_AGENT_HOME` (the run store's folder, which tests point at a
fresh temporary folder): an 11 GB environment is a machine-wide cache. A venv is complete only once the marker file is written after a
successful install, so an interrupted install is redone rather than used half-built. One
process installs at a time (an flock beside the venv): another caller, a test starting a server
while `make setup` installs, waits for that install instead of removing the half-built folder
under it.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from infra_agent.errors import UserError

SGLANG_VERSION = "0.5.23"
COMPLETE_MARKER = ".infra-agent-complete"
INSTALL_TIMEOUT_S = 3600.0


def home() -> Path:
    """infra-agent's machine-wide cache folder: `$INFRA_AGENT_CACHE` or `~/.cache/infra-agent`."""
    return Path(os.environ.get("INFRA_AGENT_CACHE") or Path.home() / ".cache" / "infra-agent")


def sglang_env_path(version: str = SGLANG_VERSION) -> Path:
    return home() / f"sglang-{version}-venv"


def env_python(env: Path) -> Path:
    return env / "bin" / "python"


def is_ready(env: Path) -> bool:
    """True when the venv finished installing (marker present) and its python exists."""
    return (env / COMPLETE_MARKER).is_file() and env_python(env).is_file()


def find_sglang_env(version: str = SGLANG_VERSION) -> Path | None:
    """The cached environment if it is complete, else None (never installs)."""
    env = sglang_env_path(version)
    return env if is_ready(env) else None


def ensure_sglang_env(version: str = SGLANG_VERSION, *, quiet: bool = False) -> Path:
    """Return the SGLang venv, creating it (python -m venv + pip install sglang==version) if needed.

    Raises UserError with the pip output's tail when the install fails.
    """
    env = sglang_env_path(version)
    if is_ready(env):
        return env
    say = (lambda msg: None) if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    env.parent.mkdir(parents=True, exist_ok=True)
    with open(env.parent / f".{env.name}.lock", "w") as lock:  # released if this process dies
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process installing {env}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if is_ready(env):
            return env
        _install(env, version, say, quiet)
    return env


def _install(env: Path, version: str, say: Callable[[str], None], quiet: bool) -> None:
    """Create the venv from scratch (the caller holds the install lock)."""
    if env.exists():
        say(f"removing incomplete SGLang environment {env}")
        shutil.rmtree(env)
    say(f"creating SGLang {version} environment in {env} (first use: several minutes, ~11 GB)")
    _run([sys.executable, "-m", "venv", str(env)], quiet)
    say(f"pip install sglang=={version}")
    _run(
        [
            str(env_python(env)),
            "-m",
            "pip",
            "install",
            "--progress-bar",
            "off",
            f"sglang=={version}",
        ],
        quiet,
    )
    (env / COMPLETE_MARKER).write_text(version + "\n")
    say(f"SGLang environment ready: {env}")


def _run(argv: list[str], quiet: bool) -> None:
    """Run an install step, streaming its 'Collecting/Installing' lines as progress."""
    lines: list[str] = []
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            del lines[:-30]
            if not quiet and line.startswith(("Collecting", "Installing", "Successfully")):
                print("  " + line.rstrip()[:120], file=sys.stderr, flush=True)
        code = proc.wait(timeout=INSTALL_TIMEOUT_S)
    if code != 0:
        tail = "\n".join(lines[-15:])
        raise UserError(f"{' '.join(argv[:4])} failed (exit {code}):\n{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ensure", action="store_true", help="create the environment if missing")
    parser.add_argument("--version", default=SGLANG_VERSION)
    args = parser.parse_args(argv)
    if args.ensure:
        try:
            print(ensure_sglang_env(args.version))
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    env = find_sglang_env(args.version)
    print(env if env else f"not installed (would be {sglang_env_path(args.version)})")
    return 0 if env else 1


if __name__ == "__main__":
    sys.exit(main())
