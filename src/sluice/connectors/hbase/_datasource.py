"""`format("hbase")`: the Spark data source; writes in _sink.py, reads in _source.py."""

from __future__ import annotations

import uuid

from pyspark.sql.types import StructType

from sluice.connector import (
    OptionError,
    Options,
    SinkConfig,
    SinkDataSource,
    SourceDataSource,
    TrackingSettings,
    TrackingStreamReader,
    check_option_columns,
    check_pushdown,
    refuse_batch_options_in_stream,
    refuse_tracking_in_batch,
    to_arrow_schema,
)
from sluice.connectors.hbase._catalog import Catalog
from sluice.connectors.hbase._cells import encoder
from sluice.connectors.hbase._client import Connection, TableFacts, describe, regions
from sluice.connectors.hbase._keys import KeyCodec
from sluice.connectors.hbase._lookup import HBaseLookupReader, plan_lookup
from sluice.connectors.hbase._options import (
    BATCH_ONLY,
    DURABILITY,
    LOOKUP_SPEC,
    READ_SPEC,
    WRITE_SPEC,
    ReadOptions,
    WriteOptions,
)
from sluice.connectors.hbase._replay import check_guard_table
from sluice.connectors.hbase._rowplan import RowPlan
from sluice.connectors.hbase._sink import HBaseWritePlan
from sluice.connectors.hbase._source import (
    HBaseBatchReader,
    HBasePushdownReader,
    HBaseReader,
    RegionEnumerator,
    check_versions,
    stamp_column,
    time_range,
)
from sluice.connectors.hbase._tracking import (
    HBaseTrackingEnumerator,
    HBaseTrackingReader,
    RegionScans,
    tracking_column,
)

NO_TRANSACTIONS = (
    "sink.transactional=true: HBase has no transactions across rows sluice could commit a write or micro-batch "
    "in. Every put and delete carries its cell timestamp, so a retried or replayed batch rewrites the same cells and "
    "changes nothing (write.timestamp=micro-batch or write.timestamp-column make replays exact; docs/hbase.md). "
    "Remove sink.transactional."
)


