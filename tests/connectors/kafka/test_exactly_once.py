"""Exactly-once into Kafka (sink.transactional=true), counted by a read_committed consumer, through these faults: a
Python worker killed mid-task, the driver gone between the tasks' commits and Spark's, a query restarted from an older
checkpoint copy, a batch write re-run with its sink.write-id, a zombie writer, and a transaction a killed writer left
open. Each guarantee is also shown failing with its mechanism switched off."""

import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sluice
from sluice.connectors.kafka import FencedError, KafkaDataSource
from sluice.testing import count_written, read_committed
from tests.faults import Striker, held_at, kill_python_workers, poll_until

pytestmark = pytest.mark.spark


class UncheckedKafka(KafkaDataSource):
    """The negative control of the marker: each task's transaction commits whether or not its epoch was committed."""

    format_name = "sluice_kafka_unchecked"
    check_marker = False


@pytest.fixture(scope="module")
def unchecked(spark):
    spark.dataSource.register(UncheckedKafka)
    return UncheckedKafka.format_name


def make_topic(kafka, partitions=2):
    name = f"eo-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, partitions=partitions)
    return name


def eo_options(kafka, topic, **more):
    return {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "sink.mode": "global-ordered",
            "sink.transactional": "true", "sink.batch.max-size": "50", "sink.flush-buffer.timeout": "50", **more}


def counted(kafka, topic) -> tuple[int, int, int]:
    """(records, distinct values, duplicates) a read_committed consumer sees."""
    values = [r.value for r in read_committed(kafka.client_config(), topic)]
    return len(values), len(set(values)), sum(c - 1 for c in Counter(values).values())


def broker_port(kafka) -> int:
    return int(kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)[1])


def strike_when_written(kafka, topic, at_least, hold):
    """Kill the Python workers connected to the broker once `at_least` records were sent, then let the input go on."""
    seen = {}

    def strike():
        try:
            poll_until(lambda: count_written(kafka.client_config(), topic) >= at_least, 120,
                       f"the sink sending {at_least} records into {topic}")
            seen["written"] = count_written(kafka.client_config(), topic)
            seen["visible"] = counted(kafka, topic)[0]
            seen["workers"] = kill_python_workers(broker_port(kafka))
        finally:
            hold.unlink()

    striker = Striker(strike)
    striker.start()
    return striker, seen


@pytest.mark.parametrize("transactional", [True, False], ids=["exactly-once", "negative-control-at-least-once"])
def test_a_python_worker_killed_mid_task(spark, kafka, small_arrow_batches, tmp_path, transactional):
    """The killed attempt's transaction is aborted by the retry's init_transactions (transaction.timeout-ms is 10
    minutes: the test ends long before the broker would abort it, so readers were never blocked on it). Switched off
    (at-least-once), the rows the killed attempt had sent are there twice."""
    topic, hold = make_topic(kafka, partitions=1), tmp_path / "hold"
    hold.touch()
    df = spark.range(0, 3000, 1, 1).selectExpr("id", "repeat('x', 1000) AS pad") \
        .mapInArrow(held_at(1500, str(hold), 50, 0.02), "id long, pad string") \
        .selectExpr("concat(CAST(id AS STRING), ':', pad) AS value")  # ~1 KB: reaches the writer as it is made
    options = eo_options(kafka, topic, **{"transaction.timeout-ms": "600000"}) if transactional else \
        {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "sink.batch.max-size": "50",
         "sink.flush-buffer.timeout": "50"}
    striker, seen = strike_when_written(kafka, topic, 300, hold)
    started = time.monotonic()
    df.write.format("sluice_kafka").options(**options).mode("append").save()
    striker.join()
    assert seen["workers"] >= 1 and seen["written"] >= 300, seen
    records, distinct, dupes = counted(kafka, topic)
    if transactional:
        assert seen["visible"] == 0, "nothing of the task is visible before its commit"
        assert (records, distinct, dupes) == (3000, 3000, 0)
        assert time.monotonic() - started < 300, "readers did not wait for the broker's transaction timeout"
        values = [int(r.value.split(b':')[0]) for r in read_committed(kafka.client_config(), topic)]
        assert values == list(range(3000)), "exactly once, and in order"
    else:
        assert distinct == 3000 and dupes >= 300, (records, distinct, dupes)


