"""`format("clickhouse")`: the Spark data source; writes in _sink.py, reads in _source.py."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql.types import StructType

from sluice.connector import (
    PARTITION_ORDERED,
    UNORDERED,
    EngineDataSource,
    OptionError,
    Options,
    SinkConfig,
    SplitBatchReader,
)
from sluice.connectors.clickhouse._client import Connection
from sluice.connectors.clickhouse._sink import WRITE_SPEC, ClickHouseWritePlan, InsertPlan
from sluice.connectors.clickhouse._source import (
    READ_SPEC,
    ClickHouseEnumerator,
    ClickHouseReader,
    check_final,
    read_schema,
)
from sluice.connectors.clickhouse._table import TableInfo, describe

NO_TRANSACTIONS = (
    "sink.transactional=true: ClickHouse has no commit sluice can make exactly-once. Its atomic step (ATTACH "
    "PARTITION ... FROM a staging table) is atomic per partition only and cannot be tied to a commit record, so a "
    "driver that died between the two would apply a micro-batch twice on replay. For results without duplicates, "
    "write into a ReplacingMergeTree table: a replayed or retried row replaces itself (docs/clickhouse.md). "
    "Remove sink.transactional."
)


# Spark type names (DataType.typeName()) each ClickHouse base type takes.
NUMBERS = {"byte", "short", "integer", "long", "float", "double", "decimal", "boolean"}
ACCEPTS = {"String": {"string", "binary"}, "Date": {"date"}, "DateTime": {"timestamp", "timestamp_ntz"},
           "Decimal": NUMBERS - {"boolean"}}


def check_compatible(schema: StructType, types: dict, table: str) -> None:
    """On the driver: every DataFrame column's Spark type must be one its ClickHouse column can take."""
    for field in schema.fields:
        kind = types[field.name]
        accepted = ACCEPTS.get(kind.base, NUMBERS)
        spark_type = field.dataType.typeName()
        if spark_type not in accepted:
            raise OptionError(f"column '{field.name}' is {field.dataType.simpleString()} in the DataFrame but "
                              f"{kind.name} in {table}; cast it first (it takes {', '.join(sorted(accepted))}).")


class ClickHouseDataSource(EngineDataSource):
    """`format("clickhouse")`: see the package docstring for usage."""

    format_name = "clickhouse"

    write_spec = WRITE_SPEC
    read_spec = READ_SPEC

    def _table(self, opts: Options) -> tuple[Connection, TableInfo]:
        conn = Connection.from_options(opts)
        return conn, describe(conn)

    def primary_key(self, opts: Options) -> tuple[str, ...]:
        """A ReplacingMergeTree table's sorting key: the default partition key of partition-ordered writes."""
        _, info = self._table(opts)
        return info.sorting_key if info.replacing else ()

    def sink_config(self, opts: Options, schema: StructType) -> SinkConfig:
        if opts["sink.transactional"]:
            raise OptionError(NO_TRANSACTIONS)
        config = super().sink_config(opts, schema)
        _, info = self._table(opts)
        if not info.replacing or info.version_column:
            return config
        # ReplacingMergeTree without a version column keeps the last inserted row of a key: keep each key's order.
        key = tuple(c for c in info.sorting_key if c in schema.fieldNames())
        if opts.is_set("sink.mode"):
            if config.mode == UNORDERED:
                raise OptionError(f"sink.mode=unordered into ReplacingMergeTree table {opts['database']}."
                                  f"{opts['table']} (no version column): the last inserted row of a key wins, so a "
                                  "key's changes must not overtake each other. Use sink.mode=partition-ordered "
                                  "(the default for this table) or add a version column: ReplacingMergeTree(ver).")
            return config
        if len(key) != len(info.sorting_key):
            raise OptionError(f"table {opts['database']}.{opts['table']} is a ReplacingMergeTree sorted by "
                              f"{list(info.sorting_key)}, which are not all DataFrame columns: set sink.mode and "
                              "sink.partition-key yourself (rows of one key must keep their order).")
        return replace(config, mode=PARTITION_ORDERED, partition_key=key)

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig,
                   overwrite: bool) -> ClickHouseWritePlan:
        if overwrite:
            raise OptionError("format 'clickhouse' cannot overwrite atomically; TRUNCATE TABLE first (or write into "
                              "a new table and EXCHANGE/RENAME it), then use mode('append').")
        conn, info = self._table(opts)
        columns = schema.fieldNames()
        for name in columns:
            if name not in info.types:
                close = [c for c in info.types if c.lower() == name.lower()]
                hint = f" (the table has '{close[0]}': names are case-sensitive)" if close else ""
                raise OptionError(f"column '{name}' of the DataFrame is not in table {conn.database}.{conn.table}"
                                  f"{hint}; table columns: {list(info.types)}. Drop or rename it.")
        for name in info.types:
            if name not in columns and name not in info.defaults and name in info.sorting_key:
                raise OptionError(f"column '{name}' is in the sorting key of {conn.database}.{conn.table} and has "
                                  "no default; the DataFrame must have it.")
        types = info.column_types(columns)
        check_compatible(schema, types, f"{conn.database}.{conn.table}")
        insert = InsertPlan(conn, tuple(columns), types, tuple(c for c in info.sorting_key if c in columns))
        return ClickHouseWritePlan(self.format_name, opts, schema, config, insert)

    # ------------------------------------------------------------------ reading
    def _read_parts(self) -> tuple[Options, Connection, TableInfo]:
        opts = READ_SPEC.parse(self.options)
        conn = Connection.from_options(opts)
        return opts, conn, describe(conn)

    def schema(self) -> StructType:
        from sluice.spark._compat import from_arrow_schema

        _, _, info = self._read_parts()
        return from_arrow_schema(read_schema(info)[1])

    def reader(self, schema: StructType) -> SplitBatchReader:
        opts, conn, info = self._read_parts()
        types, arrow_schema = read_schema(info)
        wanted = [f for f in arrow_schema if f.name in schema.fieldNames()]
        missing = [n for n in schema.fieldNames() if n not in arrow_schema.names]
        if missing:
            raise OptionError(f"column(s) {missing} of the given schema are not in {conn.database}.{conn.table}")
        import pyarrow as pa

        reader = ClickHouseReader(conn, types, pa.schema(wanted), check_final(info, opts["final"]))
        return SplitBatchReader(ClickHouseEnumerator(conn, info, types, opts["partitions"]), reader, None)
