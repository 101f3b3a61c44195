"""The transactional outbox: messages a business transaction emits with pg_logical_emit_message, streamed by
format("postgres_changes") with option 'messages.prefix' into format("sluice_kafka") exactly-once
(sink.transactional=true), through a driver killed between the tasks' Kafka commits and Spark's commit: the
restarted query replays that micro-batch from the checkpoint, its messages read again from the slot (which moves only
as Spark commits) and not written again. Negative control: a sink without transactions writes them twice."""

import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from sluice.testing import LocalPostgres, read_committed

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def lpg():
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


def newest(checkpoint: Path, log: str) -> int:
    return max(int(p.name) for p in (checkpoint / log).iterdir() if p.name.isdigit())


@pytest.mark.parametrize("transactional", [True, False], ids=["exactly-once", "negative-control-at-least-once"])
def test_an_outbox_reaches_kafka_once_through_a_driver_killed_before_spark_committed(spark, kafka, lpg, tmp_path,
                                                                                      transactional):
    topic, slot, checkpoint = f"outbox-{uuid.uuid4().hex[:8]}", f"sluice_outbox_{transactional}".lower(), \
        tmp_path / "checkpoint"
    kafka.create_topic(topic, partitions=1)
    with psycopg.connect(lpg.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id int)")
    sink = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic}
    if transactional:
        sink |= {"sink.mode": "global-ordered", "sink.transactional": "true"}

    def run():
        query = (spark.readStream.format("postgres_changes")
                 .options(url=lpg.url, slot=slot, **{"messages.prefix": "outbox", "max-changes-per-trigger": "8"})
                 .load().selectExpr("CAST(message_lsn AS STRING) AS key", "content AS value")
                 .writeStream.format("sluice_kafka").options(**sink).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert query.exception() is None

    run()  # creates the slot: the outbox is streamed from here on
    orders(lpg.url, range(20))
    run()
    last = newest(checkpoint, "commits")
    assert last >= 2, "max-changes-per-trigger=8 cuts 20 messages into 3 micro-batches"
    # The driver killed after the tasks committed the last micro-batch into Kafka, before Spark's commit log has it.
    for name in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    orders(lpg.url, range(20, 25))
    run()  # replays that micro-batch, then streams the new orders
    values = Counter(r.value.decode() for r in read_committed(kafka.client_config(), topic))
    assert set(values) == {f"order {i}" for i in range(25)}, "every committed order's message, no rolled back one"
    repeated = sum(n - 1 for n in values.values())
    if transactional:
        assert repeated == 0
    else:
        assert repeated == 4, "the replayed micro-batch (orders 16-19) is written twice"
