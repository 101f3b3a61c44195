"""spark.read / readStream .format("sluice_kafka") against a real Kafka (LocalKafka): the columns of Spark's Kafka
source, read_committed (aborted and open transactions not read; read_uncommitted, the negative control, reads
them), start and end offsets, streaming with capped micro-batches, a restart from the checkpoint that misses and
repeats nothing, partitions and topics found while a query runs, a deleted topic reported."""

import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewPartitions

from sluice.connectors.kafka import KafkaDataSource
from sluice.connectors.kafka._options import READ_SPEC, ReadOptions
from sluice.spark._compat import HAS_ADMISSION_CONTROL
from sluice.testing import LocalKafka
from tests.faults import poll_until

pytestmark = pytest.mark.spark

FORMAT = KafkaDataSource.format_name


@pytest.fixture
def opts(kafka):
    return {"kafka.bootstrap.servers": kafka.bootstrap_servers}


def produce(kafka, topic, values, *, partition=None, key=None, headers=None):
    producer = Producer(kafka.client_config())
    for value in values:
        extra = {} if partition is None else {"partition": partition}
        producer.produce(topic, value=value, key=key, headers=headers, **extra)
    assert producer.flush(30) == 0


def transactional(kafka, topic):
    producer = Producer(kafka.client_config(**{"transactional.id": f"tx-{topic}-{time.monotonic_ns()}"}))
    producer.init_transactions(30)
    return producer


def values(n, start=0, prefix="v"):
    return [f"{prefix}{i}".encode() for i in range(start, start + n)]


def test_batch_read_has_the_columns_of_sparks_kafka_source(spark, kafka, new_topic, opts):
    topic = new_topic(partitions=3)
    for p in range(3):
        produce(kafka, topic, values(40, prefix=f"p{p}-"), partition=p, key=f"k{p}".encode(),
                headers=[("h", f"{p}".encode()), ("n", None)])
    before = time.time()
    df = spark.read.format(FORMAT).options(**opts).option("subscribe", topic).option("includeHeaders", "true").load()
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        "timestampType:int,headers:array<struct<key:string,value:binary>>>")
    rows = df.collect()
    assert len(rows) == 120
    for p in range(3):
        mine = sorted((r for r in rows if r.partition == p), key=lambda r: r.offset)
        assert [r.offset for r in mine] == list(range(40))
        assert [bytes(r.value) for r in mine] == values(40, prefix=f"p{p}-")
        assert {bytes(r.key) for r in mine} == {f"k{p}".encode()} and {r.topic for r in mine} == {topic}
        assert all([(h.key, h.value) for h in r.headers] == [("h", f"{p}".encode()), ("n", None)] for r in mine)
    assert {r.timestampType for r in rows} == {0}  # CreateTime
    assert all(abs(r.timestamp.timestamp() - before) < 120 for r in rows)
    plain = spark.read.format(FORMAT).options(**opts).option("subscribe", topic).load()
    assert "headers" not in plain.columns and plain.count() == 120


def test_read_committed_skips_aborted_and_open_transactions(spark, kafka, new_topic, opts):
    topic = new_topic()
    producer = transactional(kafka, topic)
    for batch, commit in (("a", True), ("b", False), ("c", True)):
        producer.begin_transaction()
        for value in values(10, prefix=batch):
            producer.produce(topic, value=value)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    open_tx = transactional(kafka, topic)
    open_tx.begin_transaction()
    for value in values(5, prefix="open"):
        open_tx.produce(topic, value=value)
    open_tx.flush(30)
    produce(kafka, topic, values(3, prefix="after"))  # after the open transaction: held back with it

    def read(**more):
        return spark.read.format(FORMAT).options(**opts, **more).option("subscribe", topic).load()

    rows = read().orderBy("offset").collect()
    assert [bytes(r.value) for r in rows] == values(10, prefix="a") + values(10, prefix="c")
    # Transaction markers take offsets: after 10 records and their commit marker, then 10 aborted and theirs.
    assert [r.offset for r in rows] == list(range(10)) + list(range(22, 32))
    # The negative control: read_uncommitted reads the aborted and the open transaction's records too.
    everything = read(**{"kafka.isolation.level": "read_uncommitted"}).collect()
    assert len(everything) == 10 + 10 + 10 + 5 + 3
    open_tx.commit_transaction(30)
    assert read().count() == 10 + 10 + 5 + 3


