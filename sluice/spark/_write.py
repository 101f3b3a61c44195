"""One-call writes that put every row of a partition key into one Spark task."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.engine import PARTITION_ORDERED
from sluice.spark._registry import data_source_class

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def partitioned(df: DataFrame, format: str, options: dict[str, Any], num_partitions: int | None = None) -> DataFrame:
    """`df` repartitioned by the sink's partition key when sink.mode=partition-ordered, else unchanged.

    Per-key order across tasks needs every row of a key in one task; Spark's hash repartition keeps
    the relative order of one input partition's rows, so each key's rows stay in order per source task.
    """
    source = data_source_class(format)(options={k: str(v) for k, v in options.items()})
    opts = source.parsed()
    if opts["sink.mode"] != PARTITION_ORDERED:
        return df
    key = source.sink_config(opts, df.schema).partition_key
    if num_partitions:
        return df.repartition(num_partitions, *key)
    return df.repartition(*key)


def write(df: DataFrame, format: str, options: dict[str, Any], mode: str = "append",
          num_partitions: int | None = None) -> None:
    options = {k: str(v) for k, v in options.items()}
    partitioned(df, format, options, num_partitions).write.format(format).options(**options).mode(mode).save()
