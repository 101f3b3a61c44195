"""`format("postgres")`: the Spark data source; options in _options.py, writes in _sink.py, reads in _source.py."""

from __future__ import annotations

import uuid

from pyspark.sql.types import StructType

from sluice.connector import (
    PARTITION_ORDERED,
    Options,
    SinkConfig,
    SinkDataSource,
    SourceDataSource,
    TrackingSettings,
    TrackingStreamReader,
    check_pushdown,
    refuse_batch_options_in_stream,
    refuse_tracking_in_batch,
    to_arrow_schema,
)
from sluice.connectors.postgres._client import Connection
from sluice.connectors.postgres._lookup import PostgresLookupReader, plan_lookup
from sluice.connectors.postgres._options import LOOKUP_SPEC, READ_SPEC, WRITE_SPEC, ReadOptions, WriteOptions
from sluice.connectors.postgres._sink import PostgresWritePlan
from sluice.connectors.postgres._source import (
    PostgresBatchReader,
    PostgresEnumerator,
    PostgresPushdownReader,
    PostgresSplitReader,
    infer_schema,
)
from sluice.connectors.postgres._table import prepare_target
from sluice.connectors.postgres._tracking import (
    PostgresTrackingEnumerator,
    PostgresTrackingReader,
    PostgresTrackingSql,
    tracking_kind,
)


class PostgresDataSource(SinkDataSource, SourceDataSource):
    """`format("postgres")`: see the package docstring for usage."""

    format_name = "postgres"
    refused_writes = ("A row the server refuses for what it holds (SQLSTATE class 22, a data exception, or 23, "
                      "a CHECK, NOT NULL, UNIQUE or FOREIGN KEY violation), found in its batch by splitting it, or "
                      "a value refused before sending (a NULL for NOT NULL, an integer out of its column's range, a "
                      "string over varchar(n), a number over numeric(p,s)); in staged writes (sink.transactional, "
                      "overwrite) UNIQUE and FOREIGN KEY violations surface only at the driver's commit, which fails "
                      "whole.")

    write_spec = WRITE_SPEC
    read_spec = READ_SPEC
    lookup_spec = LOOKUP_SPEC
    refused_reads = ("a row with a value that does not convert to its column's Spark type (a numeric NaN or Infinity "
                     "in a decimal column, a value out of a narrower type the read's schema gives), sent aside as "
                     "the row the server sent")

    def primary_key(self, opts: Options) -> tuple[str, ...]:
        return WriteOptions.of(opts).primary_key

    def write_options(self) -> Options:
        raw = dict(self.options)
        keys = {k.lower() for k in raw}
        if "primary-key" in keys and "sink.mode" not in keys:
            raw["sink.mode"] = PARTITION_ORDERED  # upserts default to per-key order
        return self.write_spec.parse(raw)

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig, overwrite: bool) -> PostgresWritePlan:
        write = WriteOptions.of(opts)
        conn_info = Connection.from_options(opts)
        staged = config.transactional or overwrite  # overwrite is always staged and committed by the driver
        table = prepare_target(conn_info, write, schema, to_arrow_schema(schema),
                               overwrite=overwrite, staged=staged, pooled=config.streaming)
        return PostgresWritePlan(self.format_name, opts, schema, config, conn_info, write, table, overwrite)

    # ------------------------------------------------------------------ reading
    def _typed_read_options(self) -> ReadOptions:
        opts = self.read_options()
        check_pushdown(opts["pushdown"])  # refused before the connection options are resolved
        return ReadOptions.of(opts)

    def schema(self) -> StructType:
        options = self._typed_read_options()
        schema, columns, _ = infer_schema(options.conn, options)
        opts = self.read_options()
        if opts["tracking.column"]:  # a readStream's (a batch read refuses it): checked at load(), not at start
            tracking_kind(columns, TrackingSettings.of(opts, self.format_name), _described(options))
        return schema

    def reader(self, schema: StructType) -> PostgresBatchReader:
        refuse_tracking_in_batch(self.read_options(), self.format_name)
        options = self._typed_read_options()
        _, columns, primary_key = infer_schema(options.conn, options)
        kind = PostgresPushdownReader if options.pushdown else PostgresBatchReader
        route = self.dead_letters(self.read_options(), streaming=False)
        rows = PostgresSplitReader(options.conn, options, columns, schema, route, f"read-{uuid.uuid4().hex[:12]}")
        return kind(PostgresEnumerator(options.conn, options, columns, primary_key), rows, None,
                    reads=self.read_observer())

    def streamReader(self, schema: StructType) -> TrackingStreamReader:
        """readStream: the rows a tracking column finds (_tracking.py, docs/tracking.md)."""
        opts = self.read_options()
        settings = TrackingSettings.of(opts, self.format_name)
        refuse_batch_options_in_stream(opts, self.format_name, ("partition-column", "num-partitions", "pushdown",
                                                                 "consistent-snapshot", "snapshot.timeout-s"))
        options = self._typed_read_options()
        _, columns, primary_key = infer_schema(options.conn, options)
        kind, pg_type = tracking_kind(columns, settings, _described(options))
        types = dict(columns)
        sql = PostgresTrackingSql(options, settings.column, pg_type, kind,
                                  [(name, types[name]) for name in primary_key if name != settings.column])
        reads = self.read_observer(event_time=settings.column if kind == "timestamp" else None)
        rows = PostgresSplitReader(options.conn, options, columns, schema, self.dead_letters(opts, streaming=True),
                                   f"read-{uuid.uuid4().hex[:12]}", streaming=True)
        return TrackingStreamReader(PostgresTrackingEnumerator(options.conn, sql, settings.column),
                                    PostgresTrackingReader(rows, sql), settings,
                                    source=(self.format_name, _described(options)), reads=reads)


    # ------------------------------------------------------------------ lookup joins
    def lookup_reader(self, opts: Options, on: tuple[str, ...],
                      columns: tuple[str, ...] | None) -> PostgresLookupReader:
        """sluice.lookup(df, "postgres", ...): rows by key, `= ANY` in one prepared statement (_lookup.py)."""
        return plan_lookup(opts, on, columns)


def _described(options: ReadOptions) -> str:
    return f"table {options.table}" if options.table else "the query"
