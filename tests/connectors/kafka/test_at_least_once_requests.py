"""What an at-least-once task costs the brokers: its batches are acknowledged together, once the producer's queue
drained, so the engine starts with several batches in flight (KafkaStore.window_start_batches) and librdkafka sends
each partition the records of many batches in one ProduceRequest, not a request per partition per batch; a record
Kafka refuses among batches in flight together still fails the task, named."""

import uuid

import pyarrow as pa
import pytest

from sluice.connector import SinkConfig, SinkError, WriteContext
from sluice.connectors.kafka import KafkaDataSource
from sluice.connectors.kafka._checks import RecordColumns
from sluice.connectors.kafka._options import WriteOptions
from sluice.connectors.kafka._partitioner import kafka_partitions
from sluice.connectors.kafka._sink import KafkaWritePlan
from sluice.engine import AsyncSinkWriter
from sluice.testing import read_committed
from tests.connectors.kafka.requests_counted import counting_requests
from tests.faults import poll_until

PARTITIONS, BATCHES, PER_BATCH = 12, 5, 120


def unordered_task(kafka, topic, partition_column=False):
    """One at-least-once task's plan, encoder and KafkaStore as Spark's task opens them (batches of PER_BATCH
    records, a window of 10 of them), its producer reporting librdkafka's statistics (requests sent, per type) into
    the returned dict."""
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    options = KafkaDataSource({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                               "sink.mode": "unordered", "kafka.linger.ms": "100",
                               "sink.batch.max-size": str(PER_BATCH),
                               "sink.requests.max-buffered": str(10 * PER_BATCH)}).write_options()
    fields = [StructField("key", StringType()), StructField("value", StringType())]
    if partition_column:
        fields.append(StructField("partition", IntegerType()))
    plan = KafkaWritePlan("sluice_kafka", options, StructType(fields), SinkConfig.of(options),
                          WriteOptions.of(options), RecordColumns(True, False, False, partition_column, False),
                          1_048_588, frozenset([topic]), topic)
    context = WriteContext(write_id=f"alo-{uuid.uuid4().hex[:8]}", partition_id=0)
    task = plan.open_task(context)
    task.store.producer_config, requests = counting_requests(task.store.producer_config)
    return plan, task, context, requests


def batch_of(b, partition=None):
    keys = pa.array([f"k{b}-{i}" for i in range(PER_BATCH)])
    columns = {"key": keys, "value": keys}
    if partition is not None:
        columns["partition"] = pa.array(partition, pa.int32())
    return keys, pa.RecordBatch.from_pydict(columns)


@pytest.mark.parametrize("start", [None, 1], ids=["window-of-the-buffer", "negative-control-one-batch"])
def test_an_unordered_task_sends_each_partition_many_batches_in_one_request(kafka, new_topic, start):
    """5 engine batches, each over all 12 partitions. In flight together (the plan's window start: 10 batches), the
    task's records go in about a request per partition (linger.ms=100 gathers them); the negative control, a window
    of one batch, waits for the producer's queue to drain after each batch: a request per partition per batch."""
    topic = new_topic(PARTITIONS)
    plan, task, context, requests = unordered_task(kafka, topic)
    assert task.store.window_start_batches == 10
    if start is not None:
        task.store.window_start_batches = start
    touched = 0
    with AsyncSinkWriter(task.store, plan.config, context=context) as writer:
        for b in range(BATCHES):
            keys, batch = batch_of(b)
            touched += len(set(kafka_partitions(keys, PARTITIONS).to_pylist()))
            encoded = task.encode(batch)
            writer.write_chunk(encoded.entries, encoded.sizes)
        writer.finish()
        assert writer.stats.records == BATCHES * PER_BATCH and writer.stats.batches == BATCHES
        requests.clear()
        poll_until(lambda: requests.get("Produce"), 30, "the producer's statistics after the last batch")
    assert touched == BATCHES * PARTITIONS
    if start is None:
        assert requests["Produce"] <= touched // 2, requests
    else:
        assert requests["Produce"] >= touched, requests
    assert len(read_committed(kafka.client_config(), topic)) == BATCHES * PER_BATCH


@pytest.mark.parametrize("partition", [99, 1], ids=["refused", "negative-control-a-partition-it-has"])
def test_a_record_refused_among_batches_in_flight_fails_the_task_naming_it(kafka, new_topic, partition):
    """The third of 5 batches in flight together holds a record for a partition the topic lacks: the task fails
    naming the record's key and why, and the record is not stored. The negative control, a partition the topic has:
    every record stored."""
    topic = new_topic(2)
    plan, task, context, _ = unordered_task(kafka, topic, partition_column=True)
    writer = AsyncSinkWriter(task.store, plan.config, context=context)
    try:
        for b in range(BATCHES):
            _, batch = batch_of(b, [partition if (b, i) == (2, 7) else i % 2 for i in range(PER_BATCH)])
            encoded = task.encode(batch)
            writer.write_chunk(encoded.entries, encoded.sizes)
        if partition == 99:
            with pytest.raises(SinkError, match=r"key 'k2-7'.*partition column names a partition the topic does not"):
                writer.finish()
        else:
            writer.finish()
    finally:
        writer.close()
    stored = {r.key for r in read_committed(kafka.client_config(), topic)}
    assert (b"k2-7" in stored) == (partition != 99)
    if partition != 99:
        assert len(stored) == BATCHES * PER_BATCH
