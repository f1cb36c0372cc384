r"""What a secret looks like, for `redact.py`: the shapes of provider keys, authorization headers,
JWTs, PEM private keys, credentials in URLs and `api_key=...` assignments, each an exact Python
pattern (`shape_spans`: the spans of a text to redact) and an RE2 `gate` that matches wherever
the pattern could (a superset: lookarounds and word-boundary checks dropped, counted runs may be
shortened, Python's Unicode `\s` spelled out), which `gate_pattern` joins with the known secret
values into the one pattern Arrow scans a table's strings with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REDACTED = "[REDACTED]"
"""What each secret becomes."""
MIN_SECRET_VALUE_LEN = 6
"""Environment values shorter than this are not treated as secrets (they would match everywhere)."""

_VALUE = r"[^\s\"'`,;&<>()\[\]{}\\]+"
"""An assigned value: never includes quotes or backslashes, so redacting JSON text keeps it JSON."""
_Q = r"(?:\\?[\"'])?"
"""An optional quote, possibly JSON-escaped (\")."""
_SET = _Q + r"\s*[:=]\s*" + _Q + "(" + _VALUE + ")"
"""`: value`, `="value"`, `\": \"value` after a secret-naming word."""
RE2_SPACE = (
    r"\t-\r\x1c-\x20\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}"
)
r"""The characters Python's `\s` matches in str patterns, as an RE2 class body (RE2's `\s` is ASCII)."""
_RE2_Q = r"(?:\\?[\"'])?"
RE2_SET = (
    _RE2_Q + f"[{RE2_SPACE}]*[:=][{RE2_SPACE}]*" + _RE2_Q
    + f"[^{RE2_SPACE}\"'`,;&<>()\\[\\]{{}}\\\\]{{6}}"
)  # fmt: skip
"""`_SET` with at least MIN_SECRET_VALUE_LEN (6) value characters (shorter values are never
redacted)."""


@dataclass(frozen=True)
class Shape:
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


SHAPES = [
    Shape(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[^\"]*?(?:-----END [A-Z ]*PRIVATE KEY-----|(?=\\?\")|\Z)", gate="-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    Shape(r"bearer\s+([a-z0-9._~+/=-]{8,})", lower=True, group=1, gate="bearer"),
    Shape(r"authorization" + _Q + r"\s*[:=]\s*" + _Q + r"([^\r\n\"\\]{4,})", lower=True, group=1, gate="authorization"),
    Shape(r"api-key" + _Q + r"\s*[:=]\s*" + _Q + r"([^\r\n\"\\]{4,})", lower=True, group=1, gate="api-key"),
    Shape(r"sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}", word_start=True, gate="sk-[A-Za-z0-9_-]{16}"),
    Shape(r"gh[pousr]_[A-Za-z0-9]{20,}", word_start=True, gate="gh[pousr]_[A-Za-z0-9]{20}"),
    Shape(r"github_pat_[A-Za-z0-9_]{20,}", word_start=True, gate="github_pat_[A-Za-z0-9_]{20}"),
    Shape(r"hf_[A-Za-z0-9]{20,}", word_start=True, gate="hf_[A-Za-z0-9]{20}"),
    Shape(r"xox[abposr]-[A-Za-z0-9-]{10,}", word_start=True, gate="xox[abposr]-[A-Za-z0-9-]{10}"),
    Shape(r"AKIA[0-9A-Z]{16}(?![0-9A-Z])", word_start=True, gate="AKIA[0-9A-Z]{16}"),
    Shape(r"ASIA[0-9A-Z]{16}(?![0-9A-Z])", word_start=True, gate="ASIA[0-9A-Z]{16}"),
    Shape(r"AIza[0-9A-Za-z_-]{30,}", word_start=True, gate="AIza[0-9A-Za-z_-]{30}"),
    Shape(r"\.(?<=[0-9a-f]{32}\.)[A-Za-z0-9]{16}(?![A-Za-z0-9])", back=32, gate=r"[0-9a-f]{4}\.[A-Za-z0-9]{16}"),  # Z.ai: <32 hex>.<16> (gate: 4 hex; counting 32 made the whole gate up to 40% slower)
    Shape(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", word_start=True, gate="eyJ[A-Za-z0-9_-]{8}"),  # JWT
    Shape(r"://[^\s:/@\"'\\]+:([^\s@/\"'\\]+)@", group=1, gate=f"://[^{RE2_SPACE}:/@\"'\\\\]+:[^{RE2_SPACE}@/\"'\\\\]+@"),  # scheme://user:password@host
    # `api_key=...`, `"db_password": "..."`, `token: ...`: the value only.
    *(
        Shape(word + r"s?" + _SET, lower=True, group=1, value=True, gate=word + "s?" + RE2_SET)
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


COMPILED = [(re.compile(shape.pattern), _lead(shape.pattern), shape) for shape in SHAPES]
MIN_SHAPE_LEN = 8
"""No shape matches a string shorter than this."""
# A dict key that names a secret (its string value is redacted): `api_key`, `auth_token`, ...
SECRET_KEY = re.compile(
    r"(?i)(?:[a-z0-9_.-]*[_.-])?(?:api[_-]?key|access[_-]?key|secret(?:[_-]?key)?|token|"
    r"auth[_-]?token|password|passwd|credentials?|authorization)"
)
_NUMBER = re.compile(r"[0-9.eE+-]+")


def looks_secret(value: str) -> bool:
    """A value worth redacting after a secret-named key: not tiny, not a plain number."""
    if len(value) < MIN_SECRET_VALUE_LEN or value.startswith(REDACTED[:-1]):
        return False
    return not (_NUMBER.fullmatch(value) and len(value) < 12)


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def shape_spans(text: str) -> list[tuple[int, int]]:
    """Spans of `text` to redact, sorted and merged."""
    low = text.lower()
    if len(low) != len(text):  # a few Unicode letters change length when lowered
        low = "".join(c.lower() if len(c.lower()) == 1 else c for c in text)
    spans: list[tuple[int, int]] = []
    for pattern, lead, shape in COMPILED:
        source = low if shape.lower else text
        if lead not in source:
            continue
        for m in pattern.finditer(source):
            if shape.word_start and m.start() > 0 and _is_word(source[m.start() - 1]):
                continue
            start, end = m.span(shape.group)
            if shape.value and not looks_secret(text[start:end]):
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


def re2_literal(text: str) -> str:
    """`text` as an RE2 pattern matching exactly it (every character escaped by code point)."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}" for c in text)


def gate_pattern(values: list[str]) -> str:
    """The gate: each known value as a literal, then each shape's `gate`; the value-naming words
    share one `RE2_SET` tail (the same language as one alternative per word, compiled in a
    third of the time: Arrow compiles the pattern on every call)."""
    words = [s.gate.removesuffix("s?" + RE2_SET) for s in SHAPES if s.value]
    shapes = [f"(?i:{s.gate})" if s.lower else f"(?:{s.gate})" for s in SHAPES if not s.value]
    valued = f"(?i:(?:{'|'.join(words)})s?{RE2_SET})"
    return "|".join([*map(re2_literal, values), *shapes, valued])
