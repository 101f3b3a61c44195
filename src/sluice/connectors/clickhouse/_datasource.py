"""`format("clickhouse")`: the Spark data source; writes in _sink.py, reads in _source.py."""

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
    SplitBatchReader,
    TrackingSettings,
    TrackingStreamReader,
    check_option_columns,
    check_unchanged_column,
    from_arrow_schema,
    new_columns,
    refuse_batch_options_in_stream,
    refuse_tracking_in_batch,
    to_arrow_schema,
)
from sluice.connectors.clickhouse._client import Connection, quote_ident
from sluice.connectors.clickhouse._lookup import ClickHouseLookupReader, plan_lookup
from sluice.connectors.clickhouse._options import LOOKUP_SPEC, READ_SPEC, WRITE_SPEC, ReadOptions, WriteOptions
from sluice.connectors.clickhouse._sink import ClickHouseWritePlan, Deletes, InsertPlan
from sluice.connectors.clickhouse._source import ClickHouseEnumerator, ClickHouseReader, check_final, read_schema
from sluice.connectors.clickhouse._table import TableInfo, describe
from sluice.connectors.clickhouse._tracking import (
    ClickHouseTrackingEnumerator,
    ClickHouseTrackingReader,
    ClickHouseTrackingSql,
    tracking_kind,
)
from sluice.connectors.clickhouse._types import CHType, column_sql_type, write_problem

NO_TRANSACTIONS = (
    "sink.transactional=true: ClickHouse has no transaction sluice could commit a write or micro-batch in. For "
    "exactly-once results use insert.deduplicate=true (each batch carries an insert_deduplication_token, so a "
    "retried or replayed batch is applied once), or write into a ReplacingMergeTree table, where a replayed row "
    "replaces itself (docs/clickhouse.md). Remove sink.transactional."
)


def check_compatible(schema: StructType, types: dict[str, CHType], table: str) -> None:
    """On the driver: every DataFrame column's Spark type must be one its ClickHouse column can take."""
    for field in schema.fields:
        problem = write_problem(types[field.name], field.dataType, f"column '{field.name}'")
        if problem:
            raise OptionError(f"{problem} ({table}).")


