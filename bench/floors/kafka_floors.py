"""The floors of bench/stores/kafka_sink_source.py's source contenders: confluent-kafka's Consumer without Spark, and a
Python data source that hands Spark ready-made Arrow batches without Kafka."""

from __future__ import annotations

import time
from functools import partial
from operator import is_not
from typing import Any

FETCH = 10_000  # records per consume() call and rows per Arrow batch, as the sluice_kafka reader's


def consume(config: dict[str, Any], topic: str, partitions: list[int]) -> tuple[int, float]:
    """Read `partitions` of `topic` (written without transactions: a record per offset) from their first offset to
    their high watermark with one consumer (`config`: the client's, with the source's CONSUMER_DEFAULTS), keeping
    the Message objects only (no field read). Each fetch asks for no
    more than is left, so the last one returns as soon as its records are in (not at consume()'s timeout). Returns
    the records read and the seconds it took after the consumer was made."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

    consumer = Consumer({**config, "group.id": "bench-floor", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    started = time.perf_counter()
    try:
        expected = 0
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            expected += high - low
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records = 0
        while records < expected:
            messages = consumer.consume(min(FETCH, expected - records), timeout=1.0)
            errors = list(filter(partial(is_not, None), map(Message.error, messages)))
            if errors:
                raise RuntimeError(f"consumer error: {errors[0]}")
            records += len(messages)
    finally:
        consumer.close()
    return records, time.perf_counter() - started


def consume_per_partition(pool: Any, config: dict[str, Any], topic: str, partitions: int) -> int:
    """A process per partition (`pool`: a process pool, started before the clock), as Spark's tasks are."""
    return sum(n for n, _ in pool.starmap(consume, [(config, topic, [p]) for p in range(partitions)]))


def register_arrow_floor(spark: Any, rows: int, partitions: int, value_bytes: int) -> str:
    """Registers a Python data source of sluice_kafka's schema (without headers) whose `partitions` tasks yield
    `rows` rows in all as Arrow batches of FETCH rows: keys are the ids as text (those the bench wrote, so the
    query's sums check out), values `value_bytes` of 'v'; each batch's columns are cut from arrays made once per
    task with Arrow's compute functions, so no Python runs per row. Returns the format name."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from sluice.connectors.kafka._reader import SCHEMA

    class FloorReader(DataSourceReader):
        def partitions(self):
            share = -(-rows // partitions)
            return [InputPartition((lo, min(lo + share, rows))) for lo in range(0, rows, share)]

        def read(self, partition):
            import pyarrow as pa
            import pyarrow.compute as pc

            lo, hi = partition.value
            n = hi - lo
            ids = pa.array(range(lo, hi), pa.int64())
            keys = pc.cast(pc.cast(ids, pa.string()), pa.binary())
            values = pa.repeat(pa.scalar(b"v" * value_bytes, pa.binary()), n)
            stamps = pa.repeat(pa.scalar(1_700_000_000_000_000, pa.timestamp("us", tz="UTC")), n)
            schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                                ("partition", pa.int32()), ("offset", pa.int64()),
                                ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())])
            topic = pa.repeat(pa.scalar("bench", pa.string()), FETCH)
            partition_ids = pa.repeat(pa.scalar(0, pa.int32()), FETCH)
            kinds = pa.repeat(pa.scalar(0, pa.int32()), FETCH)
            for at in range(0, n, FETCH):
                m = min(FETCH, n - at)
                yield pa.RecordBatch.from_arrays(
                    [keys.slice(at, m), values.slice(at, m), topic.slice(0, m), partition_ids.slice(0, m),
                     ids.slice(at, m), stamps.slice(at, m), kinds.slice(0, m)], schema=schema)

    class ArrowFloor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_arrow_floor"

        def schema(self) -> str:
            return SCHEMA

        def reader(self, schema):
            return FloorReader()

    spark.dataSource.register(ArrowFloor)
    return ArrowFloor.name()