def test_a_transaction_a_killed_writer_left_open_is_aborted_on_restart(kafka):
    """A writer killed with its transaction open (SIGKILL of its process): the next task with its transactional id
    aborts it in init_transactions, so read_committed readers see the later commits at once. Negative control: a new
    transactional id per attempt (FLINK-34554's unbounded ids) leaves the transaction open and the readers stuck at
    it until the broker's transaction.timeout.ms."""
    for same_id in (True, False):
        topic = make_topic(kafka, partitions=1)
        killed_id = f"dead-{uuid.uuid4().hex[:8]}"
        script = textwrap.dedent(f"""
            import os
            from confluent_kafka import Producer
            p = Producer({{**{kafka.client_config()!r}, "transactional.id": {killed_id!r},
                          "transaction.timeout.ms": 600000}})
            p.init_transactions(30)
            p.begin_transaction()
            for i in range(100):
                p.produce({topic!r}, b"dead-%d" % i)
            assert p.flush(30) == 0
            os._exit(0)  # killed: no commit, no abort
        """)
        subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
        assert count_written(kafka.client_config(), topic) == 100
        store_id = killed_id if same_id else f"fresh-{uuid.uuid4().hex[:8]}"
        commit_ten(kafka, topic, store_id)
        values = [r.value for r in read_committed(kafka.client_config(), topic, timeout=10)]
        if same_id:
            assert values == [b"live-%d" % i for i in range(10)]
        else:
            assert values == [], "the open transaction holds read_committed readers back"


