"""One-call writes that put every row of a partition key into one Spark task."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from sluice.spark._registry import data_source_class

_POSITION = "__sluice_input_position"

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sluice.sink._datasource import SinkDataSource


def partitioned(df: DataFrame, format: str, options: Mapping[str, object],
                num_partitions: int | None = None) -> DataFrame:
    """`df` laid out for the sink's guarantee: rows that must share a task are put in one.

    partition-ordered: repartitioned by the partition key. A store may ask for more (S2 exactly-once:
    by the columns of the stream template, or a single task for a single stream). Spark's hash
    repartition keeps the relative order of one input partition's rows, so each key's rows stay in order
    per source task. A store that groups rows into batches by some columns (Cassandra's partition key) has
    each task's rows sorted by them (batch writes; a streaming DataFrame keeps its order).
    """
    from pyspark.sql.functions import monotonically_increasing_id

    # A format one writes to is a sink (write_options() refuses the others).
    source = cast("SinkDataSource", data_source_class(format)(options={k: str(v) for k, v in options.items()}))
    opts = source.write_options()
    df = source.with_layout_columns(opts, df)
    columns = source.partitioning(opts, df.schema)
    if columns is None:
        return df
    if not columns:
        return df.coalesce(1)
    count = num_partitions or _own_partition_count(df)
    order = () if df.isStreaming else source.write_order(opts, df.schema)
    if order:
        # Spark's sort is not stable: the input position breaks ties, so one key's rows keep their order.
        df = df.withColumn(_POSITION, monotonically_increasing_id())
    # Spark Connect has no partition count to ask for: hash-repartition without one, so adaptive execution
    # sizes the shuffle by the data (a small write becomes one task, not 200).
    df = df.repartition(*columns) if count is None else df.repartition(count, *columns)
    if order:
        df = df.sortWithinPartitions(*order, _POSITION).drop(_POSITION)
    return df


def _own_partition_count(df: DataFrame) -> int | None:
    """How many tasks the DataFrame already runs in (the write keeps that fan-out), when Spark can say."""
    from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

    if not isinstance(df, ClassicDataFrame):  # Spark Connect
        return None
    if df.isStreaming:  # a streaming plan has no RDD; one task per core of the cluster
        return df.sparkSession.sparkContext.defaultParallelism
    return max(1, df.rdd.getNumPartitions())


_CAPS = ("sink.rate.records-per-second", "sink.rate.bytes-per-second")


def _with_rate_tasks(df: DataFrame, options: dict[str, str], num_partitions: int | None) -> dict[str, str]:
    """A rate cap's sink.rate.tasks, when the write sets a cap and not it: the tasks that can write at once, the
    smaller of the write's partitions and Spark's default parallelism (its task slots). Unknown on Spark Connect:
    then the options stay as they are and the write says to set it."""
    if "sink.rate.tasks" in options or not any(key in options for key in _CAPS):
        return options
    count = num_partitions or _own_partition_count(df)
    if count is None:
        return options
    slots = df.sparkSession.sparkContext.defaultParallelism
    return {**options, "sink.rate.tasks": str(max(1, min(count, slots)))}


def write(df: DataFrame, format: str, options: Mapping[str, object], mode: str = "append",
          num_partitions: int | None = None) -> None:
    from sluice.metrics._progress import WriteProgress
    from sluice.metrics._server import find_target

    strings = _with_rate_tasks(df, {k: str(v) for k, v in options.items()}, num_partitions)
    writer = partitioned(df, format, strings, num_partitions).write.format(format).options(**strings).mode(mode)
    target = find_target()  # a collector its tasks report to: then a long write prints its progress
    if target is None:
        writer.save()
        return
    with WriteProgress(format, target):
        writer.save()
