"""`format("clickhouse")` writes: Native-encoded INSERTs over HTTP, one per engine batch.

- unordered (plain MergeTree and others): at-least-once appends; a retried task inserts its rows again.
- ReplacingMergeTree tables are upsert tables: rows of one sorting key collapse to the last one (or the highest
  version). Without a version column the last *inserted* row wins, so the default mode is partition-ordered by
  the sorting key (one batch of a key in flight at a time); with a version column any mode is safe. Replayed
  rows replace themselves, so retries and re-runs leave one row per key once ClickHouse has merged (read with
  FINAL, as format("clickhouse") reads do for these tables).
- sink.transactional is refused: see docs/clickhouse.md for why ClickHouse (as of the versions tested) offers
  no atomic, idempotent commit that sluice could make exactly-once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import (
    SINK_SPEC,
    ArrowRows,
    Batch,
    BlockingStore,
    Encoded,
    Option,
    OptionError,
    TaskWriter,
    WriteContext,
    WritePlan,
)
from sluice.connectors.clickhouse._client import CONNECTION_OPTIONS, Connection, quote_ident
from sluice.connectors.clickhouse._native import INTS, ColumnType, native_block

MiB = 1024 * 1024

WRITE_OPTIONS = (
    Option("connections-per-task", "int", 2, "Concurrent INSERTs per Spark task.", minimum=1, maximum=32),
)
# ClickHouse wants few, large inserts (each one is a part on disk that merges later): large batches by default.
WRITE_SPEC = SINK_SPEC.extend(
    (*CONNECTION_OPTIONS, *WRITE_OPTIONS),
    sink_batch_max_size=100_000, sink_requests_max_buffered=400_000, sink_flush_buffer_size=64 * MiB,
).renamed("clickhouse")

_BOUNDS = {name: (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)) for name, dtype in INTS.items()}
_BOUNDS["Date"] = (0, 65535)  # days since 1970-01-01
_BOUNDS["DateTime"] = (0, 2**32 - 1)  # seconds since 1970-01-01 UTC


@dataclass(frozen=True)
class InsertPlan:
    """The INSERT every batch runs, and the checks each chunk passes before any of it is buffered."""

    conn: Connection
    columns: tuple[str, ...]
    types: dict[str, ColumnType]
    row_key_columns: tuple[str, ...]

    @property
    def statement(self) -> str:
        return f"INSERT INTO {self.conn.target} ({', '.join(quote_ident(c) for c in self.columns)}) FORMAT Native"

    def row_key(self, batch: pa.RecordBatch | pa.Table, row: int) -> str:
        keys = {k: batch.column(k)[row].as_py() for k in self.row_key_columns if k in batch.schema.names}
        return f"the row with sorting key {keys}" if keys else f"row {row} of a chunk of {batch.num_rows}"

    def check_chunk(self, batch: pa.RecordBatch) -> None:
        """Refuse a chunk ClickHouse would refuse mid-insert: NULL into a non-Nullable column, an integer, date or
        time outside its column's range (vectorized min/max; the encoder checks decimals)."""
        for name in self.columns:
            kind, column = self.types[name], batch.column(name)
            if column.null_count and not kind.nullable:
                row = pc.index(pc.is_null(column), True).as_py()
                raise OptionError(f"column '{name}' is not Nullable in {self.conn.database}.{self.conn.table} "
                                  f"({kind.name}), but {column.null_count} row(s) have no value for it "
                                  f"({self.row_key(batch, row)}). Nothing of this chunk was sent: fill or filter "
                                  "them, or make the column Nullable.")
            bounds = _BOUNDS.get(kind.base)
            if bounds is None or column.null_count == len(column):
                continue
            values = _as_int(column, kind.base)
            low, high = pc.min_max(values).values()
            if low.as_py() < bounds[0] or high.as_py() > bounds[1]:
                approx = values.cast(pa.float64())  # only to point at a row: uint64 bounds do not fit int64
                outside = pc.or_(pc.less(approx, float(bounds[0])), pc.greater(approx, float(bounds[1])))
                row = max(0, pc.index(outside, True).as_py())
                raise OptionError(f"value {column[row].as_py()} of column '{name}' is outside the range of its "
                                  f"ClickHouse type {kind.name} ({self.row_key(batch, row)}). Nothing of this chunk "
                                  "was sent: fix or filter those rows, or widen the column.")


def _as_int(column: pa.Array, base: str) -> pa.Array:
    if base == "Date":
        return column.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    if base == "DateTime" and pa.types.is_timestamp(column.type):
        return pc.divide(column.cast(pa.timestamp("us", "UTC")).cast(pa.int64()), 1_000_000)
    if pa.types.is_decimal(column.type):
        return column  # min/max compare exactly; a fraction is refused by the encoder's safe cast
    if pa.types.is_floating(column.type):
        return pc.floor(column)
    return column.cast(pa.int64()) if not pa.types.is_unsigned_integer(column.type) else column


class ClickHouseStore(BlockingStore):
    """One task's writer: every engine batch is one INSERT ... FORMAT Native of its rows."""

    name = "clickhouse"

    def __init__(self, plan: InsertPlan, rows: ArrowRows, connections: int) -> None:
        super().__init__()
        self.plan = plan
        self.rows = rows
        self.io_threads = connections
        self._lock = threading.Lock()

    @property
    def target(self) -> str:
        return self.plan.conn.display

    def write_batch(self, batch: Batch) -> None:
        table = self.rows.table(batch.entries)
        body = native_block(table, self.plan.types, lambda row: self.plan.row_key(table, row))
        self.plan.conn.request(self.plan.statement, body=body)
        self.rows.release(batch.entries)


@dataclass(frozen=True)
class ClickHouseWritePlan(WritePlan):
    insert: InsertPlan

    def open_task(self, context: WriteContext) -> TaskWriter:
        rows, insert = ArrowRows(), self.insert

        def encode(batch: pa.RecordBatch) -> Encoded:
            insert.check_chunk(batch)
            return Encoded(*rows.add(batch))

        return TaskWriter(encode, ClickHouseStore(insert, rows, self.options["connections-per-task"]))

