r"""Secret redaction for everything that leaves the process or lands in the run store.

Two kinds of secrets are removed:

1. **Known values**: the values of environment variables whose *names* match the configured
   globs (`settings.sandbox.secret_env_patterns`, e.g. `*KEY*`, `*TOKEN*`), plus any value passed
   explicitly. A value is replaced wherever it appears, also in its JSON-escaped form.
2. **Shapes**: provider API keys (`sk-...`, `ghp_...`, `hf_...`, `AKIA...`, Slack and Z.ai
   keys), bearer/basic `Authorization` headers, JWTs, PEM private keys, credentials in URLs, and
   the value in `api_key=...` / `"token": "..."` style assignments.

Each match becomes `[REDACTED]`. Store writers call `redact_text()` before writing; exports redact
every row they write with a `Redactor` built from the settings.

Exports redact whole tables (`Redactor.table`): one RE2 pass in Arrow's C++ kernel (`gate`) over
the batch's distinct strings picks the few that could hold a secret, and only those go through
the exact Python rules (once per distinct value). The gate is a superset
of the rules (each shape's RE2 `gate` matches wherever the shape could; lookarounds and
word-boundary checks are dropped, counted runs may be shortened, Python's Unicode `\s` is
spelled out), so a string the gate passes over is one `text()` would return unchanged. A batch
with too little text to pay for the gate's compilation sends every string through `text()`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pyarrow is imported where needed: store writers import this module too
    import pyarrow as pa

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
_RE2_SPACE = (
    r"\t-\r\x1c-\x20\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}"
)
r"""The characters Python's `\s` matches in str patterns, as an RE2 class body (RE2's `\s` is ASCII)."""
_RE2_Q = r"(?:\\?[\"'])?"
_RE2_SET = (
    _RE2_Q + f"[{_RE2_SPACE}]*[:=][{_RE2_SPACE}]*" + _RE2_Q
    + f"[^{_RE2_SPACE}\"'`,;&<>()\\[\\]{{}}\\\\]{{6}}"
)  # fmt: skip
"""`_SET` with at least MIN_SECRET_VALUE_LEN (6) value characters (shorter values are never
redacted)."""


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
    gate: str = ""
    """RE2 pattern matching wherever `pattern` could match (a superset, see the module doc);
    matched case-insensitively when `lower`."""


_SHAPES = [
    _Shape(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[^\"]*?(?:-----END [A-Z ]*PRIVATE KEY-----|(?=\\?\")|\Z)", gate="-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    _Shape(r"bearer\s+([a-z0-9._~+/=-]{8,})", lower=True, group=1, gate="bearer"),
    _Shape(r"authorization" + _Q + r"\s*[:=]\s*" + _Q + r"([^\r\n\"\\]{4,})", lower=True, group=1, gate="authorization"),
    _Shape(r"api-key" + _Q + r"\s*[:=]\s*" + _Q + r"([^\r\n\"\\]{4,})", lower=True, group=1, gate="api-key"),
    _Shape(r"sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}", word_start=True, gate="sk-[A-Za-z0-9_-]{16}"),
    _Shape(r"gh[pousr]_[A-Za-z0-9]{20,}", word_start=True, gate="gh[pousr]_[A-Za-z0-9]{20}"),
    _Shape(r"github_pat_[A-Za-z0-9_]{20,}", word_start=True, gate="github_pat_[A-Za-z0-9_]{20}"),
    _Shape(r"hf_[A-Za-z0-9]{20,}", word_start=True, gate="hf_[A-Za-z0-9]{20}"),
    _Shape(r"xox[abposr]-[A-Za-z0-9-]{10,}", word_start=True, gate="xox[abposr]-[A-Za-z0-9-]{10}"),
    _Shape(r"AKIA[0-9A-Z]{16}(?![0-9A-Z])", word_start=True, gate="AKIA[0-9A-Z]{16}"),
    _Shape(r"ASIA[0-9A-Z]{16}(?![0-9A-Z])", word_start=True, gate="ASIA[0-9A-Z]{16}"),
    _Shape(r"AIza[0-9A-Za-z_-]{30,}", word_start=True, gate="AIza[0-9A-Za-z_-]{30}"),
    _Shape(r"\.(?<=[0-9a-f]{32}\.)[A-Za-z0-9]{16}(?![A-Za-z0-9])", back=32, gate=r"[0-9a-f]{4}\.[A-Za-z0-9]{16}"),  # Z.ai: <32 hex>.<16> (gate: 4 hex; counting 32 made the whole gate up to 40% slower)
    _Shape(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", word_start=True, gate="eyJ[A-Za-z0-9_-]{8}"),  # JWT
    _Shape(r"://[^\s:/@\"'\\]+:([^\s@/\"'\\]+)@", group=1, gate=f"://[^{_RE2_SPACE}:/@\"'\\\\]+:[^{_RE2_SPACE}@/\"'\\\\]+@"),  # scheme://user:password@host
    # `api_key=...`, `"db_password": "..."`, `token: ...`: the value only.
    *(
        _Shape(word + r"s?" + _SET, lower=True, group=1, value=True, gate=word + "s?" + _RE2_SET)
        for word in ("api_key", "api-key", "apikey", "access_key", "access-key", "secret", "token",
                     "password", "passwd", "credential")
    ),
]  # fmt: skip


def _lead(pattern: str) -> str:
    """The literal characters every match of `pattern` starts with (a pattern's leading plain
    characters, less the last one when a quantifier follows it): a text without them cannot
    match, which `in` tells faster than a regex search."""
    plain = re.findall(r"^(?:[\w :/-]|\\\.)*", pattern)[0]
    lead = plain.replace("\\.", ".")
    return lead[:-1] if pattern[len(plain) : len(plain) + 1] in ("?", "*", "+", "{") else lead


_COMPILED = [(re.compile(shape.pattern), _lead(shape.pattern), shape) for shape in _SHAPES]
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
    for pattern, lead, shape in _COMPILED:
        source = low if shape.lower else text
        if lead not in source:
            continue
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
        self.gate = _gate_pattern(self._values)
        """RE2 pattern that matches every string `text()` would change (and a few more)."""

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

    def table(self, table: pa.Table) -> pa.Table:
        """`table` with every string in it (in lists, structs and JSON columns too) passed through
        `text()`; the same object when no string changed. Each distinct string goes through the
        gate once (a system prompt or tool list repeated in every row is scanned once). A JSON
        value stays JSON: should a redaction break it, its parsed value is redacted instead."""
        import pyarrow as pa
        import pyarrow.compute as pc

        leaves: list[pa.Array] = []
        for column in table.columns:
            _map_strings(column, lambda leaf, _: leaves.append(leaf))
        if not leaves:
            return table
        distinct = pc.unique(pa.chunked_array([leaf.cast(pa.large_string()) for leaf in leaves]))
        changed: dict[str, str] = {}
        for value in distinct.take(pa.array(self._candidates(distinct), pa.int64())).to_pylist():
            if (redacted := self.text(value)) != value:
                changed[value] = redacted
        if not changed:
            return table
        secrets = pa.array(list(changed), pa.large_string())

        def fix(leaf: pa.Array, is_json: bool) -> pa.Array | None:
            mask = pc.is_in(leaf.cast(pa.large_string()), value_set=secrets)
            if not pc.any(mask).as_py():
                return None
            found = [(v, changed[v]) for v in leaf.filter(mask).to_pylist()]
            if is_json:
                found = [
                    (v, r if _is_json(r) else _dumps(self._walk(json.loads(v)))) for v, r in found
                ]
            return pc.replace_with_mask(leaf, mask, pa.array([r for _, r in found], leaf.type))

        fixed = [_map_strings(c, fix) for c in table.columns]
        columns = [f if f is not None else c for f, c in zip(fixed, table.columns, strict=True)]
        return pa.Table.from_arrays(columns, schema=table.schema)

    def _candidates(self, values: pa.Array) -> list[int]:
        """Indices of the strings that could hold a secret: those the gate matches, or every
        string when there is too little text to pay for a gate call (`_GATE_MIN_BYTES`)."""
        import pyarrow.compute as pc

        if len(values) == 0:
            return []
        if (pc.sum(pc.binary_length(values)).as_py() or 0) < _GATE_MIN_BYTES:
            return pc.indices_nonzero(values.is_valid()).to_pylist()  # type: ignore[no-any-return]
        mask = pc.fill_null(pc.match_substring_regex(values, self.gate), False)
        if not pc.any(mask).as_py():
            return []
        return pc.indices_nonzero(mask).to_pylist()  # type: ignore[no-any-return]

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


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _map_strings(values: Any, fix: Callable[[Any, bool], Any]) -> Any:
    """`values` (an Arrow array or chunked array) with each string array inside it (in lists,
    structs and JSON columns too, visited in a fixed order) replaced by `fix(array, is_json)`;
    None when `fix` returned None for all of them (nothing changed)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = values.type
    if isinstance(values, pa.ChunkedArray):
        fixed = [_map_strings(c, fix) for c in values.chunks]
        if all(f is None for f in fixed):
            return None
        return pa.chunked_array(
            [f if f is not None else c for f, c in zip(fixed, values.chunks, strict=True)], kind
        )
    if isinstance(kind, pa.JsonType):
        storage = fix(values.storage, True)
        return None if storage is None else pa.ExtensionArray.from_storage(kind, storage)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return fix(values, False)
    if pa.types.is_struct(kind):
        children = [values.field(i) for i in range(kind.num_fields)]
        fixed = [_map_strings(c, fix) for c in children]
        if all(f is None for f in fixed):
            return None
        return pa.StructArray.from_arrays(
            [f if f is not None else c for f, c in zip(fixed, children, strict=True)],
            fields=list(kind),
            mask=values.is_null() if values.null_count else None,
        )
    if pa.types.is_list(kind):
        offsets = values.offsets
        start, end = offsets[0].as_py(), offsets[-1].as_py()  # a slice's part of the child
        inner = _map_strings(values.values.slice(start, end - start), fix)
        if inner is None:
            return None
        if start or values.offset:  # from_arrays takes a mask only with offsets of its own
            offsets = pc.subtract(offsets, pa.scalar(start, offsets.type))
        nulls = values.is_null() if values.null_count else None
        return pa.ListArray.from_arrays(offsets, inner, type=kind, mask=nulls)
    return None


def _re2_literal(text: str) -> str:
    """`text` as an RE2 pattern matching exactly it (every character escaped by code point)."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}" for c in text)


def _gate_pattern(values: list[str]) -> str:
    """The gate: each known value as a literal, then each shape's `gate`; the value-naming words
    share one `_RE2_SET` tail (the same language as one alternative per word, compiled in a
    third of the time: Arrow compiles the pattern on every call)."""
    words = [s.gate.removesuffix("s?" + _RE2_SET) for s in _SHAPES if s.value]
    shapes = [f"(?i:{s.gate})" if s.lower else f"(?:{s.gate})" for s in _SHAPES if not s.value]
    valued = f"(?i:(?:{'|'.join(words)})s?{_RE2_SET})"
    return "|".join([*map(_re2_literal, values), *shapes, valued])


_GATE_MIN_BYTES = 16_384
"""Below this much text (UTF-8 bytes) a batch skips the gate and every string goes through
`text()`: Arrow compiles the gate on every call (about 1 ms, building its DFA as it scans),
while `text()` takes 20-50 us per KB."""

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
