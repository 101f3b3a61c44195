"""`format("tablestore")` reads (the data source is in _datasource.py, writes in _sink.py).

Delta tables by name, written by executors and committed by the driver per barrier:

    import sluice, sluice.tablestore
    spark = sluice.session()
    orders.write.format("tablestore").option("table", "orders").option("primary-key", "id").mode("append").save()
    spark.read.format("tablestore").option("table", "orders").load()                       # latest version
    spark.read.format("tablestore").option("table", "orders").option("barrier", 1700000000000).load()
    spark.read.format("tablestore").option("table", "orders").option("consistent-with", "customer_totals").load()
    frames = sluice.tablestore.read_consistent(spark, ["orders", "customer_totals"])      # one barrier for all

Writes: every task writes its rows into one Parquet file under the table's `data/` folder; the driver commits
the write (or micro-batch) as one Delta version: appends add the files (no data passes through the driver),
tables with a primary key merge them (last change per key wins, `upsert.op-column` deletes). Each commit
carries its barrier (custom metadata + app transaction) and is skipped when replayed; the MetaService records
(table, barrier, version). A streaming micro-batch's barrier is assigned when it is first committed and kept
for its replays (MetaService.batch_barrier).

Reads: the chosen version's data files, grouped into partitions of about `max-partition-bytes`, read by the
executors straight from the warehouse (a local folder or an s3:// bucket: see _storage.py). sluice never writes
deletion vectors (delta-rs merges copy on write); a table that has them is refused with a clear error rather than
read wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from sluice.connector import (
    OpenStreamReaderCore,
    ReadLimit,
    ReadObserver,
    SourceReport,
    conform,
    observed,
    task_context,
    to_arrow_schema,
)
from sluice.meta import MetaService
from sluice.tablestore._barriers import BarrierHandoff
from sluice.tablestore._offset import BarrierOffset
from sluice.tablestore._storage import Warehouse
from sluice.tablestore._table import StoreTable, TableStoreError


class FilePartition(InputPartition):
    """Data files one task reads, in table order, and the warehouse that holds them."""

    def __init__(self, uris: list[str], warehouse: Warehouse) -> None:
        super().__init__(uris[0] if uris else "")
        self.uris, self.warehouse = uris, warehouse


def group_files(uris: list[str], sizes: list[int], target: int) -> list[list[str]]:
    """Consecutive files packed into groups of about `target` bytes (a file larger than it is a group alone): a read
    plans by data size, not by how many commits wrote the table (20 small appends are 1 partition, not 20)."""
    groups: list[list[str]] = []
    current: list[str] = []
    filled = 0
    for uri, size in zip(uris, sizes, strict=True):
        if current and filled + size > target:
            groups.append(current)
            current, filled = [], 0
        current.append(uri)
        filled += size
    if current:
        groups.append(current)
    return groups


def _size(uri: str, size_of: dict[str, int]) -> int:
    """A file's size from the add actions, whose paths are relative to the table (URL-quoted)."""
    from urllib.parse import quote

    for start in range(len(uri)):  # the shortest suffix after a '/' that is a known path
        if (start == 0 or uri[start - 1] == "/") and (uri[start:] in size_of or quote(uri[start:]) in size_of):
            return size_of.get(uri[start:], size_of.get(quote(uri[start:]), 0))
    return 0


