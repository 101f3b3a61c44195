"""`format("tablestore")`: the Spark data source; writes in _sink.py (on the engine), reads in _source.py."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
from pyspark.sql.types import StructType

from sluice.connector import (
    EngineArrowWriter,
    EngineStreamArrowWriter,
    ErrorPolicy,
    OptionError,
    Options,
    SinkConfig,
    SinkDataSource,
    SourceDataSource,
    check_key_columns,
    check_unchanged_column,
    from_arrow_schema,
    to_arrow_schema,
)
from sluice.meta import MetaService, check_url
from sluice.tablestore._lookup import TableStoreLookupReader, plan_lookup
from sluice.tablestore._options import LOOKUP_SPEC, READ_SPEC, WRITE_SPEC, ReadOptions, WriteOptions
from sluice.tablestore._sink import SINK_CONFIG, TableStoreWritePlan
from sluice.tablestore._source import (
    CHANGE_COLUMNS,
    TableStoreReader,
    TableStoreStreamReader,
)
from sluice.tablestore._storage import Warehouse
from sluice.tablestore._table import StoreTable


class TableStoreDataSource(SinkDataSource, SourceDataSource):
    """See sluice/tablestore/_source.py's docstring for usage."""

    format_name = "tablestore"
    refused_writes = "A row with a NULL primary-key column, which an upsert table cannot merge."

    write_spec = WRITE_SPEC
    read_spec = READ_SPEC
    lookup_spec = LOOKUP_SPEC

    def partitioning(self, opts: Options, schema: StructType) -> tuple[str, ...] | None:
        """For sluice.write: any layout works (the commit orders rows by task, then row)."""
        return None

    def sink_config(self, opts: Options, schema: StructType) -> SinkConfig:
        # Not tunable: one ordered Parquet file per task, committed by the driver; only errors.* is the user's.
        return dataclasses.replace(SINK_CONFIG, errors=ErrorPolicy.of(opts))

    # ------------------------------------------------------------------ writing
    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig,
                   overwrite: bool) -> TableStoreWritePlan:

        write = WriteOptions.of(opts)
        table = _table(write, opts)
        op = write.upsert_op_column
        check_key_columns(schema.fieldNames(), write.primary_key, op)
        created = not table.exists()
        if op and not write.primary_key and (created or not table.primary_key()):
            raise OptionError("upsert.op-column needs a primary key (option primary-key)")
        unchanged = write.upsert_unchanged_column
        check_unchanged_column(to_arrow_schema(schema), unchanged,
                               write.primary_key or (() if created else table.primary_key()))
        arrow = to_arrow_schema(StructType([f for f in schema.fields if f.name not in (op, unchanged)]))
        if created:
            check_url(write.meta)  # the commit needs it: refused before a table is made
            table.create(arrow, write.primary_key)
        else:
            table.check_schema(arrow, write.schema_evolution)
            if opts.is_set("primary-key") and write.primary_key != table.primary_key():
                raise OptionError(f"table '{table.name}' has primary key {list(table.primary_key())}; the write asks "
                                  f"for {list(write.primary_key)}")
        key = write.primary_key or table.primary_key()
        return TableStoreWritePlan(self.format_name, opts, schema, config, table, write, key, created)

    def _refuse_overwrite(self, overwrite: bool, streaming: bool) -> None:
        if overwrite and not (streaming and WriteOptions.of(self.write_options()).primary_key):
            raise OptionError("format 'tablestore' appends or upserts per barrier; mode('overwrite') is not "
                              "supported. Use mode('append'); a streaming aggregation writes in outputMode "
                              "'complete' to a table with a primary-key (each micro-batch upserts every group).")

    def writer(self, schema: StructType, overwrite: bool) -> EngineArrowWriter:
        self._refuse_overwrite(overwrite, streaming=False)
        return super().writer(schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> EngineStreamArrowWriter:
        self._refuse_overwrite(overwrite, streaming=True)  # complete mode upserts every group per micro-batch
        return super().streamWriter(schema, overwrite)

    # ------------------------------------------------------------------ reading
    def schema(self) -> StructType:
        opts = self.read_options()
        read = ReadOptions.of(opts)
        schema = pa.schema(_table(read, opts).delta().schema().to_arrow())
        if read.changes:
            schema = pa.schema([*schema, *(pa.field(n, t) for n, t in CHANGE_COLUMNS)])
        return from_arrow_schema(schema)

    # spark.readStream adds the change columns of Delta's change data feed (see TableStoreStreamReader).

    def streamReader(self, schema: StructType) -> TableStoreStreamReader:
        opts = self.read_options()
        for key in ("version", "barrier", "consistent-with"):
            if opts.is_set(key):
                raise OptionError(f"option '{key}' is for batch reads; a streaming read follows the table barrier "
                                  "by barrier from its first version")
        read = ReadOptions.of(opts)
        table = _table(read, opts)
        if table.primary_key() and "_change_type" not in schema.fieldNames():
            raise OptionError(f"table '{table.name}' is an upsert table (primary key {list(table.primary_key())}): "
                              "stream it with option changes=true, which adds _change_type (insert, "
                              "update_preimage, update_postimage, delete) so updates are not counted twice")
        return TableStoreStreamReader(table, read.meta, schema, read.aligned_with, self.read_observer())

    def reader(self, schema: StructType) -> TableStoreReader:
        opts = self.read_options()
        read = ReadOptions.of(opts)
        table = _table(read, opts)
        chosen = [k for k in ("version", "barrier", "consistent-with") if opts.is_set(k)]
        if len(chosen) > 1:
            raise OptionError(f"set at most one of version, barrier and consistent-with (got {', '.join(chosen)})")
        version = read.version
        if read.changes:
            raise OptionError("option 'changes' is for streaming reads (spark.readStream)")
        if read.barrier is not None:
            meta = MetaService(read.meta)
            found = meta.barrier_version(table.name, read.barrier)
            if found is None:
                known = [b for b, _ in meta.barriers(table.name)]
                if known and read.barrier < known[0]:
                    raise OptionError(f"table '{table.name}' has not completed barrier {read.barrier}, or it was "
                                      f"forgotten: the oldest kept barrier is {known[0]} (the MetaService forgets "
                                      "barriers of versions older than log-retention-versions back, but any a "
                                      "consistent read may open). Read an older state by option 'version' while the "
                                      "table's log still has it.")
                raise OptionError(f"table '{table.name}' has not completed barrier {read.barrier}; its barriers: "
                                  f"{known[-5:]} (last 5)")
            version = found
        elif read.consistent_with:
            version = MetaService(read.meta).consistent_version([table.name, *read.consistent_with]) \
                .versions[table.name]
        return TableStoreReader(table, version, schema, read.max_partition_bytes, self.read_observer())

    # ------------------------------------------------------------------ lookup joins
    def lookup_reader(self, opts: Options, on: tuple[str, ...],
                      columns: tuple[str, ...] | None) -> TableStoreLookupReader:
        """sluice.lookup(df, "tablestore", ...): rows by key from one version, files pruned by stats (_lookup.py)."""
        return plan_lookup(opts, on, columns)


def _table(typed: WriteOptions | ReadOptions, opts: Options) -> StoreTable:
    """The named table in the warehouse the options name: `warehouse` and the storage.* options, resolved here, on
    the driver (the Warehouse travels inside the table)."""
    return StoreTable(typed.table, Warehouse.resolve(opts["warehouse"], opts))
