"""Which formats sluice provides, and registering them with a SparkSession."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sluice.spark._datasource import SluiceDataSource

# format name -> "module:class"; imported on use so a connector's client library loads only when needed.
BUILTIN_FORMATS: Mapping[str, str] = MappingProxyType({
    "sluice_null": "sluice.connectors.null:NullDataSource",
    "s2": "sluice.connectors.s2:S2DataSource",
    "s2_upsert": "sluice.connectors.s2:S2UpsertDataSource",
    "postgres": "sluice.connectors.postgres:PostgresDataSource",
    "postgres_changes": "sluice.connectors.postgres:PostgresChangesDataSource",
    "clickhouse": "sluice.connectors.clickhouse:ClickHouseDataSource",
    "cassandra": "sluice.connectors.cassandra:CassandraDataSource",
    "elasticsearch": "sluice.connectors.elasticsearch:ElasticsearchDataSource",
    "hbase": "sluice.connectors.hbase:HBaseDataSource",
    "sluice_kafka": "sluice.connectors.kafka:KafkaDataSource",
    "tablestore": "sluice.tablestore:TableStoreDataSource",
})
# What register() and sluice.write() know: the built-ins plus any added with add_format (e.g. test formats).
FORMATS: dict[str, str] = dict(BUILTIN_FORMATS)


def add_format(format_name: str, target: str) -> None:
    """Make another format ("module:class": a SinkDataSource and/or SourceDataSource) known to register() and
    sluice.write()."""
    FORMATS[format_name] = target


def data_source_class(format_name: str) -> type[SluiceDataSource]:
    target = FORMATS.get(format_name)
    if target is None:
        from sluice._errors import OptionError

        raise OptionError(f"'{format_name}' is not a sluice format; sluice formats: {', '.join(sorted(FORMATS))}")
    module, _, attr = target.partition(":")
    return cast("type[SluiceDataSource]", getattr(importlib.import_module(module), attr))


# The top-level modules through which Spark finds the built-in formats by itself (see pyspark_sluice_*.py).
DISCOVERY_MODULES: Mapping[str, str] = MappingProxyType({
    "sluice_null": "pyspark_sluice_null", "s2": "pyspark_sluice_s2", "s2_upsert": "pyspark_sluice_s2_upsert",
    "postgres": "pyspark_sluice_postgres", "postgres_changes": "pyspark_sluice_postgres_changes",
    "clickhouse": "pyspark_sluice_clickhouse", "cassandra": "pyspark_sluice_cassandra",
    "elasticsearch": "pyspark_sluice_elasticsearch", "hbase": "pyspark_sluice_hbase",
    "sluice_kafka": "pyspark_sluice_kafka",
    "tablestore": "pyspark_sluice_tablestore",
    "sluice_summary": "pyspark_sluice_summary",
})


def _discovered(name: str) -> bool:
    """Whether Spark registers `name` by itself (its pyspark_sluice_* module is on this Python's path)."""
    module = DISCOVERY_MODULES.get(name)
    return module is not None and importlib.util.find_spec(module) is not None


def register(spark: SparkSession) -> list[str]:
    """Register the formats Spark does not find by itself: added ones (add_format), or every one where sluice's
    discovery modules are not on the path. Registering a discovered one again only makes Spark warn."""
    from sluice.spark._summary import SummaryDataSource

    for name in FORMATS:
        if not _discovered(name):
            spark.dataSource.register(data_source_class(name))
    if not _discovered("sluice_summary"):
        spark.dataSource.register(SummaryDataSource)
    return list(FORMATS)
