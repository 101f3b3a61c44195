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

    def schema(self) -> StructType:
        return spark_schema(resolve(ChangeOptions.of(self.read_options())))

    def reader(self, schema: StructType) -> Any:
        raise OptionError("format 'postgres_changes' is a stream (spark.readStream); for a batch read of the tables "
                          "use format('postgres')")

    def streamReader(self, schema: StructType) -> ChangeStreamReader:
        options = ChangeOptions.of(self.read_options())
        return ChangeStreamReader(resolve(options), options, schema, self.read_observer(event_time=COMMIT_TIME))
