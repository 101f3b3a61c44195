"""`format("tablestore")` writes, on the same engine shape as every connector: tasks stage, the driver commits.

Each task's rows go through the engine into one Parquet file under the table's `data/` folder (one batch at a
time, in order); its pre-commit message names the file. The driver's committer makes the write or micro-batch
one Delta version at its barrier (table.commit): appends add the files, tables with a primary key merge them.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import (
    ADD_COLUMNS,
    GLOBAL_ORDERED,
    TRUNCATE_OP,
    ArrowRows,
    Batch,
    BlockingStore,
    Committer,
    Encoded,
    RecordError,
    SinkConfig,
    TaskWriter,
    WriteContext,
    WritePlan,
    without_source_marks,
)
from sluice.meta import MetaService
from sluice.tablestore._barriers import BarrierHandoff
from sluice.tablestore._commit import BarrierCommit
from sluice.tablestore._options import WriteOptions
from sluice.tablestore._stats import FileStats
from sluice.tablestore._table import StagedFile, StoreTable

MiB = 1024 * 1024
# One file per task, written in order: one batch in flight (Parquet writers are sequential), large row groups,
# no retry of a half-written file (a failed task is re-run by Spark and writes a new file).
SINK_CONFIG = SinkConfig(batch_max_size=65_536, flush_buffer_size=64 * MiB, flush_buffer_timeout=1000,
                         requests_max_buffered=262_144, mode=GLOBAL_ORDERED, transactional=True, max_retries=0)


class ParquetStore(BlockingStore):
    """One task's staged file: every engine batch is appended to it; pre_commit closes it and names it."""

    name = "tablestore"
    supports_transactions = True
    io_threads = 1

    def __init__(self, table: StoreTable, rows: ArrowRows, context: WriteContext) -> None:
        super().__init__()
        self.table, self.rows = table, rows
        self.relative = (f"{table.staging_prefix(context.write_id, context.epoch)}/"
                         f"part-{context.partition_id:05d}-{context.task_attempt_id}-{uuid.uuid4().hex[:8]}.parquet")
        self._fs: Any = None
        self._out: Any = None  # the file's output stream (local file or object-store upload)
        self._writer: Any = None
        self._clean: pa.Schema | None = None  # the rows' schema without source marks (without_source_marks)
        self._recast = False
        self._count = 0
        self._stats = FileStats()  # its columns' ranges for the Delta log, so that filtered reads can skip it

    @property
    def target(self) -> str:
        return f"table {self.table.name}"

    def write_batch(self, batch: Batch) -> None:
        import pyarrow.parquet as pq

        data = self.rows.table(batch.entries)
        if self._clean is None:
            self._clean = without_source_marks(data.schema)
            self._recast = not self._clean.equals(data.schema, check_metadata=True)
        if self._recast:
            data = data.cast(self._clean)
        if self._writer is None:
            path = self.table.file_path(self.relative)
            self._fs = self.table.warehouse.filesystem()
            if self.table.warehouse.is_local:
                self._fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            self._out = self._fs.open_output_stream(path)
            self._writer = pq.ParquetWriter(self._out, data.schema)
        self._writer.write_table(data)
        self._count += data.num_rows
        self._stats.add(data)
        self.rows.release(batch.entries)

    def refused_rows(self, entries: Sequence[int]) -> pa.Table:
        return self.rows.take(entries)

    def pre_commit(self) -> dict[str, Any] | None:
        if self._writer is None:
            return None
        self._writer.close()
        self._writer = None
        size = self._out.tell()
        self._out.close()  # on an object store, the upload completes here
        self._out = None
        return {"path": self.relative, "size": size, "rows": self._count, "stats": self._stats.json()}

    def close(self) -> None:
        super().close()
        if self._writer is not None:  # a failed task: its partial file is never committed
            self._writer.close()
            self._writer = None
            self._out.close()
            self._out = None
            with contextlib.suppress(FileNotFoundError):
                self._fs.delete_file(self.table.file_path(self.relative))


