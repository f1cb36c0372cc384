"""Batch redaction (`Redactor.table`): the same strings as `text()` one by one, through the gate
over distinct values or, for a small batch, through `text()` alone; JSON values stay JSON."""

from __future__ import annotations

import json
import random
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from infra_agent.redact import REDACTED, Redactor
from infra_agent.secret_shapes import COMPILED as _COMPILED
from infra_agent.secret_shapes import SHAPES as _SHAPES
from infra_agent.secret_shapes import re2_literal as _re2_literal

_SECRETS = [
    "Authorization: Bearer abcdefghijklmnop123",
    "key sk-proj-4f9Qm2LxZr7TbN1vW8yKc3Hd here",
    "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "aws AKIAIOSFODNN7EXAMPLE",
    "zai 0123456789abcdef0123456789abcdef.AbCdEfGhIjKlMnOp",
    "postgres://admin:s3cr3tpass@db:5432/x",
    '{"api_key": "my-api-key-value-1"}',
    '{\\"db_password\\": \\"hunter2hunter2\\"}',
    "TOKEN:\u00a0abcdefgh",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
    "got zq8-plain-looking-value-4471 back",
]
_LOOK_ALIKES = [  # the gate matches these, the rules leave them alone
    '"prompt_tokens": 1234567',
    "task-0123456789abcdefghij",
    "the token embeddings are cached per layer",
    "max_tokens: 4096",
]
_MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("calls", pa.list_(pa.struct([("id", pa.string()), ("arguments", pa.large_string())]))),
    ]
)
_SCHEMA = pa.schema(
    [
        ("messages", pa.list_(_MESSAGE)),
        ("tools_json", pa.string()),
        ("meta", pa.struct([("note", pa.string()), ("n", pa.int64())])),
        ("tags", pa.list_(pa.large_string())),
    ]
)


def _rows(n: int, filler: int, seed: int) -> list[dict[str, Any]]:
    """Rows like an rl export's: a system prompt repeated in every row, tool calls, nulls at
    every level, and a planted secret or look-alike in about one string in five."""
    rng = random.Random(seed)
    system = "You are an infra engineer. " * 20

    def text(i: int) -> str | None:
        roll = rng.random()
        if roll < 0.1:
            return None
        if roll < 0.2:
            return rng.choice(_SECRETS)
        if roll < 0.25:
            return rng.choice(_LOOK_ALIKES)
        return f"step {i}: speedup 1.{rng.randint(0, 9)}x " + "log line\n" * filler

    def message(i: int) -> dict[str, Any]:
        calls = [{"id": f"c{i}", "arguments": text(i)}] if rng.random() < 0.5 else None
        return {"role": "assistant", "content": text(i), "calls": calls}

    return [
        {
            "messages": None
            if i % 17 == 5
            else [{"role": "system", "content": system, "calls": None}]
            + [message(i) for _ in range(rng.randint(0, 4))],
            "tools_json": text(i),
            "meta": None if i % 11 == 3 else {"note": text(i), "n": i},
            "tags": [text(i) for _ in range(rng.randint(0, 2))],
        }
        for i in range(n)
    ]


def _one_by_one(value: Any, redactor: Redactor) -> Any:
    """The reference: `text()` of every string in a row, one at a time."""
    if isinstance(value, str):
        return redactor.text(value)
    if isinstance(value, list):
        return [_one_by_one(v, redactor) for v in value]
    if isinstance(value, dict):
        return {k: _one_by_one(v, redactor) for k, v in value.items()}
    return value


