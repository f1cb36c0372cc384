"""Atomic dataset writers: JSONL and Parquet, streamed in batches into a temporary file beside the
target and renamed over it only when everything was validated and written. An error or Ctrl-C
leaves no partial output and no temporary file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from infra_agent.trajectories.formats import ARROW_SCHEMAS, JSON_TEXT_COLUMNS, ExportFormat


@contextmanager
def atomic_file(path: Path) -> Iterator[IO[bytes]]:
    """A binary file that appears at `path` (replacing it) only if the block finishes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def jsonl_lines(rows: list[dict[str, Any]]) -> bytes:
    """Rows as JSON lines (UTF-8, keys in schema order)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def arrow_table(fmt: ExportFormat, rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as a table of the format's fixed Arrow schema, built column by column. Fields listed
    in JSON_TEXT_COLUMNS become `<field>_json` text columns. Raises pa.ArrowInvalid/TypeError when
    a value does not fit its column's type."""
    schema = ARROW_SCHEMAS[fmt]
    as_text = JSON_TEXT_COLUMNS[fmt]
    arrays = []
    for field in schema:
        name = field.name
        source = name[: -len("_json")] if name.endswith("_json") else None
        if source in as_text:
            column: list[Any] = [
                json.dumps(r[source], ensure_ascii=False, sort_keys=True) for r in rows
            ]
        else:
            column = [r.get(name) for r in rows]
        arrays.append(pa.array(column, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


class ParquetSink:
    """Streams tables of one schema into an open binary file (zstd, row groups per batch)."""

    def __init__(self, f: IO[bytes], schema: pa.Schema) -> None:
        self._writer = pq.ParquetWriter(f, schema, compression="zstd")

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()
