"""Kafka -> PostgreSQL freshness for bench/latency/ (`--hops kafka`), every path on one broker, server and session.

A producer thread (confluent-kafka, linger.ms=1) sends `rate` messages/s on a fixed schedule of 1,000 ticks a second
into a fresh topic of 2 partitions per path and rate; each value begins with its send time (microseconds since the
epoch, 16 digits). Each row lands in PostgreSQL as (sent_us, part, off); its arrival is the commit time of the
transaction that made it visible (`pg_xact_commit_timestamp(xmin)`, `track_commit_timestamp=on`): one machine, one
clock. Freshness = arrival - send time, over the messages sent in the measured seconds. The paths:
- sluice-microbatch: `format("sluice_kafka")` -> `format("postgres")`, trigger processingTime 0;
- spark-microbatch: Spark's `format("kafka")` (spark-sql-kafka-0-10, by its Maven coordinates) -> `format("postgres")`,
  trigger 0;
- spark-realtime-5s / -1s: Spark's Kafka source, `trigger(realTime=...)`, update mode, into a PySpark `foreach` with a
  Python ForeachWriter (COPY of what it holds once 1,000 rows or 5 ms old, a thread flushing the stragglers); 1 s
  needs `spark.sql.streaming.realTimeMode.minBatchDuration` lowered from its 5 s default;
- consumer-loop: no Spark, a `confluent_kafka.Consumer` in a process of its own (this file run as a script):
  `poll()` for one message then `consume(9999, 0)` for what the client holds, COPY of the batch, commit, then the
  offsets: the hand-written floor.
Before the load, one seed message must arrive (the path is running); after it, every message sent must arrive.
`refusals()` tries what real-time mode refuses to Python data sources and records Spark's own error text.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid

import psycopg

from bench.checkouts import ROOT, module_command
from bench.measures import percentile

# spark-sql-kafka-0-10_2.13 on Maven Central per Spark line (none for 4.3.0): the newest patch served.
SPARK_KAFKA = {"4.0": "4.0.0", "4.1": "4.1.1", "4.2": "4.2.0"}
PATHS = ("sluice-microbatch", "spark-microbatch", "spark-realtime-5s", "spark-realtime-1s", "consumer-loop")
MIN_BATCH_CONF = "spark.sql.streaming.realTimeMode.minBatchDuration"
ALLOWLIST_CONF = "spark.sql.streaming.realTimeMode.allowlistCheck"
TICKS_PER_SECOND = 1000
PAD = b"-" * 84  # a 100-byte value


def spark_kafka_conf(pyspark_version: str) -> dict[str, str]:
    """Spark settings that put Spark's Kafka connector on the session's classpath, fetched from Maven Central by its
    coordinates (Ivy, into ~/.cache/sluice/spark-kafka); SystemExit saying what to run on a line without one."""
    from pathlib import Path

    line = ".".join(pyspark_version.split(".")[:2])
    if line not in SPARK_KAFKA:
        raise SystemExit(f"--hops kafka needs Spark's Kafka connector, which Maven Central serves for Spark lines "
                         f"{', '.join(SPARK_KAFKA)}, not for pyspark {pyspark_version}; run it on the 4.2 line: "
                         "make .venv-spark-4.2/.installed && .venv-spark-4.2/bin/python -m bench.latency --hops kafka")
    home = Path.home() / ".cache" / "sluice" / "spark-kafka"
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "ivysettings.xml"  # Maven Central alone (Spark's default chain tries ~/.m2 first)
    settings.write_text('<ivysettings>\n  <settings defaultResolver="central"/>\n  <resolvers>\n'
                        '    <ibiblio name="central" m2compatible="true" root="https://repo1.maven.org/maven2/"/>\n'
                        '  </resolvers>\n</ivysettings>\n')
    return {"spark.jars.packages": f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_KAFKA[line]}",
            "spark.jars.ivySettings": str(settings), "spark.jars.ivy": str(home / "ivy")}


class Producer(threading.Thread):
    """Sends `rate` messages a second on a fixed schedule (a late tick does not push the later ones back); each value
    starts with its send time in microseconds."""

    def __init__(self, config: dict, topic: str, rate: int) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer as KafkaProducer

        self.producer = KafkaProducer({**config, "linger.ms": 1, "acks": "all"})
        self.topic, self.rate = topic, rate
        self.sent = 0
        self.failed: list[str] = []
        self.behind_max_s = 0.0
        self._halt = threading.Event()

    def send(self, n: int) -> None:
        self.producer.produce(self.topic, b"%016d" % (time.time_ns() // 1000) + PAD, key=b"%d" % n,
                              on_delivery=self._delivered)

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.failed.append(str(err))

    def run(self) -> None:
        began, tick = time.monotonic(), 0
        while not self._halt.is_set():
            due = began + tick / TICKS_PER_SECOND
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            else:
                self.behind_max_s = max(self.behind_max_s, now - due)
            tick += 1
            for _ in range(self.rate * tick // TICKS_PER_SECOND - self.sent):
                self.send(self.sent)
                self.sent += 1
            self.producer.poll(0)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        assert self.producer.flush(60) == 0, "the producer could not deliver every message in 60 s"
        assert not self.failed, f"{len(self.failed)} messages failed: {self.failed[:3]}"


def foreach_writer(pg_url: str, table: str):
    """A Python ForeachWriter into `table`, as a user would write one for low latency: COPY of the rows it holds once
    1,000 rows or 5 ms old, a thread flushing the stragglers (rows reach `process` in bursts)."""

    class PostgresForeachWriter:
        def open(self, partition_id: int, epoch_id: int) -> bool:
            self.conn = psycopg.connect(pg_url)
            self.rows: list[tuple[int, int, int]] = []
            self.first = 0.0
            self.lock = threading.Lock()
            self.halt = threading.Event()
            self.flusher = threading.Thread(target=self._flush_late, daemon=True)
            self.flusher.start()
            return True

        def process(self, row) -> None:
            with self.lock:
                if not self.rows:
                    self.first = time.monotonic()
                self.rows.append((row.sent_us, row.part, row.off))
                if len(self.rows) >= 1000:
                    self._flush()

        def _flush(self) -> None:
            with self.conn.cursor().copy(f"COPY {table} (sent_us, part, off) FROM STDIN") as copy:
                for r in self.rows:
                    copy.write_row(r)
            self.conn.commit()
            self.rows = []

        def _flush_late(self) -> None:
            while not self.halt.wait(0.002):
                with self.lock:
                    if self.rows and time.monotonic() - self.first >= 0.005:
                        self._flush()

        def close(self, error) -> None:
            self.halt.set()
            self.flusher.join()
            try:
                if error is None and self.rows:
                    self._flush()
            finally:
                self.conn.close()

    return PostgresForeachWriter()


def _value_columns(df):
    return df.selectExpr("CAST(CAST(substring(value, 1, 16) AS STRING) AS BIGINT) AS sent_us", "partition AS part",
                         "offset AS off")


def start_query(spark, path: str, bootstrap: str, topic: str, pg_url: str, table: str, checkpoint: str):
    """The streaming query of a Spark path, started."""
    if path == "sluice-microbatch":
        source = spark.readStream.format("sluice_kafka").option("kafka.bootstrap.servers", bootstrap)
    else:
        source = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    df = _value_columns(source.option("subscribe", topic).option("startingOffsets", "earliest").load())
    if path.endswith("microbatch"):
        return (df.writeStream.format("postgres").options(url=pg_url, table=table)
                .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start())
    seconds = {"spark-realtime-5s": 5, "spark-realtime-1s": 1}[path]
    spark.conf.set(MIN_BATCH_CONF, f"{seconds}s")
    return (df.writeStream.foreach(foreach_writer(pg_url, table)).outputMode("update")
            .option("checkpointLocation", checkpoint).trigger(realTime=f"{seconds} seconds").start())


class ConsumerLoop:
    """The hand-written floor in a process of its own (this file run as a script); its settings go on stdin (the
    server's password never on a command line)."""

    def __init__(self, config: dict, topic: str, pg_url: str, table: str) -> None:
        import tempfile

        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in stop(); not a pipe, which could fill
        self.proc = subprocess.Popen(module_command("bench.latency.kafka_hop"), stdin=subprocess.PIPE,
                                     stdout=self.log, stderr=self.log, text=True, cwd=ROOT)
        self.proc.stdin.write(json.dumps({"config": config, "topic": topic, "url": pg_url, "table": table}))
        self.proc.stdin.close()

    def _output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the consumer loop exited ({self.proc.returncode}): {self._output()}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # faulthandler: where it is stuck, into its output
            time.sleep(1)
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the consumer loop did not stop within 30 s of SIGTERM: {self._output()}") from None
        finally:
            output = self._output()
            self.log.close()
        assert code == 0, f"the consumer loop failed ({code}): {output}"


def consumer_main() -> None:
    import faulthandler

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    faulthandler.register(signal.SIGUSR1)
    settings = json.loads(sys.stdin.read())
    halt = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: halt.set())
    table = settings["table"]
    consumer = Consumer({**settings["config"], "group.id": f"latency-{table}", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(settings["topic"], p, OFFSET_BEGINNING) for p in (0, 1)])
    with psycopg.connect(settings["url"]) as conn:
        while not halt.is_set():
            # Block for the first message only, then take what the client holds: consume(n, timeout) would wait
            # its whole timeout for n messages.
            first = consumer.poll(0.1)
            if first is None:
                continue
            messages = [first, *consumer.consume(9999, 0)]
            for m in messages:
                if m.error() is not None:
                    raise RuntimeError(f"consume: {m.error()}")
            with conn.cursor().copy(f"COPY {table} (sent_us, part, off) FROM STDIN") as copy:
                for m in messages:
                    copy.write_row((int(m.value()[:16]), m.partition(), m.offset()))
            conn.commit()
            consumer.commit(asynchronous=True)  # after the rows are committed: at-least-once
    # close() was seen to hang past SIGTERM now and then (confluent-kafka 2.16.1, commits in flight): bounded here,
    # the offsets were committed along the way.
    closing = threading.Thread(target=consumer.close, daemon=True)
    closing.start()
    closing.join(10)


