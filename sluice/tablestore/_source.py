"""`format("tablestore")`: Delta tables by name, written by executors and committed by the driver per barrier.

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

Reads: one partition per data file of the chosen version. sluice never writes deletion vectors (delta-rs
merges copy on write); a table that has them is refused with a clear error rather than read wrong.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from sluice._errors import OptionError
from sluice._options import Option, Options, OptionSpec
from sluice._upsert import check_key_columns
from sluice.meta import MetaService
from sluice.spark._datasource import task_context
from sluice.spark._encoding import check_writable, conform
from sluice.tablestore._table import StagedFile, StoreTable, TableStoreError

COMMON = (
    Option("table", "str", None, "Table name (letters, digits, '_').", required=True),
    Option("warehouse", "str", None, "Folder holding the tables; default $SLUICE_WAREHOUSE, else .sluice/warehouse."),
    Option("meta", "str", None, "MetaService database (SQLite path or postgresql:// URL); default $SLUICE_META, "
           "else .sluice/meta.db.", secret=True),
)
WRITE_SPEC = OptionSpec("tablestore", (
    *COMMON,
    Option("primary-key", "list", (), "Key columns: writes are upserts (merge) by this key; set when the table is "
           "created."),
    Option("upsert.op-column", "str", None, "Column whose value d, delete, D or -D deletes the key (not stored)."),
    Option("job", "str", "batch", "Name of the writing job in commits (app transaction id) for batch writes; "
           "streaming writes use the query id."),
    Option("write-id", "str", None, "Batch writes: an id of your choosing for this write; re-running it with the "
           "same id (after a failure, or when unsure it committed) commits it once: it keeps its barrier, and a "
           "commit that landed is not repeated."),
))
READ_SPEC = OptionSpec("tablestore", (
    *COMMON,
    Option("version", "int", None, "Read this Delta version.", minimum=0),
    Option("barrier", "int", None, "Read the version that completed this barrier.", minimum=0),
    Option("consistent-with", "list", (),
           "Other tables: read this one at the newest barrier it and they all completed."),
    Option("aligned-with", "list", (), "Streaming: the job's other table-store inputs; every micro-batch "
           "advances all of them to the same barrier (set it on each of those sources too)."),
    Option("changes", "bool", False, "Add the change columns _change_type and _commit_version (Delta's change "
           "data feed); needed to stream an upsert table."),
))


@dataclass
class StagedMessage(WriterCommitMessage):
    partition_id: int
    query_id: str | None
    file: StagedFile | None


class TableStoreDataSource(DataSource):
    """See the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "tablestore"

    @classmethod
    def option_spec(cls) -> OptionSpec:
        return WRITE_SPEC

    @classmethod
    def read_option_spec(cls) -> OptionSpec:
        return READ_SPEC

    def parsed(self) -> Options:
        return WRITE_SPEC.parse(self.options)

    def partitioning(self, opts: Options, schema: StructType) -> tuple[str, ...] | None:
        """For sluice.write: any layout works (the commit orders rows by task, then row)."""
        return None

    # ------------------------------------------------------------------ writing
    def _writer_parts(self, schema: StructType, overwrite: bool,
                      streaming: bool = False) -> tuple[Options, StoreTable, tuple[str, ...]]:
        from pyspark.sql.pandas.types import to_arrow_schema

        opts = WRITE_SPEC.parse(self.options)
        check_writable("tablestore", schema)
        if overwrite and not (streaming and opts["primary-key"]):
            raise OptionError("format 'tablestore' appends or upserts per barrier; mode('overwrite') is not "
                              "supported. Use mode('append'); a streaming aggregation writes in outputMode "
                              "'complete' to a table with a primary-key (each micro-batch upserts every group).")
        table = StoreTable(opts["table"], opts["warehouse"])
        op = opts["upsert.op-column"]
        check_key_columns(schema.fieldNames(), opts["primary-key"], op)
        if op and not opts["primary-key"] and not (table.exists() and table.primary_key()):
            raise OptionError("upsert.op-column needs a primary key (option primary-key)")
        arrow = to_arrow_schema(StructType([f for f in schema.fields if f.name != op]), timezone="UTC")
        if table.exists():
            table.check_schema(arrow)
            if opts.is_set("primary-key") and tuple(opts["primary-key"]) != table.primary_key():
                raise OptionError(f"table '{table.name}' has primary key {list(table.primary_key())}; the write asks "
                                  f"for {list(opts['primary-key'])}")
        else:
            table.create(arrow, tuple(opts["primary-key"]))
        return opts, table, tuple(opts["primary-key"]) or table.primary_key()

    def writer(self, schema: StructType, overwrite: bool) -> TableStoreWriter:
        return TableStoreWriter(*self._writer_parts(schema, overwrite), uuid.uuid4().hex)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TableStoreStreamWriter:
        return TableStoreStreamWriter(*self._writer_parts(schema, overwrite, streaming=True), uuid.uuid4().hex)

    # ------------------------------------------------------------------ reading
    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        opts = READ_SPEC.parse(self.options)
        schema = pa.schema(StoreTable(opts["table"], opts["warehouse"]).delta().schema().to_arrow())
        if opts["changes"]:
            schema = pa.schema([*schema, *(pa.field(n, t) for n, t in CHANGE_COLUMNS)])
        return from_arrow_schema(schema)

    # spark.readStream adds the change columns of Delta's change data feed (see TableStoreStreamReader).

    def streamReader(self, schema: StructType) -> TableStoreStreamReader:
        opts = READ_SPEC.parse(self.options)
        for key in ("version", "barrier", "consistent-with"):
            if opts.is_set(key):
                raise OptionError(f"option '{key}' is for batch reads; a streaming read follows the table barrier "
                                  "by barrier from its first version")
        table = StoreTable(opts["table"], opts["warehouse"])
        if table.primary_key() and "_change_type" not in schema.fieldNames():
            raise OptionError(f"table '{table.name}' is an upsert table (primary key {list(table.primary_key())}): "
                              "stream it with option changes=true, which adds _change_type (insert, "
                              "update_preimage, update_postimage, delete) so updates are not counted twice")
        return TableStoreStreamReader(table, opts["meta"], schema, tuple(opts["aligned-with"]))

    def reader(self, schema: StructType) -> TableStoreReader:
        opts = READ_SPEC.parse(self.options)
        table = StoreTable(opts["table"], opts["warehouse"])
        chosen = [k for k in ("version", "barrier", "consistent-with") if opts.is_set(k)]
        if len(chosen) > 1:
            raise OptionError(f"set at most one of version, barrier and consistent-with (got {', '.join(chosen)})")
        version = opts["version"]
        if opts["changes"]:
            raise OptionError("option 'changes' is for streaming reads (spark.readStream)")
        if opts["barrier"] is not None:
            meta = MetaService(opts["meta"])
            found = meta.barrier_version(table.name, opts["barrier"])
            if found is None:
                raise OptionError(f"table '{table.name}' has not completed barrier {opts['barrier']}; its barriers: "
                                  f"{[b for b, _ in meta.barriers(table.name)][-5:]} (last 5)")
            version = found
        elif opts["consistent-with"]:
            version = MetaService(opts["meta"]).consistent_version([table.name, *opts["consistent-with"]]) \
                .versions[table.name]
        return TableStoreReader(table, version, schema)


