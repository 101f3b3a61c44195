"""format("postgres_changes"): the Spark data source (a stream only; see the package docstring, docs/postgres.md)."""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import StructType

from sluice.connector import OptionError, SourceDataSource
from sluice.connectors.postgres._pgoutput import COMMIT_TIME
from sluice.connectors.postgres.changes._options import CHANGES_SPEC, ChangeOptions
from sluice.connectors.postgres.changes._publication import resolve, spark_schema
from sluice.connectors.postgres.changes._stream import ChangeStreamReader


class PostgresChangesDataSource(SourceDataSource):
    """`spark.readStream.format("postgres_changes")`: see the package docstring; docs/postgres.md."""

    format_name = "postgres_changes"
    read_spec = CHANGES_SPEC
    read_api = "spark.readStream"
    write_with = "postgres"
    refused_reads = ("a change with a value that does not convert to its column's Spark type (a numeric NaN or "
                     "Infinity in a decimal column, a date or timestamp out of Spark's range), sent aside as its "
                     "table, commit LSN, op, key and values as PostgreSQL's text")

    def schema(self) -> StructType:
        return spark_schema(resolve(ChangeOptions.of(self.read_options())))

    def reader(self, schema: StructType) -> Any:
        raise OptionError("format 'postgres_changes' is a stream (spark.readStream); for a batch read of the tables "
                          "use format('postgres')")

    def streamReader(self, schema: StructType) -> ChangeStreamReader:
        opts = self.read_options()
        options = ChangeOptions.of(opts)
        # Only a micro-batch's changes send records aside, and one task reads them (ChangeStreamReader.plan).
        route = self.dead_letters(opts, streaming=True, one_task=True)
        return ChangeStreamReader(resolve(options), options, schema, self.read_observer(event_time=COMMIT_TIME),
                                  dead_letters=route)
