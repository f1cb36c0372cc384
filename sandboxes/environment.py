"""The environment candidate code sees: an allow-list of harmless variables, never a secret.

Everything not on the allow-list is dropped (proxies, cloud credentials, CI tokens, the coding
client's variables); on top of that, any variable whose name matches one of the secret globs is
dropped even if allow-listed. `HOME` points at the workspace copy and `TMPDIR` at a private /tmp.
The caller's `SandboxSpec.env` is added last: it is explicit, so it is trusted.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

from infra_agent.config import SandboxSettings

ALLOWED_NAMES = frozenset(
    {
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TORCH_NUM_THREADS",
    }
)
"""Inherited from the parent when present. `LC_*` variables are allowed too."""

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


def default_secret_patterns() -> list[str]:
    """The secret globs of the default configuration (`sandbox.secret_env_patterns`)."""
    return list(SandboxSettings().secret_env_patterns)


def is_secret(name: str, patterns: Iterable[str]) -> bool:
    """True if `name` matches one of the globs (case-insensitive)."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern.upper()) for pattern in patterns)


def scrubbed_environment(
    parent: Mapping[str, str],
    *,
    home: str,
    tmpdir: str = "/tmp",
    python_bin: str | None = None,
    secret_patterns: Iterable[str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment for a sandboxed command, built from `parent` (usually `os.environ`).

    `python_bin` (a folder) is put first on PATH so `python` is the project's interpreter.
    """
    patterns = list(secret_patterns) if secret_patterns is not None else default_secret_patterns()
    env: dict[str, str] = {}
    for name, value in parent.items():
        allowed = name in ALLOWED_NAMES or name.startswith("LC_")
        if allowed and not is_secret(name, patterns):
            env[name] = value
    env["PATH"] = f"{python_bin}:{SAFE_PATH}" if python_bin else SAFE_PATH
    env["HOME"] = home
    env["TMPDIR"] = tmpdir
    # the sandbox uid has no passwd entry; getpass.getuser() (torch's caches) reads these first
    env["USER"] = env["LOGNAME"] = "sandbox"
    env.setdefault("LANG", "C.UTF-8")
    env.update(extra or {})
    return env