class ClickHouseDataSource(SinkDataSource, SourceDataSource):
    """`format("clickhouse")`: see the package docstring for usage."""

    format_name = "clickhouse"
    no_transactions = NO_TRANSACTIONS
    refused_writes = ("A row with a value its column cannot hold (out of the type's range, NULL in a non-Nullable "
                      "column or element, not an Enum name), found before anything is sent, or an INSERT ClickHouse "
                      "refuses for a row's content (a value that does not parse or fit, a string over a FixedString, "
                      "a CONSTRAINT ... CHECK), the batch split until the row is alone.")

    write_spec = WRITE_SPEC
    read_spec = READ_SPEC
    lookup_spec = LOOKUP_SPEC
    refused_reads = ("a row with a value that does not convert to the type a schema given to the read sets for its "
                     "column (text that is no number, a number out of a narrower type), sent aside as the row the "
                     "server sent; the table's own types never refuse one: the server casts every column to a type "
                     "Spark holds whole, and a String's bytes pass as they are, invalid UTF-8 included")

    def _table(self, opts: Options) -> tuple[Connection, TableInfo]:
        """The server and table, described once per planned write."""
        conn = Connection.from_options(opts)
        return conn, self.learn_once(conn, lambda: describe(conn))

    def primary_key(self, opts: Options) -> tuple[str, ...]:
        """A ReplacingMergeTree table's sorting key: the default partition key of partition-ordered writes."""
        _, info = self._table(opts)
        return info.sorting_key if info.replacing else ()

    def sink_config(self, opts: Options, schema: StructType) -> SinkConfig:
        config = super().sink_config(opts, schema)
        conn, info = self._table(opts)
        if not info.replacing or info.version_column:
            return config
        # ReplacingMergeTree without a version column keeps the last inserted row of a key: keep each key's order.
        key = tuple(c for c in info.sorting_key if c in schema.fieldNames())
        if opts.is_set("sink.mode"):
            if config.mode == UNORDERED:
                raise OptionError(f"sink.mode=unordered into ReplacingMergeTree table {conn.database}.{conn.table} "
                                  "(no version column): the last inserted row of a key wins, so a key's changes "
                                  "must not overtake each other. Use sink.mode=partition-ordered (the default for "
                                  "this table) or add a version column: ReplacingMergeTree(ver).")
            return config
        if len(key) != len(info.sorting_key):
            raise OptionError(f"table {conn.database}.{conn.table} is a ReplacingMergeTree sorted by "
                              f"{list(info.sorting_key)}, which are not all DataFrame columns: set sink.mode and "
                              "sink.partition-key yourself (rows of one key must keep their order).")
        return replace(config, mode=PARTITION_ORDERED, partition_key=key)

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig,
                   overwrite: bool) -> ClickHouseWritePlan:
        if overwrite:
            raise OptionError("format 'clickhouse' cannot overwrite atomically; TRUNCATE TABLE first (or write into "
                              "a new table and EXCHANGE/RENAME it), then use mode('append').")
        conn, info = self._table(opts)
        options = WriteOptions.of(opts)
        table = f"{conn.database}.{conn.table}"
        deletes = _deletes(options.upsert_op_column, schema, info, table)
        unchanged = options.upsert_unchanged_column
        check_unchanged_column(to_arrow_schema(schema), unchanged, info.sorting_key)
        columns = [c for c in schema.fieldNames() if (deletes is None or c != deletes.op_column) and c != unchanged]
        added = new_columns(columns, info.spelled, table, options.schema_evolution,
                            "Drop or rename it, or add it to the table")
        if added:  # schema.evolution=add-columns: before any row of the write is sent
            for name in added:
                kind = column_sql_type(schema[name].dataType, schema[name].nullable, f"column '{name}'")
                conn.query(f"ALTER TABLE {quote_ident(conn.database)}.{quote_ident(conn.table)} ADD COLUMN IF NOT "
                           f"EXISTS {quote_ident(name)} {kind}")
            info = describe(conn)
        for name in info.spelled:
            if name not in columns and name not in info.defaults and name in info.sorting_key:
                raise OptionError(f"column '{name}' is in the sorting key of {table} and has no default; the "
                                  "DataFrame must have it.")
        types = info.column_types(columns)
        check_compatible(StructType([schema[c] for c in columns]), types, table)
        if deletes is not None:
            columns.append(deletes.is_deleted_column)
        _check_deduplication(options, config, info, table)
        # async_insert=0 said, not left to the server: from 26.2/26.3 on its default is 1, which would put every
        # batch through the async queue, where deduplication follows other rules (async_insert_deduplicate).
        settings: dict[str, str | int] = {"input_format_null_as_default": 1 if deletes else 0, "async_insert": 0}
        if options.insert_async:
            settings.update(async_insert=1, wait_for_async_insert=1)
        insert = InsertPlan(conn, tuple(columns), types, tuple(c for c in info.sorting_key if c in columns), deletes,
                            options.insert_deduplicate, settings, unchanged)
        return ClickHouseWritePlan(self.format_name, opts, schema, config, insert, options.connections_per_task)

    # ------------------------------------------------------------------ reading
    def _read_parts(self) -> tuple[ReadOptions, TableInfo]:
        options = ReadOptions.of(self.read_options())
        return options, describe(options.conn)

    def schema(self) -> StructType:
        options, info = self._read_parts()
        opts = self.read_options()
        if opts["tracking.column"]:  # a readStream's (a batch read refuses it): checked at load(), not at start
            self._tracking(opts, options, info)
        return from_arrow_schema(read_schema(info)[1])

    def _rows_reader(self, options: ReadOptions, info: TableInfo, schema: StructType,
                     streaming: bool) -> ClickHouseReader:
        """The reader of the schema's columns, cast to the schema's types (the server casts to the read types)."""
        conn = options.conn
        types, arrow_schema = read_schema(info)
        missing = [n for n in schema.fieldNames() if n not in arrow_schema.names]
        if missing:
            raise OptionError(f"column(s) {missing} of the given schema are not in {conn.database}.{conn.table}")
        route = self.dead_letters(self.read_options(), streaming)
        return ClickHouseReader(conn, types, to_arrow_schema(schema), check_final(info, options.final),
                                info.sorting_key, route, f"read-{uuid.uuid4().hex[:12]}", streaming)

    def reader(self, schema: StructType) -> SplitBatchReader:
        refuse_tracking_in_batch(self.read_options(), self.format_name)
        options, info = self._read_parts()
        reader = self._rows_reader(options, info, schema, streaming=False)
        return SplitBatchReader(ClickHouseEnumerator(options.conn, info, reader.types, options.partitions), reader,
                                None, reads=self.read_observer())

    def _tracking(self, opts: Options, options: ReadOptions, info: TableInfo) -> tuple[TrackingSettings,
                                                                                          ClickHouseTrackingSql]:
        settings = TrackingSettings.of(opts, self.format_name)
        types = info.column_types(list(info.spelled))
        tie_breaker = opts["tracking.tie-breaker"]
        table = f"table {options.conn.database}.{options.conn.table}"
        kind = tracking_kind(types, settings, tie_breaker, table)
        return settings, ClickHouseTrackingSql(options.conn, types, settings.column, kind, tie_breaker)

    def streamReader(self, schema: StructType) -> TrackingStreamReader:
        """readStream: the rows a tracking column finds (_tracking.py, docs/tracking.md)."""
        opts = self.read_options()
        refuse_batch_options_in_stream(opts, self.format_name, ("partitions",))
        options, info = self._read_parts()
        settings, sql = self._tracking(opts, options, info)
        rows = self._rows_reader(options, info, schema, streaming=True)
        reads = self.read_observer(event_time=settings.column if sql.kind == "timestamp" else None)
        return TrackingStreamReader(ClickHouseTrackingEnumerator(sql, settings.column, rows.final),
                                    ClickHouseTrackingReader(rows, sql), settings,
                                    source=(self.format_name, f"{options.conn.database}.{options.conn.table}"),
                                    reads=reads)

    # ------------------------------------------------------------------ lookup joins
    def lookup_reader(self, opts: Options, on: tuple[str, ...],
                      columns: tuple[str, ...] | None) -> ClickHouseLookupReader:
        """sluice.lookup(df, "clickhouse", ...): rows by key, `IN` a typed array parameter (_lookup.py)."""
        return plan_lookup(opts, on, columns)


