"""Kafka as a hop of a sluice pipeline (docs/tablestore.md, "Kafka as a hop"): a bank's transfers are written into a
Kafka topic by `sluice_kafka` exactly-once (one Kafka transaction per task; a transfer's two legs in one task and, by
their key, in one partition), one write's first attempt killed after some of its legs reached the broker (its
transaction aborted by the retry); a streaming query reads the topic (`read_committed`) into a table-store table, one
barrier per micro-batch. Read at every barrier the MetaService completed, the table holds whole transfers only, each
committed leg once (the bank's total holds), and at the end every committed transfer exactly once and nothing of the
aborted transaction. Negative controls: the same pipeline reading `read_uncommitted` stores the aborted transaction's
legs too (transfers with more than two legs at the barriers, each aborted record a second copy at the end); capped
micro-batches (`max-records-per-trigger`) end inside transactions, and barriers hold half transfers."""

import uuid
from collections import Counter

import pyarrow.compute as pc
import pytest

import sluice.tablestore
from sluice.meta import MetaService
from sluice.testing import LocalKafka, count_written, read_committed
from tests.faults import Striker, held_at, kill_python_workers, poll_until, sockets_to

pytestmark = pytest.mark.spark

TRANSFERS_PER_WRITE = 150  # a write's two tasks split its legs at a transfer's boundary (each task 75 transfers)
HOLD_AT = 240  # the killed attempt's input stops before this leg of its write (~240 KB made: the pipes' buffers
ABORTED_AT_LEAST = 60  # let at least this many of them reach the sink, which the test waits for before the kill)
ACCOUNTS = 17
LEGS = "transfer long, leg int, account int, delta long"


@pytest.fixture(scope="module")
def kafka():
    with LocalKafka(heap_mb=384) as server:
        yield server


def kill_writer_when_sent(kafka, topic, offsets: int, hold) -> Striker:
    """Once the broker's log has `offsets` offsets (some of the held attempt's records are in its open
    transaction), SIGKILL the Python worker of the sink (the one connected to the broker) and let the input go on:
    the retry's init_transactions aborts the killed attempt's transaction."""
    port = int(kafka.bootstrap_servers.rsplit(":", 1)[1])
    # The reading query's workers keep their consumers connected while idle in Spark's pool (for the worker's life);
    # killed, one of them may be handed to the retried write, which then dies too. Only the write's own connections,
    # opened after this, mark the workers to kill.
    before = sockets_to(port)

    def strike():
        try:
            poll_until(lambda: count_written(kafka.client_config(), topic) >= offsets, 120,
                       f"the sink sending {offsets} offsets into {topic}")
            assert kill_python_workers(port, before) >= 1, "no Python worker of the sink was connected to the broker"
        finally:
            hold.unlink()

    striker = Striker(strike)
    striker.start()
    return striker


def legs(spark, first_transfer: int, tasks: int):
    """TRANSFERS_PER_WRITE transfers from `first_transfer`, two legs each (debit then credit), ~1 KB a record so
    the records reach the sink while its input is still running."""
    first = 2 * first_transfer
    return spark.range(first, first + 2 * TRANSFERS_PER_WRITE, 1, tasks).selectExpr(
        "id", "repeat('x', 1000) AS pad")


def as_records(df):
    return df.selectExpr("id DIV 2 AS transfer", "CAST(id % 2 AS int) AS leg", "pad").selectExpr(
        "transfer", "leg",
        f"CAST(IF(leg = 0, transfer % {ACCOUNTS}, (transfer + 1 + transfer DIV {ACCOUNTS} % {ACCOUNTS - 1}) "
        f"% {ACCOUNTS}) AS int) AS account",
        "IF(leg = 0, -1, 1) * (transfer % 50 + 1) AS delta", "pad").selectExpr(
        "CAST(transfer AS STRING) AS key", "to_json(struct(transfer, leg, account, delta, pad)) AS value")


def problems_at_barriers(meta, table, seen: set[int]) -> tuple[list[str], int]:
    """Read `table` at every completed barrier not read yet: whole transfers only (two legs each, the total
    unchanged), no Kafka record twice."""
    found, checked = [], 0
    for barrier, version in meta.barriers(table.name):
        if barrier in seen:
            continue
        seen.add(barrier)
        checked += 1
        data = table.delta(version).to_pyarrow_table(columns=["transfer", "delta", "partition", "offset"])
        total = pc.sum(data.column("delta")).as_py() or 0
        per_transfer = Counter(data.column("transfer").to_pylist())
        torn = sorted(t for t, n in per_transfer.items() if n != 2)
        records = Counter(zip(data.column("partition").to_pylist(), data.column("offset").to_pylist(), strict=True))
        twice = sum(1 for n in records.values() if n > 1)
        if total != 0 or torn or twice:
            found.append(f"barrier {barrier} (version {version}): the total moved by {total}, transfers without "
                         f"exactly two legs {torn[:5]}, Kafka records stored twice: {twice}")
    return found, checked


