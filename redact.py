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
the exact Python rules (once per distinct value). The gate is a superset of the rules (each
shape's RE2 `gate` matches wherever the shape could; lookarounds and word-boundary checks are
dropped, counted runs may be shortened, Python's Unicode `\s` is spelled out), so a string the
gate passes over is one `text()` would return unchanged. The shapes, their patterns and gates
are `secret_shapes.py`. A batch
with too little text to pay for the gate's compilation sends every string through `text()`.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from infra_agent.secret_shapes import (
    MIN_SECRET_VALUE_LEN,
    MIN_SHAPE_LEN,
    REDACTED,
    SECRET_KEY,
    gate_pattern,
    looks_secret,
    shape_spans,
)

if TYPE_CHECKING:  # pyarrow is imported where needed: store writers import this module too
    import pyarrow as pa

DEFAULT_SECRET_ENV_PATTERNS = ("*KEY*", "*TOKEN*", "*SECRET*", "*PASSWORD*", "*CREDENTIAL*")


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
        self.gate = gate_pattern(self._values)
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
        if len(text) < MIN_SHAPE_LEN:
            return text
        spans = shape_spans(text)
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
                if isinstance(v, str) and looks_secret(v) and SECRET_KEY.fullmatch(str(k))
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