def _wait(arrived, at_least: int, timeout: float, what: str, check) -> None:
    deadline = time.monotonic() + timeout
    while arrived() < at_least:
        check()
        assert time.monotonic() < deadline, f"{what}: {arrived()} of {at_least} rows in PostgreSQL after {timeout} s"
        time.sleep(0.2)  # PostgreSQL offers no event for rows arriving in a table


def measure(spark, kafka, pg_url: str, path: str, rate: int, seconds: float, warmup: float, workdir: str) -> dict:
    tag = f"{path.replace('-', '_')}_{rate}"
    topic = f"latency-{tag}-{uuid.uuid4().hex[:6]}"
    table = f"kafka_{tag}"
    kafka.create_topic(topic, partitions=2)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (sent_us bigint, part int, off bigint)")
    producer = Producer(kafka.client_config(), topic, rate)
    producer.send(-1)  # the seed: its arrival says the path runs
    producer.producer.flush(30)
    query = consumer = None
    if path == "consumer-loop":
        consumer = ConsumerLoop(kafka.client_config(), topic, pg_url, table)
        check = consumer.check
    else:
        query = start_query(spark, path, kafka.bootstrap_servers, topic, pg_url, table,
                            os.path.join(workdir, f"checkpoint-{tag}"))

        def check() -> None:
            if query.exception() is not None:
                raise RuntimeError(f"{path} failed: {query.exception()}")

    def arrived() -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return conn.execute(f"SELECT count(DISTINCT (part, off)) FROM {table}").fetchone()[0]

    try:
        _wait(arrived, 1, 180, f"{path}: the seed message", check)
        producer.start()
        time.sleep(warmup)  # the load's pace, not an event to wait for
        measure_from = time.time_ns() // 1000
        time.sleep(seconds)
        measure_to = time.time_ns() // 1000
        producer.stop()
        _wait(arrived, producer.sent + 1, 300, f"{path}: catch-up", check)
        progress = [json.loads(p.json) for p in query.recentProgress] if query is not None else []
    finally:
        if producer.is_alive():
            producer.stop()
        if query is not None:
            query.stop()
        if consumer is not None:
            consumer.stop()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ms = [float(r[0]) for r in conn.execute(
            f"SELECT (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1e6 - sent_us) / 1000 FROM {table} "
            "WHERE sent_us >= %s AND sent_us < %s", (measure_from, measure_to))]
        rows, distinct = conn.execute(f"SELECT count(*), count(DISTINCT (part, off)) FROM {table}").fetchone()
    assert distinct == producer.sent + 1, f"{path}: {distinct} distinct messages arrived of {producer.sent + 1}"
    batches = [p for p in progress if p.get("numInputRows", 0)]
    return {"path": path, "rate_offered": rate, "messages_measured": len(ms), "duplicates": rows - distinct,
            "producer_behind_max_s": round(producer.behind_max_s, 3),
            "p50_ms": round(percentile(ms, .5), 1), "p99_ms": round(percentile(ms, .99), 1),
            "max_ms": round(max(ms), 1),
            **({"batches": len(batches),
                "rows_per_batch_median": statistics.median(p["numInputRows"] for p in batches),
                "phases_median_ms": {name: statistics.median(p["durationMs"].get(name, 0) for p in batches)
                                     for name in ("triggerExecution", "latestOffset", "addBatch", "walCommit",
                                                  "commitOffsets")}}
               if batches else {})}


