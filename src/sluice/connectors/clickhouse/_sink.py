"""`format("clickhouse")` writes: Arrow INSERTs over HTTP (`FORMAT ArrowStream`), one per engine batch.

Spark hands the task Arrow record batches; they stay Arrow until a batch is sent as an Arrow IPC stream, and
ClickHouse converts each column to its type (no per-row work in Python).
- unordered (plain MergeTree and others): at-least-once appends; a retried task inserts its rows again, unless
  `insert.deduplicate`: each batch then carries an insert_deduplication_token (the write, the micro-batch, the
  Spark partition, the batch's first row, a hash of its bytes) and batches are cut at fixed row positions, so
  ClickHouse applies a retried or replayed batch once.
- ReplacingMergeTree tables are upsert tables: rows of one sorting key collapse to the last one (or the highest
  version). Without a version column the last *inserted* row wins, so the default mode is partition-ordered by
  the sorting key; with a version column any mode is safe. `upsert.op-column` turns rows into deletes through
  ReplacingMergeTree(ver, is_deleted).

A row is refused (errors.tolerance=all sends it aside) when a chunk's check finds a value its column cannot hold,
before anything is sent (RecordError with its rows), or when ClickHouse refuses an INSERT for a row's content
(RECORD_CODES: a value that does not parse or fit, a CONSTRAINT ... CHECK): the engine splits the batch until the
row is alone. An INSERT of one batch is one block, applied whole or not at all. With insert.deduplicate, a split
half is a batch of its own: its token holds its own first row and the hash of its own rows, so it is never taken
for the refused whole (which ClickHouse did not store, so its token was not kept either); a task re-run cuts the
same batches and, the same rows refused again, the same halves, whose tokens ClickHouse then recognizes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sluice.connector import (
    AlignedBatchCreator,
    ArrowRows,
    Batch,
    BatchCreator,
    BlockingStore,
    Encoded,
    RecordError,
    TaskWriter,
    WriteContext,
    WritePlan,
    delete_mask,
    refuse_truncate,
    refuse_unchanged,
)
from sluice.connectors.clickhouse._checks import check_chunk
from sluice.connectors.clickhouse._client import RECORD_CODES, ClickHouseError, Connection, quote_ident
from sluice.connectors.clickhouse._types import CHType


@dataclass(frozen=True)
class Deletes:
    """upsert.op-column: which DataFrame column says "delete", and the table's is_deleted column it becomes."""

    op_column: str
    is_deleted_column: str
    required: frozenset[str]  # columns a delete row must still carry: the sorting key and the version


@dataclass(frozen=True)
class InsertPlan:
    """The INSERT every batch runs, its settings, and the checks each chunk passes before any of it is buffered."""

    conn: Connection
    columns: tuple[str, ...]  # the table columns written, in the DataFrame's order
    types: dict[str, CHType]
    row_key_columns: tuple[str, ...]
    deletes: Deletes | None = None
    deduplicate: bool = False
    settings: dict[str, str | int] = field(default_factory=dict)
    unchanged_column: str | None = None  # upsert.unchanged-column: rows that name a column are refused

    @property
    def statement(self) -> str:
        return (f"INSERT INTO {self.conn.target} ({', '.join(quote_ident(c) for c in self.columns)}) "
                "FORMAT ArrowStream")

    def row_key(self, batch: pa.RecordBatch | pa.Table, row: int) -> str:
        keys = {k: batch.column(k)[row].as_py() for k in self.row_key_columns if k in batch.schema.names}
        return f"the row with sorting key {keys}" if keys else f"row {row} of a chunk of {batch.num_rows}"

    def prepare(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Check a chunk, then give it the table's columns: the op column becomes is_deleted (1 for deletes)."""
        table = f"{self.conn.database}.{self.conn.table}"
        if self.unchanged_column is not None:
            refuse_unchanged(batch, self.unchanged_column, self.row_key_columns, f"ClickHouse table {table}",
                             "A ReplacingMergeTree row replaces the whole row: run ALTER TABLE ... REPLICA IDENTITY "
                             "FULL on the source table so that postgres_changes carries every value, or write such "
                             "a table to postgres or the table store, which keep the stored value.")
            batch = batch.drop_columns([self.unchanged_column])
        if self.deletes is None:
            check_chunk(batch, self.types, table, lambda row: self.row_key(batch, row))
            return batch
        op = self.deletes.op_column
        refuse_truncate(batch.column(op), op, "clickhouse")
        deletes = delete_mask(batch.column(op))
        optional = frozenset(self.types) - self.deletes.required
        check_chunk(batch, self.types, table, lambda row: self.row_key(batch, row), optional, deletes)
        batch = batch.drop_columns([op])
        return batch.append_column(self.deletes.is_deleted_column, deletes.cast(pa.uint8()))

    def body(self, rows: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        return sink.getvalue().to_pybytes()

    def token(self, context: WriteContext, first_row: int, body: bytes) -> str:
        """The batch's insert_deduplication_token: the same rows of the same write, micro-batch and partition give
        the same token; the hash of the bytes makes a replay that differs (a non-deterministic source) insert
        again rather than be taken for the first attempt."""
        digest = hashlib.blake2b(body, digest_size=12).hexdigest()
        return f"sluice:{context.write_id}:{context.epoch}:{context.partition_id}:{first_row}:{digest}"


class ClickHouseStore(BlockingStore):
    """One task's writer: every engine batch is one INSERT ... FORMAT ArrowStream of its rows."""

    name = "clickhouse"

    def __init__(self, plan: InsertPlan, rows: ArrowRows, connections: int) -> None:
        super().__init__()
        self.plan = plan
        self.rows = rows
        self.io_threads = connections
        self.context = WriteContext()

    @property
    def target(self) -> str:
        return self.plan.conn.display

    def open(self, context: WriteContext) -> None:
        self.context = context

    def write_batch(self, batch: Batch) -> None:
        body = self.plan.body(self.rows.table(batch.entries))
        settings: dict[str, Any] = dict(self.plan.settings)  # ClickHouse settings, for request's **settings
        if self.plan.deduplicate:
            settings["insert_deduplication_token"] = self.plan.token(self.context, batch.entries[0], body)
        try:
            self.plan.conn.request(self.plan.statement, body=body, **settings)
        except ClickHouseError as e:
            if e.code in RECORD_CODES:  # the engine splits the batch until the row is alone
                raise RecordError(f"writing {batch.record_count} row(s) to {self.target}: a row was refused for "
                                  f"what it holds: {e}") from None
            raise
        self.rows.release(batch.entries)

    def refused_rows(self, entries: Sequence[int]) -> pa.Table:
        return self.rows.take(entries)


@dataclass(frozen=True)
class ClickHouseWritePlan(WritePlan):
    insert: InsertPlan
    connections_per_task: int

    def open_task(self, context: WriteContext) -> TaskWriter:
        rows, insert = ArrowRows(), self.insert

        def encode(batch: pa.RecordBatch) -> Encoded:
            return Encoded(*rows.add(insert.prepare(batch)))

        return TaskWriter(encode, ClickHouseStore(insert, rows, self.connections_per_task))

    def batch_creator(self) -> BatchCreator | None:
        return AlignedBatchCreator(self.config.batch_max_size) if self.insert.deduplicate else None
