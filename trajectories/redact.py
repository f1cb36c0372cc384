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
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

REDACTED = "[REDACTED]"

DEFAULT_SECRET_ENV_PATTERNS = ("*KEY*", "*TOKEN*", "*SECRET*", "*PASSWORD*", "*CREDENTIAL*")

MIN_SECRET_VALUE_LEN = 6
"""Environment values shorter than this are not treated as secrets (they would match everywhere)."""

_VALUE = r"[^\s\"'`,;&<>()\[\]{}\\]+"
"""An assigned value: never includes quotes or backslashes, so redacting JSON text keeps it JSON."""
_Q = r"(?:\\?[\"'])?"
"""An optional quote, possibly JSON-escaped (\")."""
_SET = _Q + r"\s*[:=]\s*" + _Q + "(" + _VALUE + ")"
"""`: value`, `="value"`, `\": \"value` after a secret-naming word."""


@dataclass(frozen=True)
class _Shape:
    """One secret shape. Every pattern starts with a literal, so `re` scans for it at C speed;
    case-insensitive shapes are matched against the lower-cased text (same offsets)."""

    pattern: str
    lower: bool = False
    """Match against text.lower() (the literal is written in lower case)."""
    group: int = 0
    """The group whose span is redacted (0: the whole match)."""
    back: int = 0
    """Extend the redacted span this many characters to the left."""
    word_start: bool = False
    """The match must not continue a word on its left (`task-...` is not an `sk-...` key)."""
    value: bool = False
    """Redact only values that look like secrets (not short, not a plain number)."""


_SHAPES = [
    _Shape(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[^\"]*?(?:-----END [A-Z ]*PRIVATE KEY-----|(?=\\?\")|\Z)"),
    _Shape(r"bearer\s+([a-z0-9._~+/=-]{8,})", lower=True, group=1),
    _Shape(r"authorization" + _Q + r"\s*[:=]\s*" + _Q + r"([^\r\n\"\\]{4,})", lower=True, group=1),
    _Shape(r"api-key" + _Q + r"\s*[:=]\s*" + _Q + r"([^\r\n\"\\]{4,})", lower=True, group=1),
    _Shape(r"sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}", word_start=True),
    _Shape(r"gh[pousr]_[A-Za-z0-9]{20,}", word_start=True),
    _Shape(r"github_pat_[A-Za-z0-9_]{20,}", word_start=True),
    _Shape(r"hf_[A-Za-z0-9]{20,}", word_start=True),
    _Shape(r"xox[abposr]-[A-Za-z0-9-]{10,}", word_start=True),
    _Shape(r"AKIA[0-9A-Z]{16}(?![0-9A-Z])", word_start=True),
    _Shape(r"ASIA[0-9A-Z]{16}(?![0-9A-Z])", word_start=True),
    _Shape(r"AIza[0-9A-Za-z_-]{30,}", word_start=True),
    _Shape(r"\.(?<=[0-9a-f]{32}\.)[A-Za-z0-9]{16}(?![A-Za-z0-9])", back=32),  # Z.ai: <32 hex>.<16>
    _Shape(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", word_start=True),  # JWT
    _Shape(r"://[^\s:/@\"'\\]+:([^\s@/\"'\\]+)@", group=1),  # scheme://user:password@host
    # `api_key=...`, `"db_password": "..."`, `token: ...`: the value only.
    *(
        _Shape(word + r"s?" + _SET, lower=True, group=1, value=True)
        for word in ("api_key", "api-key", "apikey", "access_key", "access-key", "secret", "token",
                     "password", "passwd", "credential")
    ),
]  # fmt: skip
_COMPILED = [(re.compile(shape.pattern), shape) for shape in _SHAPES]
_MIN_SHAPE_LEN = 8
"""No shape matches a string shorter than this."""
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


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _shape_spans(text: str) -> list[tuple[int, int]]:
    """Spans of `text` to redact, sorted and merged."""
    low = text.lower()
    if len(low) != len(text):  # a few Unicode letters change length when lowered
        low = "".join(c.lower() if len(c.lower()) == 1 else c for c in text)
    spans: list[tuple[int, int]] = []
    for pattern, shape in _COMPILED:
        source = low if shape.lower else text
        for m in pattern.finditer(source):
            if shape.word_start and m.start() > 0 and _is_word(source[m.start() - 1]):
                continue
            start, end = m.span(shape.group)
            if shape.value and not _looks_secret(text[start:end]):
                continue
            spans.append((max(0, start - shape.back), end))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


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
        if len(text) < MIN_SECRET_VALUE_LEN:
            return text
        for value in self._values:
            if value in text:
                text = text.replace(value, REDACTED)
        if len(text) < _MIN_SHAPE_LEN:
            return text
        spans = _shape_spans(text)
        if not spans:
            return text
        parts, last = [], 0
        for start, end in spans:
            parts += [text[last:start], REDACTED]
            last = end
        parts.append(text[last:])
        return "".join(parts)

    def tree(self, value: Any) -> Any:
        """A copy of a JSON-like value (dicts, lists, strings, numbers) with every string redacted,
        including the value of a key naming a secret (`"db_password": "..."`)."""
        try:
            return json.loads(self.json(value))
        except ValueError:  # a redaction broke the JSON (not expected): be slow but sure
            return self._walk(value)

    def json(self, value: Any) -> str:
        """`value` serialized as JSON and redacted in one pass per shape over the whole document
        (C speed, no Python call per string). The shapes never remove quotes or backslashes, so
        the result is JSON; callers that must be certain parse it (see `tree`)."""
        return self.text(json.dumps(value, ensure_ascii=False))

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                k: REDACTED
                if isinstance(v, str) and _looks_secret(v) and _SECRET_KEY.fullmatch(str(k))
                else self._walk(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self._walk(v) for v in value]
        return value


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


M = TypeVar("M", bound=BaseModel)


def redact_record(record: M, redactor: Redactor | None = None) -> M:
    """A copy of a typed record (an ExperimentRecord with its log tail, a DecisionRecord with its
    comment, a StepRecord) with every string redacted, for writers to call before storing it.
    Not for PatchRecord: its id is the hash of the content it would change."""
    r = redactor or default_redactor()
    return type(record).model_validate_json(r.json(record.model_dump(mode="json")))