def refusals(spark, kafka, pg_url: str, workdir: str) -> dict[str, str]:
    """What real-time mode does with a Python data source, as sink (with the allowlist check off) and as source:
    Spark's error text (first 600 characters), or what ran."""
    topic = f"latency-refusal-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS kafka_refusal")
        conn.execute("CREATE TABLE kafka_refusal (sent_us bigint, part int, off bigint)")
    found: dict[str, str] = {}

    def attempt(name: str, start) -> None:
        from pyspark.errors import PySparkException

        began, stage, query = time.monotonic(), "start()", None
        try:
            query = start()
            stage = "the query"
            ended = query.awaitTermination(120)  # raises the query's error
            found[name] = "ended without an error" if ended else "ran for 120 s without an error"
        except PySparkException as e:  # Spark's refusal is the figure recorded
            found[name] = f"{stage} failed after {time.monotonic() - began:.1f} s: {type(e).__name__}: {str(e)[:600]}"
        finally:
            if query is not None:
                query.stop()

    spark.conf.set(MIN_BATCH_CONF, "5s")
    spark.conf.set(ALLOWLIST_CONF, "false")
    try:
        attempt("sluice postgres sink, allowlistCheck=false", lambda: (
            _value_columns(spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                           .option("subscribe", topic).option("startingOffsets", "earliest").load())
            .writeStream.format("postgres").options(url=pg_url, table="kafka_refusal").outputMode("update")
            .option("checkpointLocation", os.path.join(workdir, "checkpoint-refusal-sink"))
            .trigger(realTime="5 seconds").start()))
    finally:
        spark.conf.set(ALLOWLIST_CONF, "true")
    attempt("sluice_kafka source into foreach", lambda: (
        _value_columns(spark.readStream.format("sluice_kafka").option("kafka.bootstrap.servers",
                                                                      kafka.bootstrap_servers)
                       .option("subscribe", topic).option("startingOffsets", "earliest").load())
        .writeStream.foreach(foreach_writer(pg_url, "kafka_refusal")).outputMode("update")
        .option("checkpointLocation", os.path.join(workdir, "checkpoint-refusal-source"))
        .trigger(realTime="5 seconds").start()))
    return found


if __name__ == "__main__":
    consumer_main()