class _Writer:
    def __init__(self, opts: Options, table: StoreTable, key: tuple[str, ...], write_id: str) -> None:
        self.opts, self.table, self.key, self.write_id = opts, table, key, write_id

    def _check_key(self, batch: pa.RecordBatch) -> None:
        """A row without its primary key cannot be merged by it: refuse the write (nothing of it is committed)."""
        for name in self.key:
            column = batch.column(name)
            if column.null_count:
                first = column.is_null().index(True).as_py()
                raise TableStoreError(
                    f"table '{self.table.name}': {column.null_count} row(s) have a null primary-key column "
                    f"'{name}' (the first at row {first} of a batch); every row needs its key {list(self.key)}. "
                    "Nothing of this write is committed: filter or fill those rows and write again.")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        import pyarrow.parquet as pq

        task = task_context(self.write_id)  # write_id: the streaming query's id, else this write's
        query_id = task.write_id if task.epoch is not None else None
        folder = self.table.staging_dir(task.write_id, task.epoch)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-{task.partition_id:05d}-{task.task_attempt_id}-{uuid.uuid4().hex[:8]}.parquet"
        writer, rows = None, 0
        try:
            for batch in iterator:
                if not batch.num_rows:
                    continue
                self._check_key(batch)
                if writer is None:
                    writer = pq.ParquetWriter(path, batch.schema)
                writer.write_batch(batch)
                rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            return StagedMessage(task.partition_id, query_id, None)
        rel = str(path.relative_to(self.table.root))
        return StagedMessage(task.partition_id, query_id, StagedFile(rel, path.stat().st_size, rows))

    def _commit(self, messages: list[StagedMessage | None], epoch: int | None) -> None:
        done = sorted((m for m in messages if m is not None), key=lambda m: m.partition_id)
        files = [m.file for m in done if m.file is not None]
        meta = MetaService(self.opts["meta"])
        query_id = next((m.query_id for m in done if m.query_id), None)
        if epoch is not None and query_id:
            job = query_id
            barrier = meta.batch_barrier(query_id, epoch, [self.table.name])
        elif self.opts["write-id"]:  # a re-run of this write gets the same barrier: its replay is detected
            job = self.opts["write-id"]
            barrier = meta.batch_barrier(job, 0, [self.table.name])
        else:
            job = self.opts["job"]
            last = meta.last_barrier(self.table.name)
            barrier = max(int(time.time() * 1000), (last[0] + 1) if last else 0)
        self.table.commit(files, job=job, barrier=barrier, meta=meta, op_column=self.opts["upsert.op-column"])

    def _abort(self, messages: list[StagedMessage | None]) -> None:
        for m in messages:
            if m is not None and m.file is not None:
                (self.table.root / m.file.path).unlink(missing_ok=True)


