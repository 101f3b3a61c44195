"""Which formats sluice provides, and registering them with a SparkSession."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sluice.spark._datasource import EngineDataSource

# format name -> "module:class"; imported on use so a connector's client library loads only when needed.
FORMATS: dict[str, str] = {
    "sluice_null": "sluice.connectors.null:NullDataSource",
}


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
    for name in FORMATS:
        spark.dataSource.register(data_source_class(name))
    return list(FORMATS)
