"""The transactional outbox: messages business transactions emit with pg_logical_emit_message, streamed by
format("postgres_changes") with option 'messages.prefix' into format("sluice_kafka") exactly-once
(sink.transactional=true), through a driver that dies between the tasks' Kafka commits and Spark's commit of the
micro-batch: the restarted query replays that micro-batch from the checkpoint, its messages read again from the slot
(which moves only as Spark commits) and not written again. Negative control: without transactions they land twice."""

import os
import tempfile
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from sluice.connectors.kafka import KafkaDataSource
from sluice.sink._arrow_writers import EngineStreamArrowWriter
from sluice.testing import LocalPostgres, read_committed

pytestmark = pytest.mark.spark


class DriverDiesAtCommit(EngineStreamArrowWriter):
    """The engine's stream writer, whose driver-side commit fails while `marker` exists: the micro-batch's tasks have
    committed into Kafka and Spark's commit log never gets it, as when the driver dies right there."""

    marker = ""

    def commit(self, messages, batchId):  # Spark's name
        if os.path.exists(self.marker):
            raise RuntimeError("the driver is gone between the tasks' commits and Spark's (the test's fault)")
        super().commit(messages, batchId)


class DyingDriverKafka(KafkaDataSource):
    format_name = "sluice_kafka_dying_driver"

    def streamWriter(self, schema, overwrite):
        writer = super().streamWriter(schema, overwrite)
        writer.__class__ = DriverDiesAtCommit
        writer.marker = dies_marker(self.options["topic"])
        return writer


def dies_marker(topic: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"sluice-driver-dies-{topic}")


@pytest.fixture(scope="module")
def lpg(spark):
    spark.dataSource.register(DyingDriverKafka)
    with LocalPostgres(settings={"wal_level": "logical", "synchronous_commit": "on"}) as server:
        yield server


def orders(url, numbers):
    """One business transaction per order: its row and its outbox message commit together; one more rolls back."""
    with psycopg.connect(url) as conn:
        for i in numbers:
            conn.execute("INSERT INTO orders VALUES (%s)", (i,))
            conn.execute("SELECT pg_logical_emit_message(true, 'outbox', %s)", (f"order {i}",))
            conn.commit()
        conn.execute("SELECT pg_logical_emit_message(true, 'outbox', 'rolled back')")
        conn.rollback()


@pytest.mark.parametrize("transactional", [True, False], ids=["exactly-once", "negative-control-at-least-once"])
def test_an_outbox_reaches_kafka_once_through_a_driver_gone_before_spark_committed(spark, kafka, lpg, tmp_path,
                                                                                    transactional):
    topic, slot, checkpoint = f"outbox-{uuid.uuid4().hex[:8]}", f"sluice_outbox_{transactional}".lower(), \
        tmp_path / "checkpoint"
    kafka.create_topic(topic, partitions=1)
    with psycopg.connect(lpg.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id int)")
    sink = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic}
    if transactional:
        sink |= {"sink.mode": "global-ordered", "sink.transactional": "true"}

    from pyspark.errors import StreamingQueryException

    def run():
        query = (spark.readStream.format("postgres_changes")
                 .options(url=lpg.url, slot=slot, **{"messages.prefix": "outbox", "max-changes-per-trigger": "4"})
                 .load().selectExpr("CAST(message_lsn AS STRING) AS key", "content AS value")
                 .writeStream.format(DyingDriverKafka.format_name).options(**sink)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        try:
            query.awaitTermination(180)
        except StreamingQueryException as e:
            return e
        return None

    assert run() is None  # creates the slot: the outbox is streamed from here on
    orders(lpg.url, range(10))
    assert run() is None
    marker = Path(dies_marker(topic))
    marker.touch()
    try:
        orders(lpg.url, range(10, 15))
        assert "the driver is gone" in str(run())
    finally:
        marker.unlink()
    assert run() is None  # replays the micro-batch Spark did not commit (orders 10-13), then order 14
    values = Counter(r.value.decode() for r in read_committed(kafka.client_config(), topic))
    assert set(values) == {f"order {i}" for i in range(15)}, "every committed order's message, no rolled back one"
    repeated = sorted(v for v, n in values.items() if n > 1)
    if transactional:
        assert repeated == [] and sum(values.values()) == 15
    else:
        assert repeated == [f"order {i}" for i in range(10, 14)], "the replayed micro-batch is written twice"
