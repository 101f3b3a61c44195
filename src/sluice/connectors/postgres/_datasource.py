"""`format("postgres")`: the Spark data source; options in _options.py, writes in _sink.py, reads in _source.py."""

from __future__ import annotations

from pyspark.sql.types import StructType

from sluice.connector import (
    PARTITION_ORDERED,
    Options,
    SinkConfig,
    SinkDataSource,
    SourceDataSource,
    check_pushdown,
    to_arrow_schema,
)
from sluice.connectors.postgres._client import Connection
from sluice.connectors.postgres._options import READ_SPEC, WRITE_SPEC, ReadOptions, WriteOptions
from sluice.connectors.postgres._sink import PostgresWritePlan
from sluice.connectors.postgres._source import (
    PostgresBatchReader,
    PostgresEnumerator,
    PostgresPushdownReader,
    PostgresSplitReader,
    infer_schema,
)
from sluice.connectors.postgres._table import prepare_target


class PostgresDataSource(SinkDataSource, SourceDataSource):
    """`format("postgres")`: see the package docstring for usage."""

    format_name = "postgres"

    write_spec = WRITE_SPEC
    read_spec = READ_SPEC

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
        return infer_schema(options.conn, options)[0]

    def reader(self, schema: StructType) -> PostgresBatchReader:
        options = self._typed_read_options()
        _, columns, primary_key = infer_schema(options.conn, options)
        kind = PostgresPushdownReader if options.pushdown else PostgresBatchReader
        return kind(PostgresEnumerator(options.conn, options, columns, primary_key),
                    PostgresSplitReader(options.conn, options, columns, schema), None,
                    reads=self.read_observer())
