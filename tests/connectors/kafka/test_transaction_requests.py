"""What an exactly-once task costs the brokers as the topic's partitions grow: its batches are acknowledged once
produced (the commit is what counts), so librdkafka sends each partition's records of the whole task in few
ProduceRequests, not one request per partition per engine batch; and a record Kafka refuses still fails the task,
named, with nothing visible."""

import uuid

import pyarrow as pa
import pytest

from sluice.connector import SinkConfig, Store, WriteContext
from sluice.connectors.kafka import KafkaDataSource
from sluice.connectors.kafka._checks import RecordColumns
from sluice.connectors.kafka._options import WriteOptions
from sluice.connectors.kafka._partitioner import kafka_partitions
from sluice.connectors.kafka._sink import KafkaWritePlan
from sluice.connectors.kafka._store import KafkaStore
from sluice.engine import AsyncSinkWriter, Batch
from sluice.testing import read_committed
from tests.connectors.kafka.requests_counted import counting_requests
from tests.faults import poll_until

PARTITIONS, BATCHES, PER_BATCH = 12, 5, 120


class PerBatchKafkaStore(KafkaStore):
    """KafkaStore without runs: the engine hands it one batch per submit (the negative control of runs)."""

    submit_run = Store.submit_run


def transactional_task(kafka, topic, acknowledge_at_commit, store_type=KafkaStore):
    """One task's encoder and KafkaStore as Spark's task opens them (not opened yet: `open(context)`), its producer
    reporting librdkafka's statistics (requests sent, per type) into the returned dict."""
    from pyspark.sql.types import StringType, StructField, StructType

    options = KafkaDataSource({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                               "sink.mode": "global-ordered", "sink.transactional": "true",
                               "kafka.linger.ms": "100"}).write_options()
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    plan = KafkaWritePlan("sluice_kafka", options, schema, SinkConfig.of(options), WriteOptions.of(options),
                          RecordColumns(True, False, False, False, False), 1_048_588, frozenset([topic]), topic)
    context = WriteContext(write_id=f"req-{uuid.uuid4().hex[:8]}", epoch=0, partition_id=0)
    task = plan.open_task(context)
    config, requests = counting_requests(task.store.producer_config)
    store = store_type(plan.write.client, plan.columns, task.store.rows, topic=topic, producer_config=config,
                       timeout_ms=30_000, transaction=(plan.transactional_prefix(context), topic),
                       acknowledge_at_commit=acknowledge_at_commit)
    task.encode.store = store
    return task.encode, store, requests, context


@pytest.mark.parametrize("acknowledge_at_commit", [True, False],
                         ids=["at-commit", "negative-control-drained-per-batch"])
def test_a_transaction_sends_each_partition_its_records_in_few_requests(kafka, new_topic, acknowledge_at_commit):
    """5 engine batches, each over all 12 partitions, in one transaction. Acknowledged at the commit, the task's
    records go in about a request per partition (linger.ms=100 gathers them); the negative control, each batch
    waiting for the producer's queue to drain, sends at least one request per partition per batch."""
    topic = new_topic(PARTITIONS)
    encode, store, requests, context = transactional_task(kafka, topic, acknowledge_at_commit)
    store.open(context)
    touched = 0
    for b in range(BATCHES):
        keys = pa.array([f"k{b}-{i}" for i in range(PER_BATCH)])
        touched += len(set(kafka_partitions(keys, PARTITIONS).to_pylist()))
        encoded = encode(pa.RecordBatch.from_pydict({"key": keys, "value": keys}))
        entries, sizes = list(encoded.entries), list(encoded.sizes)
        store.submit(Batch(entries, sum(sizes), len(entries), sizes=sizes)).result(60)
    assert store.pre_commit()["records"] == BATCHES * PER_BATCH
    poll_until(lambda: store.producer.poll(0.05) is not None and requests.get("EndTxn"), 30,
               "the producer's statistics after its commit")
    store.close()
    assert touched == BATCHES * PARTITIONS
    if acknowledge_at_commit:
        assert requests["Produce"] <= touched // 2, requests
    else:
        assert requests["Produce"] >= touched, requests
    assert requests["AddPartitionsToTxn"] <= 2, "librdkafka adds the partitions as a few requests, not one each"
    assert len(read_committed(kafka.client_config(), topic)) == BATCHES * PER_BATCH


@pytest.mark.parametrize("store_type", [KafkaStore, PerBatchKafkaStore],
                         ids=["runs", "negative-control-a-submit-per-batch"])
def test_a_transactions_full_batches_are_produced_a_run_at_a_time(kafka, new_topic, store_type):
    """An exactly-once task at batches of 100, its rows in Arrow batches of 1,000: the engine hands the store each
    Arrow batch's full batches as one run (Store.submit_run), which the store produces in one pass; every record is
    committed once, in order. The negative control, a submit per batch, makes a pass per batch."""
    topic = new_topic(3)
    encode, store, _, context = transactional_task(kafka, topic, True, store_type)
    passes: list[int] = []
    produce = store._produce

    def counted(table, callback):
        passes.append(table.num_rows)
        return produce(table, callback)

    store._produce = counted
    values = [f"v{i:05d}" for i in range(4000)]
    config = SinkConfig(batch_max_size=100, flush_buffer_timeout=60_000, mode="global-ordered")
    with AsyncSinkWriter(store, config, context=context) as w:
        for start in range(0, 4000, 1000):
            chunk = pa.array(values[start:start + 1000])
            encoded = encode(pa.RecordBatch.from_pydict({"key": chunk, "value": chunk}))
            w.write_chunk(encoded.entries, encoded.sizes)
        assert w.finish()["records"] == 4000
    assert w.stats.batches == 40
    if store_type is KafkaStore:
        # the first batch alone (the window starts at one batch), then each Arrow batch's rest as one run
        assert passes == [100, 900, 1000, 1000, 1000], passes
    else:
        assert passes == [100] * 40
    records = read_committed(kafka.client_config(), topic)
    assert sorted(r.value.decode() for r in records) == values  # each once
    for partition in {r.partition for r in records}:  # and each partition's in the order written
        mine = [r.value.decode() for r in records if r.partition == partition]
        assert mine == sorted(mine)


@pytest.mark.spark
@pytest.mark.parametrize("partition", [5, 1], ids=["refused", "negative-control-a-partition-it-has"])
def test_a_record_refused_in_a_transaction_fails_the_task_naming_it(spark, kafka, new_topic, partition):
    """The transaction's batches are acknowledged before Kafka answers for their records: a record it then refuses
    (a partition the topic lacks) still fails the write, named, and nothing of it is visible."""
    topic = new_topic(2)
    df = spark.range(0, 1, 1, 1).selectExpr("'k' AS key", "'v' AS value", f"{partition} AS partition")
    write = df.write.format("sluice_kafka").options(**{
        "kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "sink.mode": "global-ordered",
        "sink.transactional": "true"}).mode("append")
    if partition == 5:
        with pytest.raises(Exception, match="the partition column names a partition the topic does not have"):
            write.save()
        assert read_committed(kafka.client_config(), topic) == []
    else:
        write.save()
        assert [(r.partition, r.value) for r in read_committed(kafka.client_config(), topic)] == [(1, b"v")]