READS = {"read-committed": {},
         "negative-control-read-uncommitted": {"kafka.isolation.level": "read_uncommitted"},
         "negative-control-capped-micro-batches": {"max-records-per-trigger": "101"}}


@pytest.mark.parametrize("read", list(READS))
def test_a_kafka_topic_into_the_table_store_is_read_consistently_at_every_barrier(spark, kafka, small_arrow_batches,
                                                                                   tmp_path, read):
    topic = f"bank-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, partitions=2)
    config = kafka.client_config()
    store = {"warehouse": str(tmp_path / "wh"), "meta": str(tmp_path / "meta.db")}
    meta = MetaService(store["meta"])
    table = sluice.tablestore.StoreTable("legs", store["warehouse"])
    sink = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "sink.mode": "global-ordered",
            "sink.transactional": "true", "sink.batch.max-size": "20", "sink.flush-buffer.timeout": "20",
            "transaction.timeout-ms": "600000"}  # the aborted transaction ends by the retry, not the broker's timeout
    query = (spark.readStream.format("sluice_kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
             .option("subscribe", topic).options(**READS[read]).load()
             .selectExpr(f"from_json(CAST(value AS STRING), '{LEGS}') AS leg", "partition", "offset")
             .select("leg.*", "partition", "offset")
             .writeStream.format("tablestore").option("table", "legs").options(**store)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds").start())
    hold = tmp_path / "hold"
    writes = 4
    seen: set[int] = set()
    problems, checked = [], 0
    try:
        for w in range(writes):
            first = w * TRANSFERS_PER_WRITE
            df = legs(spark, first, tasks=2)
            striker = None
            if w == 1:  # one task, whose first attempt is killed after sending some of its legs
                hold.touch()
                sent = count_written(kafka.client_config(), topic)
                striker = kill_writer_when_sent(kafka, topic, sent + ABORTED_AT_LEAST, hold)
                df = legs(spark, first, tasks=1).mapInArrow(held_at(2 * first + HOLD_AT, str(hold), 25, 0),
                                                            "id long, pad string")
            as_records(df).write.format("sluice_kafka").options(**sink) \
                .option("sink.write-id", f"bank-{read}-{w}").mode("append").save()
            if striker is not None:
                striker.join(60)
            before = len(seen)  # the stream takes the write: a barrier at each of them
            poll_until(lambda n=before: len(meta.barriers("legs")) > n, 120, f"a barrier after write {w}", 0.1)
            found, n = problems_at_barriers(meta, table, seen)  # read while the stream goes on
            problems, checked = problems + found, checked + n
        query.processAllAvailable()
    finally:
        query.stop()
    found, n = problems_at_barriers(meta, table, seen)
    problems, checked = problems + found, checked + n

    committed = read_committed(config, topic)
    everything = read_committed(config, topic, isolation="read_uncommitted")
    aborted = len(everything) - len(committed)
    assert len(committed) == 2 * writes * TRANSFERS_PER_WRITE and aborted >= ABORTED_AT_LEAST, \
        (len(committed), aborted, "the log holds the committed legs and the aborted attempt's")
    assert checked >= 3, f"only {checked} barriers: the check did not see the pipeline at several points"
    last = table.delta().to_pyarrow_table(columns=["transfer", "leg"])
    stored = Counter(zip(last.column("transfer").to_pylist(), last.column("leg").to_pylist(), strict=True))
    every_leg_once = Counter({(t, leg): 1 for t in range(writes * TRANSFERS_PER_WRITE) for leg in (0, 1)})
    if read == "read-committed":
        assert problems == [], problems
        assert stored == every_leg_once, "every committed leg exactly once, nothing of the aborted transaction"
        barrier, frames = sluice.tablestore.read_consistent(spark, ["legs"], **store)
        assert frames["legs"].selectExpr("sum(delta)").first()[0] == 0
        assert barrier == meta.barriers("legs")[-1][0]
    elif read == "negative-control-capped-micro-batches":
        # Admission control ends micro-batches at an offset count (101 over two partitions), inside transactions:
        # barriers hold half transfers, though each record is read once.
        assert stored == every_leg_once
        assert any("exactly two legs []" not in p for p in problems), problems
    else:
        again = sorted(leg for leg, n in stored.items() if n > 1)
        assert len(again) == aborted, "every record of the aborted transaction was read, as a second copy"
        assert any("exactly two legs []" not in p for p in problems), problems
        assert sum(stored.values()) == len(everything)