def test_assign_reads_the_partitions_named(spark, kafka, new_topic, opts):
    topic = new_topic(partitions=3)
    for p in range(3):
        produce(kafka, topic, values(10, prefix=f"p{p}-"), partition=p)

    def read(assign):
        return spark.read.format(FORMAT).options(**opts).option("assign", assign).load()

    got = read(f'{{"{topic}": [0, 2]}}').collect()
    assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in (0, 2) for o in range(10)]
    with pytest.raises(Exception, match=rf"assign names partition\(s\) \['{topic}:5'\] that do not exist"):
        read(f'{{"{topic}": [5]}}').collect()


def test_start_and_end_by_offset_and_timestamp(spark, kafka, new_topic, opts):
    topic = new_topic(partitions=2)
    produce(kafka, topic, values(30), partition=0)
    produce(kafka, topic, values(30, prefix="w"), partition=1)
    middle = int(time.time() * 1000)
    poll_until(lambda: int(time.time() * 1000) > middle + 5, 90, "the clock to move", 0.2)
    produce(kafka, topic, values(7, 30), partition=0)

    def read(**more):
        return spark.read.format(FORMAT).options(**opts).option("subscribe", topic).options(**more).load()

    got = read(startingOffsets=f'{{"{topic}": {{"0": 10, "1": -2}}}}',
               endingOffsets=f'{{"{topic}": {{"0": 20}}}}').collect()
    assert sorted(r.offset for r in got if r.partition == 0) == list(range(10, 20))
    assert sorted(r.offset for r in got if r.partition == 1) == list(range(30))
    by_time = read(startingTimestamp=str(middle + 1)).collect()
    assert sorted(bytes(r.value) for r in by_time) == sorted(values(7, 30))
    assert read(startingOffsets="latest").count() == 0
    with pytest.raises(Exception, match="the start is after the end"):
        read(startingOffsets=f'{{"{topic}": {{"0": 25}}}}', endingOffsets=f'{{"{topic}": {{"0": 20}}}}').collect()


def test_deleted_offsets_fail_the_read_unless_told_to_skip_them(spark, kafka, new_topic, opts):
    from confluent_kafka import TopicPartition

    topic = new_topic()
    produce(kafka, topic, values(100))
    admin = kafka.admin()
    for future in admin.delete_records([TopicPartition(topic, 0, 50)]).values():  # as retention would
        future.result(30)

    def read(**more):
        return spark.read.format(FORMAT).options(**opts).option("subscribe", topic) \
            .option("startingOffsets", f'{{"{topic}": {{"0": 10}}}}').options(**more).load()

    with pytest.raises(Exception, match=f"offset 10 of {topic}:0 was deleted \\(the partition starts at 50 now\\)"):
        read().collect()
    assert sorted(r.offset for r in read(failOnDataLoss="false").collect()) == list(range(50, 100))


def test_one_partition_cut_into_ranges_reads_in_parallel(spark, kafka, new_topic, opts):
    topic = new_topic()
    produce(kafka, topic, values(1050))
    df = spark.read.format(FORMAT).options(**opts).option("subscribe", topic) \
        .option("max-records-per-partition", "100").load()
    assert df.rdd.getNumPartitions() == 11
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(1050))