def commit_ten(kafka, topic, transactional_id):
    from confluent_kafka import Producer

    producer = Producer({**kafka.client_config(), "transactional.id": transactional_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, b"live-%d" % i)
    producer.commit_transaction(30)


def store_for(kafka, topic, write_id, epoch, partition=0, prefix=None, check_marker=True, **more):
    """One task's KafkaStore, opened as Spark's task would open it (no Spark)."""
    from pyspark.sql.types import StringType, StructField, StructType

    from sluice.connector import SinkConfig, WriteContext
    from sluice.connectors.kafka._checks import RecordColumns
    from sluice.connectors.kafka._options import WRITE_SPEC, WriteOptions
    from sluice.connectors.kafka._sink import KafkaWritePlan

    raw = eo_options(kafka, topic, **more)
    if prefix:
        raw["transactional-id-prefix"] = prefix
    options = KafkaDataSource(raw).write_options()
    assert WRITE_SPEC.format_name == "sluice_kafka"
    plan = KafkaWritePlan("sluice_kafka", options, StructType([StructField("value", StringType())]),
                          SinkConfig.of(options), WriteOptions.of(options),
                          RecordColumns(False, False, False, False, False), 1_048_588, frozenset([topic]), topic,
                          check_marker)
    context = WriteContext(write_id=write_id, epoch=epoch, partition_id=partition)
    task = plan.open_task(context)
    task.store.open(context)
    return task


def send(task, values):
    from sluice.engine import Batch

    encoded = task.encode(pa.RecordBatch.from_pydict({"value": pa.array(values, pa.string())}))
    entries, sizes = list(encoded.entries), list(encoded.sizes)
    task.store.submit(Batch(entries, sum(sizes), len(entries), sizes=sizes)).result(60)


def test_a_zombie_task_is_fenced(kafka):
    """Two attempts of one task (a straggler and its retry): the retry's init_transactions fences the straggler,
    whose commit fails with FencedError; only the retry's records are visible. Negative control: attempts with
    different transactional ids (other prefixes) both commit."""
    for fenced in (True, False):
        topic = make_topic(kafka, partitions=1)
        old = store_for(kafka, topic, "w1", 0, prefix="p-old" if not fenced else None)
        send(old, ["a", "b"])
        new = store_for(kafka, topic, "w1", 0, prefix="p-new" if not fenced else None)
        send(new, ["a", "b"])
        if fenced:
            with pytest.raises(FencedError, match="a newer attempt of this task"):
                old.store.pre_commit()
        else:
            old.store.pre_commit()
        new.store.pre_commit()
        old.store.close()
        new.store.close()
        assert counted(kafka, topic) == ((2, 2, 0) if fenced else (4, 2, 2))


def test_a_lone_producer_fenced_by_the_brokers_transaction_timeout_is_told_so(kafka):
    """confluent-kafka's pitfall: a transaction open longer than transaction.timeout.ms is aborted by the broker,
    which fences its producer though no other exists; the error says that, and nothing of it is visible."""
    topic = make_topic(kafka, partitions=1)
    task = store_for(kafka, topic, "slow", 0, **{"transaction.timeout-ms": "1000"})
    send(task, ["late"])
    # The broker aborts on its own clock (transaction.abort.timed.out.transaction.cleanup).
    poll_until(lambda: not lso_held(kafka, topic), 60, "the broker aborting the timed-out transaction", 0.2)
    with pytest.raises(FencedError, match=r"longer than transaction.timeout-ms \(1000\)"):
        task.store.pre_commit()
    task.store.close()
    assert read_committed(kafka.client_config(), topic) == []


def lso_held(kafka, topic) -> bool:
    """Whether an open transaction still holds the partition's last stable offset below its end."""
    from confluent_kafka import Consumer, TopicPartition

    config = {**kafka.client_config(), "group.id": "lso", "isolation.level": "read_committed"}
    consumer = Consumer(config)
    try:
        lso = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()
    return lso < count_written(kafka.client_config(), topic)


def test_a_committed_epoch_is_not_written_again(kafka):
    """The marker: a task of an epoch its transactional id committed before sends nothing; a later epoch writes;
    another write id (another marker) writes. Negative control: the marker not checked, the replay duplicates."""
    topic = make_topic(kafka, partitions=1)
    skipped = []
    for epoch in (0, 0, 1, 0):  # epoch 0, its replay, epoch 1, a replay of 0 from an older checkpoint
        task = store_for(kafka, topic, "query-a", epoch)
        send(task, [f"e{epoch}"])
        skipped.append(task.store.pre_commit()["skipped"])
        task.store.close()
    assert skipped == [0, 1, 0, 1]
    assert sorted(r.value for r in read_committed(kafka.client_config(), topic)) == [b"e0", b"e1"]
    task = store_for(kafka, topic, "query-b", 0)
    send(task, ["e0"])
    assert task.store.pre_commit()["skipped"] == 0, "another write's marker is its own"
    task.store.close()
    task = store_for(kafka, topic, "query-a", 0, check_marker=False)
    send(task, ["e0"])
    task.store.pre_commit()
    task.store.close()
    assert sorted(r.value for r in read_committed(kafka.client_config(), topic)) == [b"e0", b"e0", b"e0", b"e1"]


def commit_uncounted(kafka, topic, write_id, values):
    """Task 0 of epoch 0 committed with a marker that does not count its records (as sluice wrote markers before
    they counted them): the mechanism of the next test switched off."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    consumer = Consumer({**kafka.client_config(), "group.id": f"sluice-eos-{write_id}-0",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    group = consumer.consumer_group_metadata()
    producer = Producer({**kafka.client_config(), "transactional.id": f"sluice-{write_id}-0"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value.encode())
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], group, 30)
    producer.commit_transaction(30)
    consumer.close()


def test_an_attempt_whose_input_ended_early_is_completed_by_its_retry(kafka):
    """Spark ends a Python writer's input when the step feeding it in the same task fails, and pyarrow takes the
    shortened stream for a whole one: that attempt may commit the records it had (docs/kafka.md). The marker counts
    them, so the retry, with the whole input, sends only the rest, and a later replay nothing. Negative control: a
    marker without the count (the mechanism off) makes the retry skip the whole task, and the rest is lost."""
    values = [f"r{i}" for i in range(10)]
    topic = make_topic(kafka, partitions=1)
    first = store_for(kafka, topic, "cut-short", 0)
    send(first, values[:4])  # the attempt whose input ended after 4 records, committed
    first.store.pre_commit()
    first.store.close()
    skipped = []
    for _ in range(2):  # the retry, then a replay of the epoch
        task = store_for(kafka, topic, "cut-short", 0)
        for part in (values[:3], values[3:7], values[7:]):  # a batch across the first attempt's end
            send(task, part)
        skipped.append(task.store.pre_commit()["skipped"])
        task.store.close()
    later = store_for(kafka, topic, "cut-short", 1)  # epoch 1, of 3 records: its marker counts 3
    send(later, ["s0", "s1", "s2"])
    later.store.pre_commit()
    later.store.close()
    task = store_for(kafka, topic, "cut-short", 0)  # epoch 0 replayed after epoch 1: all of it is in Kafka
    send(task, values)
    skipped.append(task.store.pre_commit()["skipped"])
    task.store.close()
    assert skipped == [4, 10, 10]
    assert sorted(r.value.decode() for r in read_committed(kafka.client_config(), topic)) == sorted(
        [*values, "s0", "s1", "s2"])

    topic = make_topic(kafka, partitions=1)
    commit_uncounted(kafka, topic, "uncounted", values[:4])
    task = store_for(kafka, topic, "uncounted", 0)
    send(task, values)
    assert task.store.pre_commit()["skipped"] == 10
    task.store.close()
    assert len(read_committed(kafka.client_config(), topic)) == 4  # six records lost


def replay(spark, kafka, tmp_path, fmt, older_copy: bool):
    """Micro-batch 0 committed into Kafka by its tasks but not in the checkpoint's commit log: the driver was killed
    between the two (older_copy=False: the checkpoint itself loses the commit), or the query is restarted from a copy
    of the checkpoint taken before its commit (older_copy=True: after batch 1 ran on the original). Returns the
    (records, distinct, duplicates) read_committed readers see at the end."""
    topic = make_topic(kafka)
    src, checkpoint, backup = tmp_path / "src", tmp_path / "checkpoint", tmp_path / "backup"
    src.mkdir(parents=True)

    def run(where):
        query = (spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).parquet(str(src))
                 .selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
                 .writeStream.format(fmt).options(**eo_options(kafka, topic))
                 .option("checkpointLocation", str(where)).trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert query.exception() is None

    pq.write_table(pa.table({"id": pa.array(range(0, 500), pa.int64())}), src / "0.parquet")
    run(checkpoint)
    lost = backup if older_copy else checkpoint
    if older_copy:
        shutil.copytree(checkpoint, backup)
    for name in ("0", ".0.crc"):
        (lost / "commits" / name).unlink(missing_ok=True)
    if older_copy:
        pq.write_table(pa.table({"id": pa.array(range(500, 800), pa.int64())}), src / "1.parquet")
        run(checkpoint)
        (src / "1.parquet").unlink()  # the copy's source log knows only batch 0's file
    run(lost)  # replays batch 0
    return counted(kafka, topic), 800 if older_copy else 500


@pytest.mark.parametrize("older_copy", [False, True], ids=["driver-killed-before-commit", "older-checkpoint-copy"])
def test_a_replayed_micro_batch_is_not_written_again(spark, kafka, tmp_path, unchecked, older_copy):
    (records, distinct, dupes), expected = replay(spark, kafka, tmp_path / "eo", "sluice_kafka", older_copy)
    assert (records, distinct, dupes) == (expected, expected, 0)
    (records, distinct, dupes), expected = replay(spark, kafka, tmp_path / "control", unchecked, older_copy)
    assert distinct == expected and dupes == 500, "negative control: without the marker, batch 0 lands twice"


def fails_once_committed(marker, at_id: int, config: dict, topic: str, committed: int):
    """A UDF returning id that, while `marker` exists, raises at `at_id`, but only once `committed` records of `topic`
    are visible to read_committed readers (another task's commit): the write fails after that task committed."""
    from pyspark.sql.functions import udf

    path = str(marker)

    @udf("long")
    def guard(i):
        import os
        import threading

        from sluice.testing import count_committed

        if i == at_id and os.path.exists(path):
            for _ in range(600):
                if count_committed(config, topic) >= committed:
                    raise RuntimeError(f"injected failure at id {i}")
                threading.Event().wait(0.1)  # another process's commit: polled
            raise AssertionError(f"{committed} records were not committed to {topic} within 60 s")
        return i

    return guard


def test_a_batch_write_rerun_with_its_write_id_completes_once(spark, kafka, tmp_path, unchecked):
    """Task 0 commits, task 1 fails for good: task 0's rows are visible (tasks commit their own transactions). The
    re-run with the same sink.write-id sends task 1's rows only; another re-run sends nothing. Negative controls: a
    new write id writes everything again; the marker switched off duplicates task 0's rows."""
    marker, topic = tmp_path / "fail", make_topic(kafka)
    marker.touch()
    rows = spark.range(0, 2000, 1, 2).select(fails_once_committed(marker, 1500, kafka.client_config(), topic, 1000)
                                             ("id").alias("id")).selectExpr("CAST(id AS STRING) AS value")
    options = eo_options(kafka, topic, **{"sink.write-id": "nightly-2026-11-27"})
    with pytest.raises(Exception, match="injected failure at id 1500"):
        sluice.write(rows, "sluice_kafka", options)
    assert counted(kafka, topic) == (1000, 1000, 0), "task 0 committed; task 1's transaction was aborted"
    marker.unlink()
    sluice.write(rows, "sluice_kafka", options)
    assert counted(kafka, topic) == (2000, 2000, 0)
    sluice.write(rows, "sluice_kafka", options)  # again: every task's marker says done
    assert counted(kafka, topic) == (2000, 2000, 0)
    sluice.write(rows, "sluice_kafka", {**options, "sink.write-id": "another-write"})
    assert counted(kafka, topic) == (4000, 2000, 2000)
    rows.write.format(unchecked).options(**options).mode("append").save()
    assert counted(kafka, topic)[0] == 6000, "negative control: without the marker the same write id writes again"


def test_by_partition_gives_each_task_a_share_of_the_partitions_and_each_record_lands_in_its_own(spark, kafka):
    """transaction.by-partition: sluice.partitioned() puts each Kafka partition's rows in one Spark task, so a task's
    transaction adds only its share of the topic's partitions; the partition computed from the key is the one the
    brokers hold the record in (Kafka's murmur2, as librdkafka's murmur2_random picks it). Negative control: the
    DataFrame as it comes spreads every task's rows over all the partitions."""
    from pyspark.sql.functions import spark_partition_id

    from sluice.connectors.kafka._partitioner import kafka_partitions

    topic = make_topic(kafka, partitions=12)
    rows = spark.range(0, 600, 1, 3).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    options = eo_options(kafka, topic, **{"transaction.by-partition": "true"})

    def shares(df):
        """The Kafka partitions of each Spark task's rows."""
        got = df.select(spark_partition_id().alias("task"), "key").collect()
        by_task: dict[int, set[int]] = {}
        for row, partition in zip(got, kafka_partitions(pa.array([r.key for r in got]), 12).to_pylist(), strict=True):
            by_task.setdefault(row.task, set()).add(partition)
        return by_task

    laid_out = shares(sluice.partitioned(rows, "sluice_kafka", options))
    assert sum(len(p) for p in laid_out.values()) == 12 == len(set().union(*laid_out.values())), \
        f"each Kafka partition in exactly one task: {laid_out}"
    assert all(len(p) == 12 for p in shares(rows).values()), "negative control: every task writes every partition"

    sluice.write(rows, "sluice_kafka", options)
    records = read_committed(kafka.client_config(), topic)
    assert sorted(int(r.value) for r in records) == list(range(600))
    keys = pa.array([r.key for r in records], pa.binary())
    assert kafka_partitions(keys, 12).to_pylist() == [r.partition for r in records]
    with pytest.raises(Exception, match=r"transaction.by-partition only applies to sink.transactional=true"):
        sluice.partitioned(rows, "sluice_kafka", {**options, "sink.transactional": "false"})