def _deletes(op: str | None, schema: StructType, info: TableInfo, table: str) -> Deletes | None:
    """upsert.op-column (`op`): only into ReplacingMergeTree(ver, is_deleted), with the key and version in the
    DataFrame."""
    if op is None:
        return None
    check_option_columns({"upsert.op-column": op}, schema.fieldNames())
    if info.is_deleted_column is None:
        raise OptionError(f"upsert.op-column needs a table whose engine marks deletes, ReplacingMergeTree(ver, "
                          f"is_deleted); {table} is {info.engine} without an is_deleted column. Create it as "
                          "ENGINE = ReplacingMergeTree(ver, is_deleted) (is_deleted UInt8), or remove the option.")
    if info.is_deleted_column in schema.fieldNames():
        raise OptionError(f"column '{info.is_deleted_column}' is {table}'s is_deleted column, which upsert.op-column "
                          f"'{op}' sets: drop one of the two.")
    required = frozenset((*info.sorting_key, info.version_column or ""))
    missing = sorted(c for c in required if c and c not in schema.fieldNames())
    if missing:
        raise OptionError(f"upsert.op-column: a delete must carry the sorting key and the version of {table}, but "
                          f"the DataFrame has no column {missing}.")
    return Deletes(op, info.is_deleted_column, required - {""})


def _check_deduplication(options: WriteOptions, config: SinkConfig, info: TableInfo, table: str) -> None:
    if not options.insert_deduplicate:
        return
    if not info.deduplicates:
        raise OptionError(f"insert.deduplicate=true: {table} ({info.engine}) does not deduplicate inserts, so a "
                          "replayed batch would be inserted again. Enable it: ALTER TABLE ... MODIFY SETTING "
                          "non_replicated_deduplication_window = 1000 (Replicated and Shared engines always do), "
                          "or remove the option.")
    if options.insert_async:
        raise OptionError("insert.deduplicate=true with insert.async=true: an asynchronous insert is merged with "
                          "others before it is written, so its token cannot decide alone. Use one of the two.")
    if config.mode != UNORDERED:
        raise OptionError(f"insert.deduplicate=true cuts batches at fixed row positions, which sink.mode={config.mode}"
                          " does not allow; use sink.mode=unordered (into a ReplacingMergeTree table without a "
                          "version column, replays already replace themselves: remove insert.deduplicate).")
    if config.batch_creator is not None:
        raise OptionError("insert.deduplicate=true brings its own batch creator (batches at fixed row positions); "
                          "remove sink.batch-creator.")
