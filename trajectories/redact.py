"""Secret redaction for everything that leaves the process or lands in the run store.

Two kinds of secrets are removed:

1. **Known values**: the values of environment variables whose *names* match the configured
   globs (`settings.sandbox.secret_env_patterns`, e.g. `*KEY*`, `*TOKEN*`), plus any value passed
   explicitly. A value is replaced wherever it appears, also in its JSON-escaped form.
2. **Shapes**: provider API keys (`sk-...`, `ghp_...`, `hf_...`, `AKIA...`, Slack and Z.ai
   keys), bearer/basic `Authorization` headers, JWTs, PEM private keys, credentials in URLs, and
   the value in `api_key=...` / `"token": "..."` style assignments.

Each match becomes `[REDACTED]`. Store writers call `redact_text()` before writing; the exporters
redact every string of every record with a `Redactor` built from the settings.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[REDACTED]"

DEFAULT_SECRET_ENV_PATTERNS = ("*KEY*", "*TOKEN*", "*SECRET*", "*PASSWORD*", "*CREDENTIAL*")

MIN_SECRET_VALUE_LEN = 6
"""Environment values shorter than this are not treated as secrets (they would match everywhere)."""

# (pattern, group to replace: 0 = the whole match). Values exclude quotes and whitespace so that
# redacting JSON text keeps it valid JSON.
_VALUE = r"[^\s\"'`,;&<>)\]}]+"
_SHAPES: list[tuple[str, int]] = [
    (r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", 0),
    (r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{8,})", 1),
    (
        r"(?i)\b(?:authorization|proxy-authorization|x-api-key|api-key)\s*[:=]\s*\"?([^\r\n\"]{4,})",
        1,
    ),
    (r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}", 0),
    (r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}", 0),
    (r"\bgithub_pat_[A-Za-z0-9_]{20,}", 0),
    (r"\bhf_[A-Za-z0-9]{20,}", 0),
    (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", 0),
    (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", 0),
    (r"\bAIza[0-9A-Za-z_-]{30,}", 0),
    (r"\b[0-9a-f]{32}\.[A-Za-z0-9]{16}\b", 0),  # Z.ai (GLM) API keys: <32 hex>.<16 chars>
    (r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", 0),  # JWT
    (r"(?i)\b[a-z][a-z0-9+.-]*://[^\s:/@\"']+:([^\s@/\"']+)@", 1),  # scheme://user:pass@host
    (
        r"(?i)[\"']?\b[A-Za-z0-9_.-]*(?:api[_-]?key|access[_-]?key|secret|token|password|passwd|"
        r"credential)s?[\"']?\s*[:=]\s*[\"']?(" + _VALUE + ")",
        1,
    ),
]


def _compile_shapes() -> list[tuple[re.Pattern[str], int]]:
    return [(re.compile(p), g) for p, g in _SHAPES]


_COMPILED = _compile_shapes()
_ASSIGNMENT = _COMPILED[-1][0]
# A dict key that names a secret (its string value is redacted): `api_key`, `auth_token`, ...
_SECRET_KEY = re.compile(
    r"(?i)(?:[a-z0-9_.-]*[_.-])?(?:api[_-]?key|access[_-]?key|secret(?:[_-]?key)?|token|"
    r"auth[_-]?token|password|passwd|credentials?|authorization)"
)
_NUMBER = re.compile(r"[0-9.eE+-]+")


def _looks_secret(value: str) -> bool:
    """A value worth redacting after a secret-named key: not tiny, not a plain number."""
    if len(value) < MIN_SECRET_VALUE_LEN or value.startswith(REDACTED[:-1]):
        return False
    return not (_NUMBER.fullmatch(value) and len(value) < 12)


# One pass that says whether any shape can match: most strings have no secret at all.
_ANY_SHAPE = re.compile(
    r"(?i)PRIVATE KEY|bearer|basic|token|authorization|api-key|sk-|gh[pousr]_|github_pat_|hf_|xox|"
    r"AKIA|ASIA|AIza|eyJ|://|key|secret|password|passwd|credential|[0-9a-f]{32}\."
)


def secret_env_values(
    patterns: Iterable[str] = DEFAULT_SECRET_ENV_PATTERNS, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Values of environment variables whose names match any glob (case-insensitive)."""
    env = os.environ if environ is None else environ
    globs = [p.upper() for p in patterns]
    values = {
        value
        for name, value in env.items()
        if len(value) >= MIN_SECRET_VALUE_LEN
        and any(fnmatch.fnmatchcase(name.upper(), g) for g in globs)
    }
    return sorted(values, key=lambda v: (-len(v), v))


class Redactor:
    """Replaces secrets in text. Build once (`from_environment`), call many times."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        variants: set[str] = set()
        for secret in secrets:
            if len(secret) < MIN_SECRET_VALUE_LEN:
                continue
            variants.add(secret)
            variants.add(json.dumps(secret)[1:-1])  # as it appears inside JSON text
            variants.add(json.dumps(secret, ensure_ascii=False)[1:-1])
        # Longest first so a secret containing another is removed whole.
        self._values = sorted(variants, key=lambda v: (-len(v), v))

    @classmethod
    def from_environment(
        cls,
        patterns: Iterable[str] = DEFAULT_SECRET_ENV_PATTERNS,
        environ: Mapping[str, str] | None = None,
        extra: Iterable[str] = (),
    ) -> Redactor:
        """Redact the values of matching environment variables, `extra` values and all shapes."""
        return cls([*secret_env_values(patterns, environ), *extra])

    def text(self, text: str) -> str:
        """`text` with every secret replaced by `[REDACTED]`."""
        if not text:
            return text
        for value in self._values:
            if value in text:
                text = text.replace(value, REDACTED)
        if _ANY_SHAPE.search(text) is None:
            return text
        for pattern, group in _COMPILED:
            text = _sub(pattern, group, text)
        return text

    def tree(self, value: Any) -> Any:
        """A copy of a JSON-like value (dicts, lists, strings, numbers) with every string redacted."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for k, v in value.items():
                if isinstance(k, str):
                    if isinstance(v, str) and _SECRET_KEY.fullmatch(k) and _looks_secret(v):
                        v = REDACTED
                    k = self.text(k)
                out[k] = self.tree(v)
            return out
        if isinstance(value, list | tuple):
            return [self.tree(v) for v in value]
        return value


def _sub(pattern: re.Pattern[str], group: int, text: str) -> str:
    if group == 0:
        return pattern.sub(REDACTED, text)

    def keep_prefix(match: re.Match[str]) -> str:
        value = match.group(group)
        if value.startswith(REDACTED[:-1]) or (pattern is _ASSIGNMENT and not _looks_secret(value)):
            return match.group(0)
        start, end = match.span(group)
        whole_start = match.start(0)
        whole = match.group(0)
        return whole[: start - whole_start] + REDACTED + whole[end - whole_start :]

    return pattern.sub(keep_prefix, text)


_default: tuple[tuple[str, ...], Redactor] | None = None


def default_redactor() -> Redactor:
    """A redactor for the default secret-env globs over the current environment (cached until the
    matching values change)."""
    global _default
    values = tuple(secret_env_values())
    if _default is None or _default[0] != values:
        _default = (values, Redactor(values))
    return _default[1]


def redact_text(text: str, redactor: Redactor | None = None) -> str:
    """`text` with API keys, tokens, bearer headers and secret env values replaced by `[REDACTED]`.

    Store writers call this before writing model messages, tool results and errors. Without a
    `redactor`, the default secret-env globs over `os.environ` are used.
    """
    return (redactor or default_redactor()).text(text)
