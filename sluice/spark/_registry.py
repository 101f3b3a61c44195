"""Which formats sluice provides, and registering them with a SparkSession."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sluice.spark._datasource import EngineDataSource

# format name -> "module:class"; imported on use so a connector's client library loads only when needed.
BUILTIN_FORMATS: Mapping[str, str] = MappingProxyType({
    "sluice_null": "sluice.connectors.null:NullDataSource",
    "s2": "sluice.connectors.s2:S2DataSource",
    "s2_upsert": "sluice.connectors.s2:S2UpsertDataSource",
    "postgres": "sluice.connectors.postgres:PostgresDataSource",
    "tablestore": "sluice.tablestore:TableStoreDataSource",
})
# What register() and sluice.write() know: the built-ins plus any added with add_format (e.g. test formats).
FORMATS: dict[str, str] = dict(BUILTIN_FORMATS)


def add_format(format_name: str, target: str) -> None:
    """Make another EngineDataSource ("module:class") known to register() and sluice.write()."""
    FORMATS[format_name] = target


def data_source_class(format_name: str) -> type[EngineDataSource]:
    target = FORMATS.get(format_name)
    if target is None:
        from sluice._errors import OptionError

        raise OptionError(f"'{format_name}' is not a sluice format; sluice formats: {', '.join(sorted(FORMATS))}")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def register(spark: SparkSession) -> list[str]:
    """Not needed where sluice is installed (Spark finds the pyspark_sluice_* modules); kept for added formats."""
    from sluice.spark._summary import SummaryDataSource

    for name in FORMATS:
        spark.dataSource.register(data_source_class(name))
    spark.dataSource.register(SummaryDataSource)
    return list(FORMATS)
