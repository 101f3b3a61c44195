"""`format("tablestore")` writes, on the same engine shape as every connector: tasks stage, the driver commits.

Each task's rows go through the engine into one Parquet file under the table's `data/` folder (one batch at a
time, in order); its pre-commit message names the file. The driver's committer makes the write or micro-batch
one Delta version at its barrier (table.commit): appends add the files, tables with a primary key merge them.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluice.connector import (
    GLOBAL_ORDERED,
    ArrowRows,
    Batch,
    BlockingStore,
    Committer,
    Encoded,
    SinkConfig,
    TaskWriter,
    WriteContext,
    WritePlan,
)
from sluice.meta import MetaService
from sluice.tablestore._barriers import BarrierHandoff
from sluice.tablestore._table import StagedFile, StoreTable, TableStoreError

MiB = 1024 * 1024
# One file per task, written in order: one batch in flight (Parquet writers are sequential), large row groups,
# no retry of a half-written file (a failed task is re-run by Spark and writes a new file).
SINK_CONFIG = SinkConfig(max_batch_records=65_536, max_batch_bytes=64 * MiB, flush_timeout_ms=1000,
                         max_buffered=262_144, mode=GLOBAL_ORDERED, transactional=True, max_retries=0)


class ParquetStore(BlockingStore):
    """One task's staged file: every engine batch is appended to it; pre_commit closes it and names it."""

    name = "tablestore"
    supports_transactions = True
    io_threads = 1

    def __init__(self, table: StoreTable, rows: ArrowRows, context: WriteContext) -> None:
        super().__init__()
        self.table, self.rows = table, rows
        folder = table.staging_dir(context.write_id, context.epoch)
        self.path = folder / f"part-{context.partition_id:05d}-{context.task_attempt_id}-{uuid.uuid4().hex[:8]}.parquet"
        self._writer: Any = None
        self._count = 0

    @property
    def target(self) -> str:
        return f"table {self.table.name}"

    def write_batch(self, batch: Batch) -> None:
        import pyarrow.parquet as pq

        data = self.rows.table(batch.entries)
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.path, data.schema)
        self._writer.write_table(data)
        self._count += data.num_rows
        self.rows.release(batch.entries)

    def pre_commit(self) -> dict[str, Any] | None:
        if self._writer is None:
            return None
        self._writer.close()
        self._writer = None
        return {"path": str(self.path.relative_to(self.table.root)), "size": self.path.stat().st_size,
                "rows": self._count}

    def close(self) -> None:
        super().close()
        if self._writer is not None:  # a failed task: its partial file is never committed
            self._writer.close()
            self._writer = None


class TableStoreCommitter(Committer):
    """One Delta version per write or micro-batch, at its barrier; replays are detected by the table's app
    transaction (table.commit)."""

    def __init__(self, table: StoreTable, opts: Any) -> None:
        self.table, self.opts = table, opts

    def commit(self, messages: list[Any], context: WriteContext) -> None:
        files = [StagedFile(**m) for m in messages if m]
        meta = MetaService(self.opts["meta"])
        if context.epoch is not None:  # a micro-batch: the barrier its table-store input offered, else a new one
            job = context.write_id  # the streaming query's id
            barrier = BarrierHandoff(self.opts["meta"]).take(job, context.epoch, [self.table.name])
        elif self.opts["write-id"]:  # a re-run of this write gets the same barrier: its replay is detected
            job = self.opts["write-id"]
            barrier = BarrierHandoff(self.opts["meta"]).take(job, 0, [self.table.name])
        else:
            job = self.opts["job"]
            last = meta.last_barrier(self.table.name)
            barrier = max(int(time.time() * 1000), (last[0] + 1) if last else 0)
        self.table.commit(files, job=job, barrier=barrier, meta=meta, op_column=self.opts["upsert.op-column"],
                          checkpoint_interval=self.opts["checkpoint-interval"])

    def abort(self, messages: list[Any], context: WriteContext) -> None:
        for m in messages:
            if m:
                (self.table.root / m["path"]).unlink(missing_ok=True)


@dataclass(frozen=True)
class TableStoreWritePlan(WritePlan):
    table: StoreTable
    key: tuple[str, ...]

    def open_task(self, context: WriteContext) -> TaskWriter:
        rows, table, key = ArrowRows(), self.table, self.key

        def encode(batch: pa.RecordBatch) -> Encoded:
            check_key(table, key, batch)
            return Encoded(*rows.add(batch))

        return TaskWriter(encode, ParquetStore(table, rows, context))

    def committer(self) -> Committer:
        return TableStoreCommitter(self.table, self.options)


def check_key(table: StoreTable, key: tuple[str, ...], batch: pa.RecordBatch) -> None:
    """A row without its primary key cannot be merged by it: refuse the write (nothing of it is committed)."""
    for name in key:
        column = batch.column(name)
        if column.null_count:
            first = column.is_null().index(True).as_py()
            raise TableStoreError(
                f"table '{table.name}': {column.null_count} row(s) have a null primary-key column '{name}' (the "
                f"first at row {first} of a batch); every row needs its key {list(key)}. Nothing of this write is "
                "committed: filter or fill those rows and write again.")
