"""`format("cassandra")`: the Spark data source; writes in _sink.py, reads in _source.py."""

from __future__ import annotations

import uuid
from dataclasses import replace

from pyspark.sql.types import StructType

from sluice.connector import (
    PARTITION_ORDERED,
    UNORDERED,
    OptionError,
    Options,
    SinkConfig,
    SinkDataSource,
    SourceDataSource,
    TrackingSettings,
    TrackingStreamReader,
    check_dataframe_columns,
    check_option_columns,
    check_pushdown,
    check_unchanged_column,
    refuse_batch_options_in_stream,
    refuse_tracking_in_batch,
    to_arrow_schema,
)
from sluice.connectors.cassandra._client import Connection
from sluice.connectors.cassandra._lookup import CassandraLookupReader, plan_lookup
from sluice.connectors.cassandra._options import LOOKUP_SPEC, READ_SPEC, WRITE_SPEC, ReadOptions, WriteOptions
from sluice.connectors.cassandra._sink import CassandraWritePlan, RowPlan
from sluice.connectors.cassandra._source import (
    CassandraBatchReader,
    CassandraEnumerator,
    CassandraPushdownReader,
    CassandraReader,
    check_columns,
)
from sluice.connectors.cassandra._table import TableInfo, describe
from sluice.connectors.cassandra._tracking import (
    CassandraTrackingEnumerator,
    CassandraTrackingReader,
    TrackingCql,
    tracking_kind,
)
from sluice.connectors.cassandra._types import spark_type, write_problem

STREAM_CONSISTENCY = "LOCAL_QUORUM"

NO_TRANSACTIONS = (
    "sink.transactional=true: Cassandra has no transactions sluice could commit a write or micro-batch in. Every "
    "row already carries its write timestamp, so a retried or replayed batch rewrites the same cells and changes "
    "nothing (write.timestamp=micro-batch or write.timestamp-column make replays exact; docs/cassandra.md). Remove "
    "sink.transactional."
)