def _count_gate_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one on each gate (RE2) call."""
    calls: list[int] = []
    match = pc.match_substring_regex

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return match(*args, **kwargs)

    monkeypatch.setattr(pc, "match_substring_regex", counted)
    return calls


@pytest.mark.parametrize("filler", [0, 30], ids=["small batch: text() only", "gate"])
def test_table_equals_text_of_every_string(filler: int, monkeypatch: pytest.MonkeyPatch) -> None:
    redactor = Redactor(["zq8-plain-looking-value-4471"])
    rows = _rows(60, filler, seed=filler)
    whole = pa.Table.from_pylist(rows, schema=_SCHEMA)
    gate_calls = _count_gate_calls(monkeypatch)
    chunked = pa.concat_tables(
        [
            pa.Table.from_pylist(rows[:25], schema=_SCHEMA),
            pa.Table.from_pylist(rows[25:], schema=_SCHEMA),
        ]
    )
    sliced = whole.slice(7, 40)  # lists with nulls, sliced: offsets that do not start at 0
    for table in (whole, chunked, sliced):
        out = redactor.table(table)
        assert out.schema == table.schema
        assert out.to_pylist() == [_one_by_one(row, redactor) for row in table.to_pylist()]
        assert out.to_pylist() != table.to_pylist()  # secrets were planted and removed
    assert (len(gate_calls) > 0) == (filler > 0)  # both paths are taken
    flat = str(redactor.table(whole).to_pylist())
    assert "hunter2hunter2" not in flat and "AKIAIOSFODNN7EXAMPLE" not in flat and REDACTED in flat


def test_table_is_returned_as_is_when_no_string_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Look-alikes pass the gate but `text()` keeps them: nothing to rebuild."""
    redactor = Redactor()
    rows = [
        {"messages": [{"role": "tool", "content": f"{t} {i}" + " log\n" * 100, "calls": None}]}
        for i, t in enumerate(_LOOK_ALIKES * 10)
    ]
    table = pa.Table.from_pylist(rows, schema=pa.schema([_SCHEMA.field("messages")]))
    gate_calls = _count_gate_calls(monkeypatch)
    assert redactor.table(table) is table
    assert gate_calls == [1]
    small = table.slice(0, 1)
    assert redactor.table(small) is small


def test_json_values_stay_json() -> None:
    """Redaction inside a JSON column keeps each value JSON. A known secret ending in a backslash
    matches the JSON text of a string that holds no secret (`"abc\\"` escapes a quote): cut
    there, the text would not parse, so that value is redacted as parsed data instead."""
    redactor = Redactor(["xyzabc\\"])
    values = [
        {"api_key": "sk-proj-4f9Qm2LxZr7TbN1vW8yKc3Hd"},
        {"v": 'xyzabc"tail', "n": 1},
        [1, "ok"],
        None,
    ]
    storage = pa.array([None if v is None else json.dumps(v) for v in values], pa.string())
    assert redactor.text(storage[1].as_py()) != storage[1].as_py()  # the text alone breaks
    table = pa.table({"j": pa.ExtensionArray.from_storage(pa.json_(), storage)})
    out = redactor.table(table).column("j").to_pylist()
    assert [None if v is None else json.loads(v) for v in out] == [
        {"api_key": REDACTED},
        *values[1:],
    ]


def test_gate_is_the_alternation_of_the_shape_gates() -> None:
    """The gate shares one tail among the value-naming words (cheaper to compile): it must
    match exactly what one alternative per shape matches."""
    values = ["zq8-plain-looking-value-4471", 'v4lue"with\\quote']
    redactor = Redactor(values)
    per_shape = "|".join(
        [
            *map(_re2_literal, redactor._values),
            *(f"(?i:{s.gate})" if s.lower else f"(?:{s.gate})" for s in _SHAPES),
        ]
    )
    parts = [*_SECRETS, *_LOOK_ALIKES, "secret", "Passwd", "=", ": ", "'", '\\"', "s", "x" * 7]
    rng = random.Random(99)
    texts = ["".join(rng.choice(parts) for _ in range(rng.randint(1, 6))) for _ in range(5000)]
    array = pa.array(texts)
    factored = pc.match_substring_regex(array, redactor.gate)
    assert factored.equals(pc.match_substring_regex(array, per_shape))
    assert 500 < pc.sum(factored).as_py() < 5000  # the corpus tells the two apart if they differ


def test_each_shapes_lead_starts_every_match() -> None:
    """`text()` skips a shape whose lead is not in the text: each lead must be literal
    characters at the very start of the pattern (checked on Python's own parse of it)."""
    from re import _constants, _parser  # type: ignore[attr-defined]

    for pattern, lead, _shape in _COMPILED:
        assert lead, pattern.pattern
        items = list(_parser.parse(pattern.pattern))[: len(lead)]
        assert items == [(_constants.LITERAL, ord(c)) for c in lead], pattern.pattern