class TableStoreWriter(_Writer, DataSourceArrowWriter):
    def commit(self, messages: list[StagedMessage | None]) -> None:  # type: ignore[override]
        self._commit(messages, None)

    def abort(self, messages: list[StagedMessage | None]) -> None:  # type: ignore[override]
        self._abort(messages)


class TableStoreStreamWriter(_Writer, DataSourceStreamArrowWriter):
    def commit(self, messages: list[StagedMessage | None], batchId: int) -> None:  # type: ignore[override]
        self._commit(messages, batchId)

    def abort(self, messages: list[StagedMessage | None], batchId: int) -> None:  # type: ignore[override]
        self._abort(messages)


class FilePartition(InputPartition):
    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.uri = uri


class TableStoreReader(DataSourceReader):
    """One partition per data file of the chosen version."""

    def __init__(self, table: StoreTable, version: int | None, schema: StructType) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.table, self.version = table, version
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")

    def partitions(self) -> list[InputPartition]:
        dt = self.table.delta(self.version)
        actions = pa.table(dt.get_add_actions(flatten=True))
        if "deletionVector.storageType" in actions.column_names and \
                actions.column("deletionVector.storageType").null_count < actions.num_rows:
            raise TableStoreError(f"table '{self.table.name}' has deletion vectors, which this reader does not "
                                  "apply; rewrite the table without them (OPTIMIZE / REORG PURGE)")
        uris = dt.file_uris()
        return [FilePartition(u) for u in uris] or [FilePartition("")]

    def read(self, partition: FilePartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        if not partition.uri:
            return
        import pyarrow.parquet as pq

        names = self.arrow_schema.names
        for batch in pq.ParquetFile(partition.uri.removeprefix("file://")).iter_batches(batch_size=65536,
                                                                                           columns=names):
            yield conform(batch, self.arrow_schema)


CHANGE_COLUMNS = (("_change_type", pa.string()), ("_commit_version", pa.int64()))


class VersionRange(InputPartition):
    """Delta versions (first, last] of one micro-batch, and the barrier it reaches."""

    def __init__(self, uri: str, first: int, last: int, barrier: int, meta: str | None) -> None:
        super().__init__(f"{first}-{last}")
        self.uri, self.first, self.last, self.barrier, self.meta = uri, first, last, barrier, meta


class TableStoreStreamReader(DataSourceStreamReader):
    """Streaming read barrier by barrier: a micro-batch holds exactly the changes of the barriers it covers.

    Offsets are {"barrier": B, "version": V}: V is the Delta version that completed B (from the MetaService).
    With `aligned-with`, B is the barrier the MetaService fixed for the whole group of inputs from this start
    (MetaService.aligned_barrier), so the job's sources advance together.
    Rows are Delta's change data feed between the two versions: the table's columns plus `_change_type`
    (insert, update_preimage, update_postimage, delete) and `_commit_version`. Every micro-batch runs one task
    that records (query, batch) -> barrier in the MetaService, so a table-store sink in the same query commits
    its output with the barrier of its input, also when the batch has no rows.
    """

    def __init__(self, table: StoreTable, meta: str | None, schema: StructType,
                 aligned_with: tuple[str, ...] = ()) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.table, self.meta, self.aligned_with = table, meta, aligned_with
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")

    def initialOffset(self) -> dict:
        return {"barrier": 0, "version": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        # Asked every trigger: read the newest barrier only, not the table's whole (growing) barrier history.
        meta = MetaService(self.meta)
        last = meta.last_barrier(self.table.name)
        if last is None:
            return start or self.initialOffset()
        if not self.aligned_with:
            return {"barrier": last[0], "version": last[1]}
        begin = int((start or self.initialOffset())["barrier"])
        barrier = meta.aligned_barrier([self.table.name, *self.aligned_with], begin)
        if barrier == begin:
            return start or self.initialOffset()
        return {"barrier": barrier, "version": meta.barrier_version(self.table.name, barrier)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [VersionRange(self.table.uri, int(start["version"]), int(end["version"]), int(end["barrier"]),
                             self.meta)]

    def read(self, partition: VersionRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        from deltalake import DeltaTable

        task = task_context("")
        if task.epoch is not None:  # a micro-batch: its barrier, for a table-store sink in the same query
            MetaService(partition.meta).record_batch_barrier(task.write_id, task.epoch, partition.barrier)
        if partition.last <= partition.first:
            return
        changes = DeltaTable(partition.uri).load_cdf(starting_version=partition.first + 1,
                                                     ending_version=partition.last)
        for batch in changes:
            yield conform(pa.record_batch(batch), self.arrow_schema)

    def commit(self, end: dict) -> None:
        """Nothing to release: positions live in Spark's checkpoint."""


def signed_change(column: str) -> str:
    """SQL for a change-feed row's contribution to a sum of `column`: + for inserts and new images, - for deletes
    and old images. `feed.selectExpr("key", signed_change("amount") + " AS delta").groupBy("key").sum("delta")`
    keeps an aggregate of an upsert table right through updates and deletes."""
    col = f"`{column.replace('`', '``')}`"
    return (f"CASE WHEN _change_type IN ('insert', 'update_postimage') THEN {col} "
            f"WHEN _change_type IN ('update_preimage', 'delete') THEN -{col} ELSE 0 END")


def read_consistent(spark: Any, tables: list[str], *, warehouse: str | None = None,
                    meta: str | None = None) -> tuple[int, dict[str, Any]]:
    """(barrier, {table: DataFrame}) of `tables` at the newest barrier all of them completed."""
    found = MetaService(meta).consistent_version(tables)
    frames = {}
    for name in tables:
        reader = spark.read.format("tablestore").option("table", name).option("version", found.versions[name])
        if warehouse:
            reader = reader.option("warehouse", warehouse)
        if meta:
            reader = reader.option("meta", meta)
        frames[name] = reader.load()
    return found.barrier, frames
