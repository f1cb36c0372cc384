"""Rows as Arrow tables and back: the Parquet schema of a row model, its JSON-typed columns for
values whose shape varies between rows, and the reader of either export file.

    schema = arrow_schema(SftRow)
    table = to_table(rows, schema)      # the types checked against the row model
    read_rows(path)                     # a .jsonl or .parquet export, as the rows were written
"""

from __future__ import annotations

import functools
import json
import types
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel


def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    """The Parquet schema of a row model: its fields in order, typed after their annotations."""
    return pa.schema([pa.field(name, arrow_type(f.annotation)) for name, f in model.model_fields.items()])  # fmt: skip


def arrow_type(annotation: Any) -> pa.DataType:
    """str, enums, literals and datetimes (as ISO text) are strings; int, float, bool; lists; a
    model is a struct; a dict, `Any` or a union of several types is JSON."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return arrow_type(kinds[0]) if len(kinds) == 1 else pa.json_()
    if origin is Literal or annotation in (str, datetime):
        return pa.string()
    if origin is list:
        return pa.list_(arrow_type(args[0]))
    if isinstance(annotation, type):
        if issubclass(annotation, Enum):
            return pa.string()
        if issubclass(annotation, BaseModel):
            return pa.struct([pa.field(n, arrow_type(f.annotation)) for n, f in annotation.model_fields.items()])  # fmt: skip
        simple = {bool: pa.bool_(), int: pa.int64(), float: pa.float64()}
        if annotation in simple:
            return simple[annotation]
    return pa.json_()


def json_text(value: Any) -> str:
    """`value` as compact JSON text (orjson; the standard library for what orjson refuses, like an
    integer beyond 64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@functools.cache
def _has_json(kind: pa.DataType) -> bool:
    if isinstance(kind, pa.JsonType):
        return True
    if pa.types.is_list(kind):
        return _has_json(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_has_json(f.type) for f in kind)
    return False


def _storage(kind: pa.DataType) -> pa.DataType:
    """`kind` with JSON replaced by its storage (text), for building arrays from Python values."""
    if isinstance(kind, pa.JsonType):
        return pa.string()
    if pa.types.is_list(kind):
        return pa.list_(_storage(kind.value_type))
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _storage(f.type)) for f in kind])
    return kind


def _encoded(value: Any, kind: pa.DataType, cache: dict[int, Any]) -> Any:
    """`value` with each JSON-typed part as its JSON text (a list shared by many rows, like the
    tool specs, encoded once)."""
    if value is None or not _has_json(kind):
        return value
    if isinstance(kind, pa.JsonType):
        return json_text(value)
    if pa.types.is_list(kind):
        if id(value) not in cache:
            cache[id(value)] = (value, [_encoded(v, kind.value_type, cache) for v in value])
        return cache[id(value)][1]
    return {f.name: _encoded(value.get(f.name), f.type, cache) for f in kind}


def to_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows as a table of `schema` (a NaN becomes null, as in JSON). Raises pa.ArrowInvalid /
    TypeError when a value does not fit its column's type."""
    cache: dict[int, Any] = {}  # id -> (the value, kept alive so that its id stays its own; text)
    columns = []
    for f in schema:
        values = [row[f.name] for row in rows]
        if _has_json(f.type):
            values = [_encoded(v, f.type, cache) for v in values]
        columns.append(pa.array(values, type=_storage(f.type), from_pandas=True).cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _decoded(value: Any, kind: pa.DataType) -> Any:
    if value is None or not _has_json(kind):
        return value
    if isinstance(kind, pa.JsonType):
        return json.loads(value)
    if pa.types.is_list(kind):
        return [_decoded(v, kind.value_type) for v in value]
    return {f.name: _decoded(value[f.name], f.type) for f in kind}


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """A table's rows with its JSON columns decoded: the rows it was made of (`to_table`)."""
    rows = table.to_pylist()
    for f in table.schema:
        if _has_json(f.type):
            for row in rows:
                row[f.name] = _decoded(row[f.name], f.type)
    return rows


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an export file as they were written: JSON lines, or Parquet with its JSON
    columns decoded."""
    with path.open("rb") as f:
        parquet = f.read(4) == b"PAR1"
    if parquet:
        return table_rows(pq.read_table(path))
    return [json.loads(line) for line in path.read_text().splitlines()]