class HBaseDataSource(SinkDataSource, SourceDataSource):
    """`format("hbase")`: see the package docstring for usage."""

    format_name = "hbase"
    no_transactions = NO_TRANSACTIONS
    refused_writes = ("A row whose key HBase cannot take (a null key column, a 0 byte in a key column not last, a key "
                      "empty or over 32,767 bytes), a null write.timestamp-column value or a cell over "
                      "write.max-cell-bytes, refused before sending; a put the Thrift2 gateway refuses (a cell over "
                      "hbase.client.keyvalue.maxsize), found in its batch by splitting it.")
    write_spec = WRITE_SPEC
    read_spec = READ_SPEC
    lookup_spec = LOOKUP_SPEC
    refused_reads = ("a row whose key or a cell does not decode as the read's schema types it (a cell of another width "
                     "than its column's type, text that is not UTF-8, a key written with other key columns), sent "
                     "aside as its row key, timestamp and cells")

    def _facts(self, conn: Connection, table: str) -> TableFacts:
        return self.learn_once(("table", conn, table), lambda: describe(conn, table))

    def primary_key(self, opts: Options) -> tuple[str, ...]:
        """The row key's columns: one key's changes share a task and keep their order."""
        return tuple(opts["rowkey"])

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig, overwrite: bool) -> HBaseWritePlan:
        if overwrite:
            raise OptionError("format 'hbase' cannot overwrite a table atomically; truncate it first (truncate "
                              "'table' in the HBase shell), then use mode('append').")
        options = WriteOptions.of(opts)
        names = schema.fieldNames()
        special = {"upsert.op-column": options.upsert_op_column,
                   "write.timestamp-column": options.write_timestamp_column}
        check_option_columns(special, names)
        for option, column in special.items():
            if column is not None and column in self.primary_key(opts):
                raise OptionError(f"{option} '{column}' is a rowkey column; it must be a column of its own.")
        if options.write_timestamp_column and opts.is_set("write.timestamp"):
            raise OptionError("write.timestamp and write.timestamp-column both say where timestamps come from; "
                              "keep one.")
        catalog = Catalog.from_options(opts, [n for n in names if n not in special.values()])
        arrow = to_arrow_schema(schema)
        key = KeyCodec.for_schema(catalog.key, arrow)
        for column, _ in catalog.cells:  # refuses a type no cell holds
            encoder(arrow.field(column).type, column, schema[column].dataType.simpleString())
        stamp = options.write_timestamp_column
        if stamp and not (arrow.field(stamp).type == "int64" or str(arrow.field(stamp).type).startswith("timestamp")):
            raise OptionError(f"write.timestamp-column '{stamp}' is {schema[stamp].dataType.simpleString()}; it must "
                              "be a long (milliseconds since the epoch) or a timestamp.")
        conn = Connection.from_options(opts)
        facts = self._facts(conn, catalog.table)
        catalog.check_families(facts.families)
        timestamp = "column" if stamp else options.write_timestamp
        expiring = sorted(f.decode(errors="replace") for f in facts.ttl_families & catalog.families)
        if timestamp == "micro-batch" and expiring:
            raise OptionError(f"write.timestamp=micro-batch numbers cells by micro-batch, not by the clock, and "
                              f"families {expiring} of {catalog.table} have a time to live: HBase would expire the "
                              "cells at once. Use write.timestamp=client or a timestamp column.")
        starts = tuple(r.start for r in regions(conn, catalog.table) if r.start)
        rows = RowPlan(catalog, key, starts, options.upsert_op_column, timestamp, stamp,
                       options.write_null_cells == "delete", DURABILITY[options.write_durability],
                       options.write_max_cell_bytes)
        guard = options.write_replay_guard_table if options.write_replay_guard else None
        if guard is not None:
            check_guard_table(conn, guard)
        return HBaseWritePlan(self.format_name, opts, schema, config, conn, rows, guard)

    # ------------------------------------------------------------------ reading
    def schema(self) -> StructType:
        raise OptionError("format 'hbase' needs the read's columns and types: HBase cells are bytes. Give them "
                          "with .schema('id long, name string, ...'), naming the rowkey columns and the cells "
                          "(family, columns options).")

    def reader(self, schema: StructType) -> HBaseBatchReader:
        opts = self.read_options()
        refuse_tracking_in_batch(opts, self.format_name)
        options = ReadOptions.of(opts)
        check_pushdown(options.pushdown)
        arrow = to_arrow_schema(schema)
        stamp = stamp_column(options, arrow)
        catalog = Catalog.from_options(opts, [n for n in schema.fieldNames() if n != stamp])
        key = KeyCodec.for_schema(catalog.key, arrow)
        conn = Connection.from_options(opts)
        facts = describe(conn, catalog.table)
        catalog.check_families(facts.families)
        check_versions(options.read_versions, catalog, facts.max_versions)
        reader = HBaseReader(conn, catalog, key, arrow, options.read_rows_per_fetch,
                             time_range(options.read_time_range), options.read_versions, stamp,
                             self.dead_letters(opts, streaming=False), f"read-{uuid.uuid4().hex[:12]}")
        enumerator = RegionEnumerator(conn, catalog.table, options.read_splits_per_region)
        kind = HBasePushdownReader if options.pushdown else HBaseBatchReader
        return kind(enumerator, reader, None, reads=self.read_observer())

    def streamReader(self, schema: StructType) -> TrackingStreamReader:
        """readStream: rows found by their cell timestamps (_tracking.py, docs/hbase.md); every option is checked
        here, before the first micro-batch (HBase reads need a schema, so load() learns nothing of the table)."""
        opts = self.read_options()
        settings = TrackingSettings.of(opts, self.format_name)
        refuse_batch_options_in_stream(opts, self.format_name, BATCH_ONLY)
        options = ReadOptions.of(opts)
        arrow = to_arrow_schema(schema)
        tracking_column(settings, arrow, options.rowkey)
        catalog = Catalog.from_options(opts, [n for n in schema.fieldNames() if n != settings.column])
        key = KeyCodec.for_schema(catalog.key, arrow)
        conn = Connection.from_options(opts)
        catalog.check_families(describe(conn, catalog.table).families)
        rows = HBaseReader(conn, catalog, key, arrow, options.read_rows_per_fetch, None, 1, settings.column,
                           self.dead_letters(opts, streaming=True), f"read-{uuid.uuid4().hex[:12]}", streaming=True)
        scans = RegionScans(conn, catalog.table, [(c.family, c.qualifier) for _, c in catalog.cells],
                            options.read_rows_per_fetch)
        return TrackingStreamReader(HBaseTrackingEnumerator(scans, settings.column),
                                    HBaseTrackingReader(scans, rows), settings,
                                    source=(self.format_name, catalog.table),
                                    reads=self.read_observer(event_time=settings.column))

    # ------------------------------------------------------------------ lookup joins
    def lookup_reader(self, opts: Options, on: tuple[str, ...],
                      columns: tuple[str, ...] | None) -> HBaseLookupReader:
        """sluice.lookup(df, "hbase", ...): one getMultiple per batch of row keys (_lookup.py)."""
        return plan_lookup(opts, on, columns)