class TableStoreCommitter(Committer):
    """One Delta version per write or micro-batch, at its barrier; replays are detected by the table's app
    transaction (table.commit)."""

    def __init__(self, table: StoreTable, write: WriteOptions, created: bool) -> None:
        self.table, self.write, self.created = table, write, created

    def commit(self, messages: list[Any], context: WriteContext) -> None:
        files = [StagedFile(**m) for m in messages if m]
        write = self.write
        meta = MetaService(write.meta)
        epoch = context.epoch
        streaming = epoch is not None
        # An unregistered streaming query writes as an implicit job named after it.
        name = f"query-{context.write_id[:8]}" if streaming and not write.job_named else write.job
        try:  # one writer per table: this commit's job, or WriterConflictError naming the table's other writer
            writer = meta.claim_writer(self.table.name, name=name, query_id=context.write_id if streaming else None,
                                       lease_s=write.writer_lease)
        except Exception:
            self.abort(messages, context)  # nothing of a refused writer stays in the table's folder
            raise
        if epoch is not None:  # a micro-batch: the barrier its table-store input offered, else a new one
            app = context.write_id  # the streaming query's id
            barrier = BarrierHandoff(write.meta).take(app, epoch, [self.table.name])
        elif write.write_id:  # a re-run of this write gets the same barrier: its replay is detected
            app = write.write_id
            barrier = BarrierHandoff(write.meta).take(app, 0, [self.table.name])
        else:
            app = write.job
            last = meta.last_barrier(self.table.name)
            barrier = max(int(time.time() * 1000), (last[0] + 1) if last else 0)
        self.table.commit(files, BarrierCommit(app, barrier, writer), meta, op_column=write.upsert_op_column,
                          unchanged_column=write.upsert_unchanged_column, upkeep=write.upkeep(),
                          add_columns=write.schema_evolution == ADD_COLUMNS)

    def abort(self, messages: list[Any], context: WriteContext) -> None:
        self.table.delete_files([m["path"] for m in messages if m])
        if self.created:  # made by this write's plan: a failed first write leaves no empty table
            self.table.drop_if_unwritten()


@dataclass(frozen=True)
class TableStoreWritePlan(WritePlan):
    table: StoreTable
    write: WriteOptions
    key: tuple[str, ...]  # the write's primary key, else the table's
    created: bool = False  # the plan made the table (it did not exist)

    def open_task(self, context: WriteContext) -> TaskWriter:
        rows, table, key, op = ArrowRows(), self.table, self.key, self.write.upsert_op_column

        def encode(batch: pa.RecordBatch) -> Encoded:
            check_key(table, key, batch, op)
            return Encoded(*rows.add(batch))

        return TaskWriter(encode, ParquetStore(table, rows, context))

    def committer(self) -> Committer:
        return TableStoreCommitter(self.table, self.write, self.created)


def check_key(table: StoreTable, key: tuple[str, ...], batch: pa.RecordBatch, op_column: str | None = None) -> None:
    """A row without its primary key cannot be merged by it: refuse those rows (RecordError with their positions:
    errors.tolerance=all sends them aside, else the write fails and nothing of it is committed). A truncate
    (upsert.op-column TRUNCATE_OP) has no key: it is not one of them."""
    truncates = pc.fill_null(pc.equal(batch.column(op_column), TRUNCATE_OP), False) if op_column else None
    for name in key:
        column = batch.column(name)
        if column.null_count:
            missing = column.is_null() if truncates is None else pc.and_not(column.is_null(), truncates)
            rows = np.flatnonzero(np.asarray(missing.to_numpy(zero_copy_only=False), dtype=bool))
            if not len(rows):
                continue
            first = int(rows[0])
            raise RecordError(
                f"table '{table.name}': {len(rows)} row(s) have a null primary-key column '{name}' (the "
                f"first at row {first} of a batch); every row needs its key {list(key)}. Unless errors.tolerance=all "
                "sends such rows aside, nothing of this write is committed: filter or fill those rows and write "
                "again.", rows=rows.tolist())
