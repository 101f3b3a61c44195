"""One-call writes that put every row of a partition key into one Spark task."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.spark._registry import data_source_class

_POSITION = "__sluice_input_position"

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def partitioned(df: DataFrame, format: str, options: dict[str, Any], num_partitions: int | None = None) -> DataFrame:
    """`df` laid out for the sink's guarantee: rows that must share a task are put in one.

    partition-ordered: repartitioned by the partition key. A store may ask for more (S2 exactly-once:
    by the columns of the stream template, or a single task for a single stream). Spark's hash
    repartition keeps the relative order of one input partition's rows, so each key's rows stay in order
    per source task. A store that groups rows into batches by some columns (Cassandra's partition key) has
    each task's rows sorted by them (batch writes; a streaming DataFrame keeps its order).
    """
    from pyspark.sql.functions import monotonically_increasing_id

    source = data_source_class(format)(options={k: str(v) for k, v in options.items()})
    opts = source.write_options()
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


def write(df: DataFrame, format: str, options: dict[str, Any], mode: str = "append",
          num_partitions: int | None = None) -> None:
    from sluice.metrics._progress import WriteProgress
    from sluice.metrics._server import find_target

    options = {k: str(v) for k, v in options.items()}
    writer = partitioned(df, format, options, num_partitions).write.format(format).options(**options).mode(mode)
    target = find_target()  # a collector its tasks report to: then a long write prints its progress
    if target is None:
        writer.save()
        return
    with WriteProgress(format, target):
        writer.save()