class CassandraDataSource(SinkDataSource, SourceDataSource):
    """`format("cassandra")`: see the package docstring for usage."""

    format_name = "cassandra"
    no_transactions = NO_TRANSACTIONS
    refused_writes = ("A row with a null primary key or write.timestamp-column value, or a value its column cannot "
                      "take, refused before sending; a statement Cassandra refuses for what it holds (InvalidRequest: "
                      "an empty or over-64 KiB key, a negative or too large TTL, an oversized mutation, a guardrail), "
                      "found in its batch by splitting it.")

    write_spec = WRITE_SPEC
    read_spec = READ_SPEC
    lookup_spec = LOOKUP_SPEC
    refused_reads = ("a row with a value that has no form in its column's Spark type (a varint or decimal beyond "
                     "decimal(38,0) or decimal(38,18), a date outside years 1-9999, a value out of a narrower type a "
                     "schema given to the read sets), sent aside with its values as the driver read them; a "
                     "timestamp outside years 1-9999 fails its whole page in the driver, so the read fails naming "
                     "no row")

    def _table(self, opts: Options) -> tuple[Connection, TableInfo]:
        """The cluster and table, described once per planned write."""
        conn = Connection.from_options(opts)
        return conn, self.learn_once(conn, lambda: describe(conn))

    def primary_key(self, opts: Options) -> tuple[str, ...]:
        """The table's partition key: rows of one partition share a task and, with batch.grouping=partition,
        a batch."""
        return self._table(opts)[1].partition_key

    def write_order(self, opts: Options, schema: StructType) -> tuple[str, ...]:
        """One partition's rows side by side in its task: each UNLOGGED batch then holds up to a whole partition,
        not the few of its rows that happened to be buffered together."""
        return self._table(opts)[1].partition_key if WriteOptions.of(opts).batch_grouping == "partition" else ()

    def sink_config(self, opts: Options, schema: StructType) -> SinkConfig:
        config = super().sink_config(opts, schema)
        if WriteOptions.of(opts).batch_grouping != "partition":
            # Every row carries its write timestamp, so batches of any rows may go in any order: unordered, unless
            # the write asked for a mode or a partition-ordered setting itself.
            ordered = ("sink.mode", "sink.partition-key", "sink.parallelism", "sink.flush-on-checkpoint",
                       "sink.batch-by")
            return config if any(opts.is_set(o) for o in ordered) else replace(config, mode=UNORDERED,
                                                                              partition_key=())
        partition_key = self._table(opts)[1].partition_key
        if config.mode != PARTITION_ORDERED or config.partition_key != partition_key:
            raise OptionError(f"batch.grouping=partition batches rows by the table's partition key "
                              f"{list(partition_key)}, which needs sink.mode=partition-ordered by exactly that key "
                              f"(got sink.mode={config.mode}, sink.partition-key={list(config.partition_key)}). "
                              "Remove sink.mode and sink.partition-key, or use batch.grouping=mixed or none.")
        if opts.is_set("sink.batch-by") and config.batch_by != "key":
            raise OptionError("batch.grouping=partition makes every batch one partition key (sink.batch-by=key); "
                              "remove sink.batch-by.")
        return replace(config, batch_by="key")

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig,
                   overwrite: bool) -> CassandraWritePlan:
        if overwrite:
            raise OptionError("format 'cassandra' cannot overwrite atomically; TRUNCATE the table first, then use "
                              "mode('append').")
        conn, info = self._table(opts)
        options = WriteOptions.of(opts)
        table = conn.target
        names = schema.fieldNames()
        special = {"upsert.op-column": options.upsert_op_column,
                   "write.timestamp-column": options.write_timestamp_column,
                   "write.ttl-column": options.write_ttl_column,
                   "upsert.unchanged-column": options.upsert_unchanged_column}
        check_option_columns(special, names)
        check_unchanged_column(to_arrow_schema(schema), options.upsert_unchanged_column, info.primary_key)
        if options.write_timestamp_column and opts.is_set("write.timestamp"):
            raise OptionError("write.timestamp and write.timestamp-column both say where timestamps come from; "
                              "keep one.")
        if options.write_ttl_column and options.write_ttl:
            raise OptionError("write.ttl and write.ttl-column both set the TTL; keep one.")
        columns = [c for c in names if c not in special.values()]
        check_dataframe_columns(columns, info.columns, table)
        missing = [c for c in info.primary_key if c not in columns]
        if missing:
            raise OptionError(f"the DataFrame has no column {missing} of {table}'s primary key "
                              f"({info.key_description()}); every row needs its whole primary key.")
        for name in columns:
            problem = write_problem(info.columns[name], schema[name].dataType, f"column '{name}'")
            if problem:
                raise OptionError(f"{problem} ({table}).")
        _check_special_types(schema, options)
        timestamp = "column" if options.write_timestamp_column else options.write_timestamp
        rows = RowPlan(tuple(columns), {c: info.columns[c] for c in columns}, info.primary_key,
                       options.upsert_op_column, timestamp, options.write_timestamp_column, options.write_ttl,
                       options.write_ttl_column, options.write_ignore_nulls, options.upsert_unchanged_column)
        return CassandraWritePlan(self.format_name, opts, schema, config, conn, rows, options)

    # ------------------------------------------------------------------ reading
    def _read_parts(self) -> tuple[ReadOptions, TableInfo]:
        options = ReadOptions.of(self.read_options())
        check_pushdown(options.pushdown)
        return options, describe(options.conn)

    def schema(self) -> StructType:
        from pyspark.sql.types import StructField

        options, info = self._read_parts()
        if self.read_options()["tracking.column"]:  # a readStream's (a batch read refuses it): checked at load()
            self._tracking(options, info)
        return StructType([StructField(name, spark_type(kind, name)) for name, kind in info.columns.items()])

    def reader(self, schema: StructType) -> CassandraBatchReader:
        refuse_tracking_in_batch(self.read_options(), self.format_name)
        options, info = self._read_parts()
        conn = options.conn
        check_columns(info, schema.fieldNames(), conn)
        reader = CassandraReader(conn, info, to_arrow_schema(schema), options.read_fetch_size,
                                 options.read_consistency, self.dead_letters(self.read_options(), streaming=False),
                                 f"read-{uuid.uuid4().hex[:12]}")
        enumerator = CassandraEnumerator(conn, options.partitions, options.read_split_size_mb * 1024 * 1024)
        kind = CassandraPushdownReader if options.pushdown else CassandraBatchReader
        return kind(enumerator, reader, None, reads=self.read_observer())

    def _tracking(self, options: ReadOptions, info: TableInfo) -> tuple[TrackingSettings, TrackingCql]:
        opts = self.read_options()
        settings = TrackingSettings.of(opts, self.format_name)
        kind = tracking_kind(info, settings, options.conn.target)
        # A row the head saw on one replica and the range's read missed on another would be passed for good: the
        # stream reads at LOCAL_QUORUM unless told (with writes at LOCAL_QUORUM too, every read sees every write).
        consistency = options.read_consistency if opts.is_set("read.consistency") else STREAM_CONSISTENCY
        return settings, TrackingCql(options.conn, info, settings.column, kind, consistency)

    def streamReader(self, schema: StructType) -> TrackingStreamReader:
        """readStream: the rows a tracking column with an SAI index finds (_tracking.py, docs/tracking.md)."""
        refuse_batch_options_in_stream(self.read_options(), self.format_name, ("read.split-size-mb", "pushdown"))
        if self.read_options().is_set("tracking.rows-per-task"):
            raise OptionError("option 'tracking.rows-per-task' does not apply to format('cassandra'): a micro-batch "
                              "is read in `partitions` slices of the token ring (default 1), not cut by rows "
                              "(counting them means reading them). Remove it; set partitions instead.")
        options, info = self._read_parts()
        settings, cql = self._tracking(options, info)
        settings = replace(settings, rows_per_task=0)
        conn = options.conn
        check_columns(info, schema.fieldNames(), conn)
        rows = CassandraReader(conn, info, to_arrow_schema(schema), options.read_fetch_size, cql.consistency,
                               self.dead_letters(self.read_options(), streaming=True),
                               f"read-{uuid.uuid4().hex[:12]}", streaming=True)
        reads = self.read_observer(event_time=settings.column if cql.kind == "timestamp" else None)
        return TrackingStreamReader(CassandraTrackingEnumerator(cql, settings.column, options.partitions or 1),
                                    CassandraTrackingReader(rows, cql), settings,
                                    source=(self.format_name, f"{conn.keyspace}.{conn.table}"), reads=reads)

    # ------------------------------------------------------------------ lookup joins
    def lookup_reader(self, opts: Options, on: tuple[str, ...],
                      columns: tuple[str, ...] | None) -> CassandraLookupReader:
        """sluice.lookup(df, "cassandra", ...): prepared, token-aware SELECTs (an IN per replica's group of keys of a
        one-column partition key, else one per partition), run concurrently (_lookup.py)."""
        return plan_lookup(opts, on, columns)


def _check_special_types(schema: StructType, options: WriteOptions) -> None:
    from pyspark.sql import types as T

    stamp = options.write_timestamp_column
    if stamp and not isinstance(schema[stamp].dataType, T.LongType | T.TimestampType):
        raise OptionError(f"write.timestamp-column '{stamp}' is {schema[stamp].dataType.simpleString()}; it must be "
                          "a long (microseconds since the epoch) or a timestamp.")
    ttl = options.write_ttl_column
    if ttl and not isinstance(schema[ttl].dataType, T.IntegerType | T.LongType | T.ShortType):
        raise OptionError(f"write.ttl-column '{ttl}' is {schema[ttl].dataType.simpleString()}; it must be an "
                          "integer number of seconds.")
