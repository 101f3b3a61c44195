"""`format("hbase")` writes: puts and deletes by row key, each with its cell timestamp, batched by region.

- Order: the write is partition-ordered by the row key's columns (one key's rows share a task, in order), and
  each task groups its rows by the region their key falls in (the region start keys, learned once per write):
  one batch per region in flight, regions concurrently (the sink-modes design's second mode; the design's batching by
  partition). A region that splits during the write only makes the grouping coarser: the gateway routes every
  put to the region that holds it now.
- Timestamps: every put and delete carries its cell timestamp (milliseconds), fixed when the row is encoded, so
  a retried batch or a replayed micro-batch writes the same cells again and changes nothing. `client`: the
  executor's clock, one step further for each later change of the same key in the task; `micro-batch`: the batch
  id and the row's position (a replay of batch n always loses to batch n+1); `write.timestamp-column`: the data.
  HBase keeps the cell with the highest timestamp, and a delete masks cells at or below its own: so one key's
  changes land right in any order, and a retry never undoes a later change.
- Replays long after: a delete marker lasts until the next major compaction, so a streaming write keeps the last
  micro-batch committed (write.replay-guard, _replay.py) and writes nothing for an older one replayed.
- Encoding: a write of puts only (no upsert.op-column, write.null-cells=skip) builds each put as Thrift bytes in
  Arrow (_wire.py); deletes, and puts next to them, are thriftpy2 objects.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import (
    Batch,
    BlockingStore,
    Encoded,
    RecordError,
    ReplayGuard,
    SinkError,
    TaskWriter,
    ThrottledError,
    WriteContext,
    WritePlan,
    delete_mask,
    micro_batch_numbers,
    refuse_truncate,
    to_arrow_schema,
)
from sluice.connectors.hbase._cells import encoder
from sluice.connectors.hbase._client import Connection, thrift
from sluice.connectors.hbase._keys import ADVICE
from sluice.connectors.hbase._refusals import entry_rows
from sluice.connectors.hbase._replay import TableReplayGuard
from sluice.connectors.hbase._rowplan import RowPlan
from sluice.connectors.hbase._wire import put_multiple, thrift_puts

MICRO_BATCH_ROWS = 1 << 24  # rows one task may write in one micro-batch under write.timestamp=micro-batch
MAX_ROW_KEY = 32_767  # HConstants.MAX_ROW_LENGTH


class RowEncoder:
    """One task's encoder: Arrow chunk -> TPut/TDelete entries, each with its region's code."""

    def __init__(self, plan: RowPlan, context: WriteContext, schema: pa.Schema) -> None:
        self.plan, self.context = plan, context
        self.cell_encoders = [(column, cell.family, cell.qualifier, encoder(schema.field(column).type, column))
                              for column, cell in plan.catalog.cells]
        self.rows_seen = 0
        self.last_stamp = 0
        self.module = thrift()

    def _stamps(self, batch: pa.RecordBatch, keys: list[bytes]) -> list[int]:
        n = batch.num_rows
        plan = self.plan
        if plan.timestamp == "column":
            column = batch.column(plan.timestamp_column)  # no nulls: _check refused them
            if pa.types.is_timestamp(column.type):
                column = column.cast(pa.timestamp("ms", column.type.tz))
            return column.cast(pa.int64()).to_pylist()
        if plan.timestamp == "micro-batch":  # (batch id + 1) x 2^24 + the row's place (docs/hbase.md)
            return micro_batch_numbers(self.context.epoch, self.rows_seen, n, per_task=MICRO_BATCH_ROWS,
                                       option="write.timestamp", instead="write.timestamp=client or "
                                       "write.timestamp-column", base=MICRO_BATCH_ROWS).tolist()
        # client: one stamp for the chunk, one step more for each repeat of a key within it.
        base = max(time.time_ns() // 1_000_000, self.last_stamp + 1)
        seen: dict[bytes, int] = {}
        stamps = []
        for key in keys:
            repeat = seen.get(key, -1) + 1
            seen[key] = repeat
            stamps.append(base + repeat)
        self.last_stamp = max(stamps) if stamps else self.last_stamp
        return stamps

    def _check(self, batch: pa.RecordBatch, keys: list[bytes], cells: list[tuple[str, pa.Array]]) -> None:
        """RecordError with the rows HBase would refuse for the first of these found: a row key over MAX_ROW_KEY bytes,
        an empty row key, a null write.timestamp-column, a cell over write.max-cell-bytes."""
        plan = self.plan
        lengths = pc.binary_length(pa.array(keys, pa.binary())).to_numpy(zero_copy_only=False)
        problems: list[tuple[np.ndarray, Callable[[int], str]]] = [
            (lengths > MAX_ROW_KEY, lambda row: f"row key {keys[row][:64]!r}... is {len(keys[row])} bytes; HBase "
                                                f"takes at most {MAX_ROW_KEY} (shorten the rowkey columns' values)"),
            (lengths == 0, lambda row: f"the row key of row {row} of this batch is empty (an empty string or binary "
                                       "rowkey column); HBase rows need a key of at least one byte"),
        ]
        if plan.timestamp == "column" and batch.column(plan.timestamp_column).null_count:
            problems.append((np.asarray(batch.column(plan.timestamp_column).is_null().to_numpy(zero_copy_only=False)),
                             lambda row: f"write.timestamp-column '{plan.timestamp_column}' is null for row key "
                                         f"{keys[row]!r}; every row needs a timestamp"))
        limit = plan.max_cell_bytes

        def too_large(column: str, sizes: np.ndarray) -> Callable[[int], str]:
            return lambda row: (f"row key {keys[row]!r}: column '{column}' holds {int(sizes[row])} bytes, over "
                                f"write.max-cell-bytes={limit} (the server's hbase.server.keyvalue.maxsize). Store "
                                "large values elsewhere, or raise both limits")

        for column, values in cells:
            sizes = pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False)
            problems.append((sizes > limit, too_large(column, sizes)))
        # The rows of one problem at a time, each dead letter with its own reason: the engine encodes the rest again.
        for mask, describe in problems:
            if mask.any():
                rows = np.flatnonzero(mask).tolist()
                more = f" ({len(rows) - 1} more such row(s) in this batch)" if len(rows) > 1 else ""
                raise RecordError(f"{describe(rows[0])}{more}; nothing of this chunk was sent. {ADVICE}", rows=rows)

    def _puts(self, keys: list[bytes], cells: list[tuple[bytes, bytes, pa.Array]], stamps: list[int]) -> Encoded:
        """Every row a put, as Thrift bytes; a row without cells (all null) is none."""
        puts, counts = thrift_puts(pa.array(keys, pa.binary()), cells, np.asarray(stamps, np.int64),
                                   self.plan.durability or None)
        starts = self.plan.region_starts
        groups = [bisect.bisect_right(starts, k) for k in keys]
        self.rows_seen += len(keys)
        if counts.all():
            return Encoded(puts.to_pylist(), pc.binary_length(puts).to_numpy().tolist(), None, groups)
        kept = np.flatnonzero(counts)
        puts = puts.take(pa.array(kept))
        return Encoded(puts.to_pylist(), pc.binary_length(puts).to_numpy().tolist(), kept.tolist(),
                       [groups[i] for i in kept.tolist()])

    def __call__(self, batch: pa.RecordBatch) -> Encoded:
        plan, module = self.plan, self.module
        if plan.op_column:
            refuse_truncate(batch.column(plan.op_column), plan.op_column, "hbase")
        keys = plan.key.encode(batch)
        encoded = [(column, encode(batch.column(column))) for column, _, _, encode in self.cell_encoders]
        # Rows HBase cannot take go aside (errors.tolerance=all) before anything of the batch changes state.
        self._check(batch, keys, encoded)
        stamps = self._stamps(batch, keys)
        n = batch.num_rows
        cells = [(family, qualifier, array)
                 for (_, family, qualifier, _), (_, array) in zip(self.cell_encoders, encoded, strict=True)]
        if not plan.op_column and not plan.delete_nulls:  # puts only: Thrift bytes built in Arrow (_wire.py)
            return self._puts(keys, cells, stamps)
        deletes = (delete_mask(batch.column(plan.op_column)).to_numpy(zero_copy_only=False) if plan.op_column
                   else np.zeros(n, dtype=bool))
        cells = [(family, qualifier, values.to_pylist()) for family, qualifier, values in cells]
        starts = plan.region_starts
        TPut, TColumnValue, TDelete, TColumn = (module.TPut, module.TColumnValue, module.TDelete, module.TColumn)
        entries: list[Any] = []
        sizes: list[int] = []
        rows: list[int] = []
        groups: list[int] = []
        durability = plan.durability or None
        for i in range(n):
            key, stamp = keys[i], stamps[i]
            region = bisect.bisect_right(starts, key)
            if deletes[i]:
                entries.append(TDelete(row=key, timestamp=stamp, durability=durability))
                sizes.append(len(key) + 16)
                rows.append(i)
                groups.append(region)
                continue
            values = [TColumnValue(family=f, qualifier=q, value=v[i], timestamp=stamp)
                      for f, q, v in cells if v[i] is not None]
            if values:
                entries.append(TPut(row=key, columnValues=values, timestamp=stamp, durability=durability))
                sizes.append(len(key) + sum(len(c.value) + len(c.qualifier) + 24 for c in values))
                rows.append(i)
                groups.append(region)
            if plan.delete_nulls and len(values) < len(cells):
                gone = [TColumn(family=f, qualifier=q, timestamp=stamp) for f, q, v in cells if v[i] is None]
                entries.append(TDelete(row=key, columns=gone, timestamp=stamp, deleteType=1, durability=durability))
                sizes.append(len(key) + 16 * len(gone))
                rows.append(i)
                groups.append(region)
        self.rows_seen += n
        return Encoded(entries, sizes, rows, groups)


class HBaseStore(BlockingStore):
    """One task's writer: a batch (one region's puts and deletes) is one putMultiple and one deleteMultiple on
    this thread's gateway client."""

    name = "hbase"

    def __init__(self, conn: Connection, table: str, threads: int, gateway: int,
                 rows: tuple[RowPlan, pa.Schema] | None = None) -> None:
        super().__init__()
        self.conn, self.table, self.gateway = conn, table, gateway
        self.rows = rows  # how entries decode back into rows (refused_rows)
        self.io_threads = threads
        self.table_bytes = table.encode()
        self.put_type = thrift().TPut

    @property
    def target(self) -> str:
        return self.conn.display(self.table)

    def explain(self, error: SinkError) -> SinkError:
        if not isinstance(error.cause, ThrottledError):
            return error
        return SinkError(f"{error} The region servers kept refusing requests as busy: let the write ride it out "
                         "with a higher sink.max-retries and sink.retry-delay-ms, or lower "
                         "sink.requests.max-inflight.", store=error.store, target=error.target,
                         batch_records=error.batch_records, cause=error.cause)

    def refused_rows(self, entries: Sequence[Any]) -> pa.Table | Sequence[Mapping[str, object]]:
        if self.rows is None:
            return super().refused_rows(entries)
        return entry_rows(entries, *self.rows)

    def write_batch(self, batch: Batch) -> None:
        encoded = [e for e in batch.entries if isinstance(e, bytes)]  # puts as Thrift bytes (_wire.py)
        puts = [e for e in batch.entries if isinstance(e, self.put_type)]
        deletes = [e for e in batch.entries if not isinstance(e, bytes | self.put_type)]
        # Every entry carries its timestamp: puts and deletes of one key resolve by it, not by arrival.
        if encoded:
            self.conn.run(lambda client: put_multiple(client, self.table_bytes, encoded), index=self.gateway,
                          rows=len(encoded))
        if puts:
            self.conn.call("putMultiple", self.table_bytes, puts, index=self.gateway, rows=len(puts))
        if deletes:
            self.conn.call("deleteMultiple", self.table_bytes, deletes, index=self.gateway, rows=len(deletes))


@dataclass(frozen=True)
class HBaseWritePlan(WritePlan):
    conn: Connection
    rows: RowPlan
    guard_table: str | None  # write.replay-guard's table; None: off

    def replay_guard(self) -> ReplayGuard | None:
        return TableReplayGuard(self.conn, self.guard_table, self.rows.catalog.table) if self.guard_table else None

    def open_task(self, context: WriteContext) -> TaskWriter:
        schema = to_arrow_schema(self.schema)
        encode = RowEncoder(self.rows, context, schema)
        store = HBaseStore(self.conn, self.rows.catalog.table, self.config.requests_max_inflight,
                           context.partition_id, (self.rows, schema))
        return TaskWriter(encode, store)