class TableStoreReader(DataSourceReader):
    """The chosen version's data files, grouped into partitions of about `max-partition-bytes`."""

    def __init__(self, table: StoreTable, version: int | None, schema: StructType, target_bytes: int,
                 reads: ReadObserver | None = None) -> None:

        self.table, self.version, self.target_bytes = table, version, target_bytes
        self.arrow_schema = to_arrow_schema(schema)
        self.reads = reads  # where read tasks report what they fetch (sluice.metrics); None: nowhere

    def partitions(self) -> list[InputPartition]:
        dt = self.table.delta(self.version)
        actions = pa.table(dt.get_add_actions(flatten=True))
        if "deletionVector.storageType" in actions.column_names and \
                actions.column("deletionVector.storageType").null_count < actions.num_rows:
            raise TableStoreError(f"table '{self.table.name}' has deletion vectors, which this reader does not "
                                  "apply; rewrite the table without them (OPTIMIZE / REORG PURGE)")
        size_of = dict(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True))
        uris = dt.file_uris()
        sizes = [_size(uri, size_of) for uri in uris]
        warehouse = self.table.warehouse
        return [FilePartition(group, warehouse) for group in group_files(uris, sizes, self.target_bytes)] or \
            [FilePartition([], warehouse)]

    def read(self, partition: FilePartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return observed(self.reads, self._files(partition))

    def _files(self, partition: FilePartition) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        if not partition.uris:
            return
        names = self.arrow_schema.names
        fs = partition.warehouse.filesystem()
        for uri in partition.uris:
            with fs.open_input_file(partition.warehouse.path(uri)) as file:
                for batch in pq.ParquetFile(file).iter_batches(batch_size=65536, columns=names):
                    yield conform(_with_added(batch, self.arrow_schema), self.arrow_schema)


def _with_added(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A file written before a column was added (schema.evolution) lacks it: null there, as Delta reads it."""
    missing = [f for f in schema if f.name not in batch.schema.names]
    for f in missing:
        batch = batch.append_column(f.name, pa.nulls(batch.num_rows, f.type))
    return batch


CHANGE_COLUMNS = (("_change_type", pa.string()), ("_commit_version", pa.int64()))


class VersionRange(InputPartition):
    """Delta versions (first, last] of one micro-batch, and the barrier it reaches."""

    def __init__(self, table: StoreTable, first: int, last: int, barrier: int, handoff: BarrierHandoff) -> None:
        super().__init__(f"{first}-{last}")
        self.table, self.first, self.last, self.barrier, self.handoff = table, first, last, barrier, handoff


class TableStoreStreamReader(OpenStreamReaderCore[BarrierOffset, VersionRange]):
    """Streaming read barrier by barrier: a micro-batch holds exactly the changes of the barriers it covers.

    Offsets are `BarrierOffset`s (_offset.py): barrier B and the Delta version V that completed it (from the
    MetaService).
    With `aligned-with`, B is the barrier the MetaService fixed for the whole group of inputs from this start
    (MetaService.aligned_barrier), so the job's sources advance together.
    Rows are Delta's change data feed between the two versions: the table's columns plus `_change_type`
    (insert, update_preimage, update_postimage, delete) and `_commit_version`. Every micro-batch runs one task
    that offers (query, batch) -> barrier through the BarrierHandoff, so a table-store sink in the same query
    commits its output with the barrier of its input, also when the batch has no rows.
    No read limit and no Trigger.AvailableNow end of its own: a micro-batch reads up to a completed barrier, never
    part of one (FLIP-276), and an AvailableNow query runs one micro-batch.
    """

    def __init__(self, table: StoreTable, meta: str | None, schema: StructType,
                 aligned_with: tuple[str, ...] = (), reads: ReadObserver | None = None) -> None:

        super().__init__(source=("tablestore", table.name), reads=reads)
        self.table, self.meta, self.aligned_with = table, meta, aligned_with
        self.arrow_schema = to_arrow_schema(schema)

    def parse_offset(self, raw: dict) -> BarrierOffset:
        return BarrierOffset.from_json(raw)

    def first_offset(self) -> BarrierOffset:
        return BarrierOffset(0, 0)

    def next_end(self, start: BarrierOffset, limit: ReadLimit) -> BarrierOffset:
        # Asked every trigger: read the newest barrier only, not the table's whole (growing) barrier history.
        meta = MetaService(self.meta)
        last = meta.last_barrier(self.table.name)
        if last is None:
            return start
        if not self.aligned_with:
            return BarrierOffset(*last)
        barrier = meta.aligned_barrier([self.table.name, *self.aligned_with], start.barrier)
        if barrier == start.barrier:
            return start
        version = meta.barrier_version(self.table.name, barrier)
        if version is None:  # aligned_barrier answers only barriers every table completed
            raise TableStoreError(f"table '{self.table.name}' has no recorded version for barrier {barrier}, which "
                                  f"the tables {[self.table.name, *self.aligned_with]} all completed (was its barrier "
                                  "pruned by vacuum?)")
        return BarrierOffset(barrier, version)

    def plan(self, start: BarrierOffset, end: BarrierOffset) -> list[VersionRange]:
        return [VersionRange(self.table, start.version, end.version, end.barrier, BarrierHandoff(self.meta))]

    def read_partition(self, partition: VersionRange) -> Iterator[pa.RecordBatch]:
        task = task_context("")
        if task.epoch is not None:  # a micro-batch: its barrier, for a table-store sink in the same query
            partition.handoff.offer(task.write_id, task.epoch, partition.barrier)
        if partition.last <= partition.first:
            return
        changes = partition.table.delta().load_cdf(starting_version=partition.first + 1,
                                                   ending_version=partition.last)
        for batch in changes:
            yield conform(pa.record_batch(batch), self.arrow_schema)

    def lag(self, end: BarrierOffset) -> SourceReport | None:
        """The committed version against the table's newest, and how far its barrier is behind the newest one."""
        last = MetaService(self.meta).last_barrier(self.table.name)
        if last is None:
            return None
        return self.report(position=f"version {end.version}", head=f"version {last[1]}",
                           time_behind_ms=float(max(0, last[0] - end.barrier)))


def signed_change(column: str) -> str:
    """SQL for a change-feed row's contribution to a sum of `column`: + for inserts and new images, - for deletes
    and old images. `feed.selectExpr("key", signed_change("amount") + " AS delta").groupBy("key").sum("delta")`
    keeps an aggregate of an upsert table right through updates and deletes."""
    col = f"`{column.replace('`', '``')}`"
    return (f"CASE WHEN _change_type IN ('insert', 'update_postimage') THEN {col} "
            f"WHEN _change_type IN ('update_preimage', 'delete') THEN -{col} ELSE 0 END")


def read_consistent(spark: Any, tables: list[str], *, warehouse: str | None = None, meta: str | None = None,
                    storage: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """(barrier, {table: DataFrame}) of `tables` at the newest barrier all of them completed; `storage` holds
    the `storage.*` options of an s3:// warehouse."""
    found = MetaService(meta).consistent_version(tables)
    frames = {}
    for name in tables:
        reader = spark.read.format("tablestore").option("table", name).option("version", found.versions[name])
        reader = reader.options(**(storage or {}))
        if warehouse:
            reader = reader.option("warehouse", warehouse)
        if meta:
            reader = reader.option("meta", meta)
        frames[name] = reader.load()
    return found.barrier, frames
