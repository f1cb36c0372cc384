"""Atomic dataset writers: JSONL and Parquet, streamed in batches into a temporary file beside the
target and renamed over it only when everything was validated and written. An error or Ctrl-C
leaves no partial output and no temporary file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, get_args

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from infra_agent.trajectories.formats import FORMATS, ExportFormat


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


MESSAGE_COLUMNS: dict[ExportFormat, tuple[str, ...]] = {
    ExportFormat.OPENAI_SFT: ("messages",),
    ExportFormat.RL: ("prompt", "completion"),
    ExportFormat.ATIF: (),
}
_ROLES = pa.array(["system", "user", "assistant", "tool"])


def check_table(fmt: ExportFormat, table: pa.Table) -> None:
    """What the typed Arrow schema cannot say, checked column-wise (no Python loop over rows):
    required columns and fields are not null, message roles are chat roles, tool calls are
    functions with an id, a name and arguments. Raises ValueError naming the first violation."""
    model = FORMATS[fmt].model
    if table.schema != FORMATS[fmt].schema:
        raise ValueError(f"{fmt.value}: table schema differs from the format's schema")
    for name in table.column_names:
        optional = type(None) in get_args(model.model_fields[name].annotation)
        if not optional and table.column(name).null_count:
            raise ValueError(
                f"{fmt.value}: column '{name}' has {table.column(name).null_count} nulls"
            )
    if fmt is ExportFormat.ATIF:
        _expect_all(table.column("schema_version"), pa.array(["ATIF-v1.4"]), "schema_version")
    for name in MESSAGE_COLUMNS[fmt]:
        messages = pc.list_flatten(table.column(name))
        _expect_all(pc.struct_field(messages, "role"), _ROLES, f"{name}.role")
        calls = pc.list_flatten(pc.struct_field(messages, "tool_calls"))
        _expect_all(
            pc.struct_field(calls, "type"), pa.array(["function"]), f"{name}.tool_calls.type"
        )
        function = pc.struct_field(calls, "function")
        for field, values in [
            ("id", pc.struct_field(calls, "id")),
            ("function.name", pc.struct_field(function, "name")),
            ("function.arguments", pc.struct_field(function, "arguments")),
        ]:
            if values.null_count:
                raise ValueError(
                    f"{fmt.value}: {name}.tool_calls.{field} has {values.null_count} nulls"
                )


def _expect_all(values: pa.Array | pa.ChunkedArray, allowed: pa.Array, where: str) -> None:
    if len(values) == 0:
        return
    wrong = pc.invert(pc.fill_null(pc.is_in(values, value_set=allowed), False))
    if pc.any(wrong).as_py():
        bad = pc.filter(values, wrong)[0].as_py()
        raise ValueError(f"{where}: {bad!r} is not one of {allowed.to_pylist()}")


ROW_GROUP_ROWS = 1024
"""Rows per Parquet row group (the last may hold fewer)."""


class ParquetSink:
    """Streams tables of one schema into an open binary file (zstd) as row groups of
    `row_group_rows` rows, whatever the sizes of the tables written: the file's bytes depend on
    its rows alone, not on how the exporter batched them (batch size, worker processes). Each
    group is written as one contiguous table."""

    def __init__(self, f: IO[bytes], schema: pa.Schema, row_group_rows: int = ROW_GROUP_ROWS):
        self._writer = pq.ParquetWriter(f, schema, compression="zstd")
        self._size = row_group_rows
        self._pending: list[pa.Table] = []
        self._rows = 0

    def write(self, table: pa.Table) -> None:
        self._pending.append(table)
        self._rows += table.num_rows
        if self._rows >= self._size:
            whole = pa.concat_tables(self._pending)
            cut = self._rows - self._rows % self._size
            for start in range(0, cut, self._size):
                self._group(whole.slice(start, self._size))
            rest = whole.slice(cut)
            self._pending, self._rows = ([rest] if rest.num_rows else []), rest.num_rows

    def finish(self) -> None:
        """Write the rows still pending (the last, shorter row group)."""
        if self._rows:
            self._group(pa.concat_tables(self._pending))
        self._pending, self._rows = [], 0

    def close(self) -> None:
        """Let go of the file (after `finish`, or on an error: pending rows are dropped)."""
        self._writer.close()

    def _group(self, table: pa.Table) -> None:
        self._writer.write_table(table.combine_chunks(), row_group_size=self._size)