def test_small_partitions_are_read_by_a_few_tasks_with_warm_consumers(spark, kafka, new_topic, opts, tmp_path):
    """12 partitions of 10 records: one read task by default (records-per-task), 6 at records-per-task=25, 12 at 0
    (Spark's Kafka source's shape: the negative control); every record once each time. A stream of small capped
    micro-batches reads the same partitions again and again, with the consumers its Python workers keep: every record
    once."""
    topic = new_topic(partitions=12)
    for partition in range(12):
        produce(kafka, topic, values(10, prefix=f"p{partition}-"), partition=partition)
    every = sorted((p, o) for p in range(12) for o in range(10))

    def read(**extra):
        return spark.read.format(FORMAT).options(**opts, subscribe=topic, **extra).load()

    for extra, tasks in (({}, 1), ({"records-per-task": "25"}, 6), ({"records-per-task": "0"}, 12)):
        df = read(**extra)
        assert df.rdd.getNumPartitions() == tasks, extra
        assert sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect()) == every

    name = f"small_{topic}"
    query = (spark.readStream.format(FORMAT).options(**opts, subscribe=topic, **{"max-records-per-trigger": "30"})
             .load().select("partition", "offset").writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None and len(query.recentProgress) >= 4
    assert sorted((r.partition, r.offset) for r in spark.table(name).collect()) == every


def test_a_worker_closes_consumers_idle_past_sparks_cache_timeout(kafka):
    """As Spark's consumer pool (spark.kafka.consumer.cache.timeout, 5 minutes): a kept consumer is lent again while
    warm, and closed once idle that long (evict_idle runs every minute in a worker that keeps one)."""
    from sluice.connectors.kafka import _consumers

    config = kafka.client_config(**{"group.id": f"idle-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    _consumers.close_idle()
    with _consumers.lent(config) as first:
        pass
    assert _consumers.evict_idle(time.monotonic() + _consumers.IDLE_TIMEOUT_S - 5) == 0  # not idle long enough
    with _consumers.lent(config) as again:
        assert again is first
    assert _consumers.evict_idle(time.monotonic() + _consumers.IDLE_TIMEOUT_S) == 1
    with pytest.raises(RuntimeError, match="closed"):
        first.assignment()
    with _consumers.lent(config) as fresh:
        assert fresh is not first
    _consumers.close_idle()


def test_sasl_ssl_with_the_ca_in_the_options_and_a_wrong_password(spark, capsys):
    with LocalKafka(sasl="SCRAM-SHA-512", tls=True, heap_mb=256) as secured:
        secured.create_topic("s", 2)
        produce(secured, "s", values(25))
        options = {"kafka.bootstrap.servers": secured.bootstrap_servers, "kafka.security.protocol": "SASL_SSL",
                   "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": secured.username,
                   "kafka.sasl.password": secured.password, "kafka.ssl.ca.pem": secured.ca_pem, "subscribe": "s"}
        df = spark.read.format(FORMAT).options(**options).load()
        assert df.count() == 25  # the CA travels in the options (executors have no file of it)
        df.explain(True)
        assert secured.password not in capsys.readouterr().out
        wrong = "wrong-password-1234"
        with pytest.raises(Exception, match="authentication failed") as failed:
            spark.read.format(FORMAT).options(**options).option("kafka.sasl.password", wrong) \
                .option("timeout-ms", "5000").load().collect()
        assert wrong not in str(failed.value) and secured.password not in str(failed.value)


@pytest.mark.parametrize(("extra", "message"), [
    ({}, "set exactly one of subscribe"),
    ({"subscribe": "a", "subscribePattern": "b"}, "set exactly one of subscribe"),
    ({"subscribe": "a", "startingOffsets": "{bad"}, "startingOffsets='{bad'"),
    ({"subscribe": "a", "startingOffsets": '{"b": {"0": 1}}'}, r"startingOffsets names topic\(s\) \['b'\]"),
    ({"assign": '{"a": [0]}', "subscribe": "a"}, "set exactly one of subscribe"),
    ({"assign": "[0]"}, "assign='\\[0\\]': use JSON like"),
    ({"subscribe": "a", "kafka.group.id": "g"}, "Spark's checkpoint holds them"),
    ({"subscribe": "a", "subscirbe": "b"}, "subscribe"),
    ({"subscribe": "a", "kafka.fetch.max.bytez": "1"}, 'refused by the Kafka client: .*"fetch.max.bytez"'),
    ({"subscribe": "no_such_topic"}, r"topic\(s\) \['no_such_topic'\] do not exist"),
])
def test_bad_read_options(spark, opts, extra, message):
    with pytest.raises(Exception, match=message):
        spark.read.format(FORMAT).options(**opts, **extra).load().collect()


def test_the_consumers_fetch_back_off_is_sluices_unless_the_user_sets_it():
    """librdkafka's 1 s fetch.queue.backoff.ms would stall every refill of a reader's queue
    (bench/stores/kafka_sink_source.py)."""
    base = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}
    assert ReadOptions.of(READ_SPEC.parse(base)).consumer_config()["fetch.queue.backoff.ms"] == 10
    told = ReadOptions.of(READ_SPEC.parse({**base, "kafka.fetch.queue.backoff.ms": "500"})).consumer_config()
    assert told["fetch.queue.backoff.ms"] == "500"


def test_unreachable_brokers_are_named(spark, kafka):
    from sluice.testing._postgres import free_port

    servers = f"127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match=f"Kafka at {servers} did not answer"):
        spark.read.format(FORMAT).option("kafka.bootstrap.servers", servers).option("subscribe", "t") \
            .option("timeout-ms", "1500").load().collect()


def test_streaming_reads_as_rows_come_and_restarts_from_the_checkpoint(spark, kafka, new_topic, opts, tmp_path):
    topic = new_topic(partitions=2)
    produce(kafka, topic, values(150), partition=0)
    produce(kafka, topic, values(50, prefix="w"), partition=1)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    def start(trigger):
        return (spark.readStream.format(FORMAT).options(**opts).option("subscribe", topic)
                .option("max-records-per-trigger", "60").load().selectExpr("partition", "offset", "value")
                .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
                .trigger(**trigger).start())

    def written():
        log = out / "_spark_metadata"  # the file sink's commit log: a micro-batch is readable once it is there
        if not log.is_dir() or not any(p.name.isdigit() for p in log.iterdir()):
            return 0
        return spark.read.parquet(str(out)).count()

    query = start({"processingTime": "200 milliseconds"})
    try:
        poll_until(lambda: written() >= 200, 90, "the first 200 rows", 0.2)
        producer = transactional(kafka, topic)  # rows produced while it runs, one aborted transaction among them
        producer.begin_transaction()
        for value in values(20, prefix="aborted"):
            producer.produce(topic, value=value, partition=1)
        producer.abort_transaction(30)
        produce(kafka, topic, values(40, 150), partition=0)
        poll_until(lambda: written() >= 240, 90, "the rows produced while the query ran", 0.2)
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert query.exception() is None
    finally:
        query.stop()
    assert max(sizes) <= 60, sizes
    produce(kafka, topic, values(30, 190), partition=0)  # while it is stopped
    again = start({"availableNow": True})
    again.awaitTermination(120)
    assert again.exception() is None
    rows = spark.read.parquet(str(out)).collect()
    got = sorted((r.partition, bytes(r.value)) for r in rows)
    assert got == sorted([(0, v) for v in values(220)] + [(1, v) for v in values(50, prefix="w")]), \
        "no duplicate and no missing record across the restart, no aborted record"
    if HAS_ADMISSION_CONTROL:
        assert max(p["numInputRows"] for p in again.recentProgress) <= 60


def test_streaming_picks_up_new_partitions_and_topics(spark, kafka, opts, tmp_path):
    prefix = f"ev{time.monotonic_ns()}"
    kafka.create_topic(f"{prefix}_a", 1)
    produce(kafka, f"{prefix}_a", values(20))
    query = (spark.readStream.format(FORMAT).options(**opts).option("subscribePattern", f"{prefix}_.*")
             .option("discovery-interval-ms", "0").load().selectExpr("topic", "partition", "offset")
             .writeStream.format("memory").queryName(prefix).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        poll_until(lambda: spark.table(prefix).count() >= 20, 90, "the first topic's rows", 0.2)
        admin = kafka.admin()
        admin.create_partitions([NewPartitions(f"{prefix}_a", 2)])[f"{prefix}_a"].result(30)
        poll_until(lambda: len(kafka.admin().list_topics(f"{prefix}_a", timeout=10).topics[f"{prefix}_a"].partitions)
                   == 2, 90, "the new partition", 0.2)
        produce(kafka, f"{prefix}_a", values(5, prefix="new-partition"), partition=1)
        kafka.create_topic(f"{prefix}_b", 1)  # created while the query runs
        produce(kafka, f"{prefix}_b", values(7))
        poll_until(lambda: spark.table(prefix).count() >= 32, 90, "the new partition's and topic's rows", 0.2)
        assert query.exception() is None
    finally:
        query.stop()
    got = sorted((r.topic, r.partition, r.offset) for r in spark.table(prefix).collect())
    assert got == sorted([(f"{prefix}_a", 0, i) for i in range(20)] + [(f"{prefix}_a", 1, i) for i in range(5)]
                         + [(f"{prefix}_b", 0, i) for i in range(7)])


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_deleted_under_a_running_query_is_reported(spark, kafka, new_topic, opts, tmp_path,
                                                           fail_on_data_loss):
    topic, other = new_topic(), new_topic()
    produce(kafka, topic, values(10))
    produce(kafka, other, values(10))
    name = f"deleted_{fail_on_data_loss}"
    query = (spark.readStream.format(FORMAT).options(**opts).option("subscribe", f"{topic},{other}")
             .option("discovery-interval-ms", "0").option("failOnDataLoss", str(fail_on_data_loss).lower()).load()
             .selectExpr("topic", "offset").writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds").start())
    try:
        poll_until(lambda: spark.table(name).count() >= 20, 90, "the rows before the deletion", 0.2)
        admin = kafka.admin()  # alive until the deletion is done
        admin.delete_topics([topic])[topic].result(30)
        if fail_on_data_loss:
            poll_until(lambda: query.exception() is not None or not query.isActive, 90, "the query to fail", 0.2)
            assert f"topic(s) ['{topic}'] were deleted while the query read them" in str(query.exception())
        else:  # the negative control: told to go on, it reads the other topic on
            produce(kafka, other, values(5, 10))
            poll_until(lambda: spark.table(name).count() >= 25, 90, "the other topic's new rows", 0.2)
            assert query.isActive and query.exception() is None
    finally:
        query.stop()


def test_streaming_read_goes_on_through_a_broker_killed(spark, tmp_path, kafka_cluster):
    cluster = kafka_cluster
    topic = f"failover-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 2)
    config = cluster.client_config(acks="all")

    def produce_all(start, n):
        producer = Producer(config)
        for i in range(start, start + n):
            producer.produce(topic, value=f"v{i}".encode(), partition=i % 2)
        assert producer.flush(60) == 0

    produce_all(0, 2000)
    query = (spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", cluster.bootstrap_servers)
             .option("subscribe", topic).option("max-records-per-trigger", "300").load()
             .selectExpr("CAST(value AS STRING) AS value").writeStream.format("memory").queryName("failover")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds")
             .start())
    try:
        poll_until(lambda: spark.table("failover").count() >= 600, 90, "the first micro-batches", 0.2)
        leader = cluster.admin().list_topics(topic, timeout=10).topics[topic].partitions[0].leader
        next(b for b in cluster.brokers if b.node_id == leader).kill()  # started again after the test
        produce_all(2000, 1000)
        poll_until(lambda: spark.table("failover").count() >= 3000 or query.exception() is not None, 90,
                   "every row, the leader's partition read from its new leader", 0.2)
        assert query.exception() is None
    finally:
        query.stop()
    got = sorted(int(r.value[1:]) for r in spark.table("failover").collect())
    assert got == list(range(3000))


def test_streaming_read_reports_records_event_time_lag_and_offsets_behind(spark, kafka, new_topic, opts, tmp_path):
    import sluice.metrics

    topic = new_topic(partitions=2)
    produce(kafka, topic, values(100), partition=0)
    produce(kafka, topic, values(100), partition=1)
    with sluice.metrics.serve() as server:
        query = (spark.readStream.format(FORMAT).options(**opts).option("subscribe", topic)
                 .option("max-records-per-trigger", "80").load().selectExpr("offset").writeStream.format("memory")
                 .queryName("metered").option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

        def reported():
            reads = server.reads.snapshot().get(FORMAT, {})
            sources = [r for r in server.sources.snapshot() if r.format == FORMAT]
            # Spark commits a micro-batch's offsets when it plans the next: the last report is of the one before
            # the last micro-batch (80 + 80 of 200 read then: 40 behind).
            return reads.get("records") == 200 and [r.pending_records for r in sources][-1:] == [40]

        poll_until(reported, 30, "the reads' and the source's reports", 0.2)
        reads = server.reads.snapshot()[FORMAT]
        assert reads["event_lag_ms"] >= 0  # now minus the newest record's timestamp (currentFetchEventTimeLag)
        assert [r.source for r in server.sources.snapshot() if r.format == FORMAT][-1] == topic
