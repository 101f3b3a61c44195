"""Kafka side by side, one run, one throwaway broker (LocalKafka; `make check-kafka` fetches it), local[2]:

- sink: format("sluice_kafka") unordered (at-least-once, idempotent producer) and exactly-once (global-ordered +
  transactional) with 2 tasks, against confluent-kafka's Producer in one process (no Spark) and Spark's own Kafka
  sink (format("kafka"), at-least-once only), all on the same rows;
- source: spark.read.format("sluice_kafka") against Spark's own Kafka source (format("kafka")) on the same topic,
  both read_committed, the same aggregate over key and value (count, sum of lengths) so both read both columns;
  beside them two floors: confluent-kafka's Consumer reading the topic without Spark (Message objects only; one
  process for both partitions, and a process per partition), and a Python data source that yields ready-made Arrow
  batches of the source's schema and row count, no Kafka (what Spark's hand-over of a Python source's batches costs
  this query: no Python data source reads faster). `--source-only` runs the source's contenders alone.

Run on a Spark line that Spark's Kafka connector is published for (4.0.0, 4.1.1, 4.2.0 on Maven Central; not 4.3),
with sluice installed there as `make test-spark-4.2` does (the wheel of this checkout):

    make .venv-spark-4.2/.installed
    .venv-spark-4.2/bin/pip wheel . --no-deps --no-build-isolation -q -w build/bench-wheel
    .venv-spark-4.2/bin/pip install -q --no-deps --force-reinstall build/bench-wheel/sluice-*.whl
    .venv-spark-4.2/bin/python -m bench.stores.kafka_sink_source [--rows 1000000] [--rounds 3] [--source-only]

Spark's connector comes by coordinates (spark.jars.packages, from Maven Central or ~/.m2). The script refuses to
run on a line without the connector, or with an installed sluice that differs from this checkout, and says the
command that fixes it.

Data: N rows of (key: the id as text, value: 100 bytes of text) in a cached DataFrame of 2 partitions. Every
contender writes a fresh topic of 2 partitions; one untimed write of each kind first (Python workers, Spark's
connector classes, the broker's producer ids). Rounds alternate the contenders, so a busy moment of the shared
machine falls on all of them; each figure is the best of --rounds. Every topic written is counted by a
read_committed consumer (sluice.testing.count_committed), and every read's count and byte sums are checked, so
nothing faster than possible is reported.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench.checkouts import ROOT
from bench.floors.kafka_floors import consume, consume_per_partition, register_arrow_floor

# Spark's Kafka connector as Maven Central serves it per Spark line (Scala 2.13).
CONNECTOR = {"4.0": "4.0.0", "4.1": "4.1.1", "4.2": "4.2.0"}
VALUE_BYTES = 100


def connector_package() -> str:
    import pyspark

    line = ".".join(pyspark.__version__.split(".")[:2])
    if line not in CONNECTOR:
        raise SystemExit(
            f"pyspark {pyspark.__version__}: Spark's Kafka connector (spark-sql-kafka-0-10_2.13) is published for "
            f"Spark {', '.join(CONNECTOR)} only. Run on the 4.2 line: `make .venv-spark-4.2/.installed`, install "
            "this checkout's wheel there (see this file's docstring), then `.venv-spark-4.2/bin/python "
            "bench/stores/kafka_sink_source.py`.")
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{CONNECTOR[line]}"


def check_installed_sluice() -> None:
    """The sluice this interpreter imports must be this checkout's: a stale wheel would measure old code."""
    import sluice

    installed = Path(sluice.__file__).resolve().parent
    checkout = ROOT / "src" / "sluice"
    if installed == checkout.resolve():
        return
    stale = [str(p.relative_to(checkout)) for p in sorted(checkout.rglob("*.py"))
             if not (installed / p.relative_to(checkout)).is_file()
             or hashlib.sha256(p.read_bytes()).digest() != hashlib.sha256(
                 (installed / p.relative_to(checkout)).read_bytes()).digest()]
    if stale:
        python = sys.executable
        raise SystemExit(
            f"the sluice installed for {python} ({installed}) differs from this checkout in {len(stale)} file(s) "
            f"({', '.join(stale[:5])}{', ...' if len(stale) > 5 else ''}). Install the checkout's wheel: "
            f"`{python} -m pip wheel . --no-deps --no-build-isolation -q -w build/bench-wheel && {python} -m pip "
            f"install -q --no-deps --force-reinstall build/bench-wheel/sluice-*.whl`")


def best(runs: dict[str, list[float]]) -> dict[str, float]:
    return {name: min(seconds) for name, seconds in runs.items()}


class Bench:
    def __init__(self, spark, kafka, rows: int) -> None:
        self.spark = spark
        self.kafka = kafka
        self.n = rows
        self.df = spark.range(0, rows, 1, 2).selectExpr(
            "CAST(id AS STRING) AS key", f"repeat('v', {VALUE_BYTES}) AS value").cache()
        assert self.df.count() == rows
        self.keys = [str(i).encode() for i in range(rows)]
        self.key_bytes = sum(len(k) for k in self.keys)
        self.source_topic: str | None = None

    def topic(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        self.kafka.create_topic(name, partitions=2)
        return name

    def verify(self, topic: str) -> None:
        from sluice.testing import count_committed

        got = count_committed(self.kafka.client_config(), topic, timeout=300)
        if got != self.n:
            raise SystemExit(f"topic {topic}: a read_committed consumer counts {got} records, not {self.n}")

    # ------------------------------------------------------------------ sinks
    def producer(self, errors_only: bool = False) -> float:
        """confluent-kafka in one process: produce() per row from ready-made lists with sluice's producer settings,
        then flush(). A delivery callback per record counts acknowledgements (what an at-least-once writer that tracks
        records does), or, `errors_only`, librdkafka reports failed records only (as the sink's producer does) and
        flush() returning with nothing left is the acknowledgement."""
        from confluent_kafka import Producer

        from sluice.connectors.kafka._sink import PRODUCER_DEFAULTS

        name = self.topic()
        p = Producer(self.kafka.client_config(**dict(PRODUCER_DEFAULTS), **{"delivery.report.only.error": errors_only}))
        acked = [0]
        failed: list = []

        def delivered(err, msg) -> None:
            if err is None:
                acked[0] += 1
            else:
                failed.append(err)

        value = b"v" * VALUE_BYTES
        produce, poll = p.produce, p.poll
        started = time.perf_counter()
        for key in self.keys:
            while True:
                try:
                    produce(name, value, key, on_delivery=delivered)
                    break
                except BufferError:
                    poll(0.005)
            poll(0)
        left = p.flush()
        seconds = time.perf_counter() - started
        if failed or left:
            raise SystemExit(f"the producer had {len(failed)} record(s) refused, {left} unacknowledged: {failed[:1]}")
        if not errors_only and acked[0] != self.n:
            raise SystemExit(f"the producer had {acked[0]} of {self.n} records acknowledged")
        self.verify(name)
        self.source_topic = self.source_topic or name
        return seconds

    def write(self, fmt: str, options: dict[str, str]) -> float:
        name = self.topic()
        started = time.perf_counter()
        self.df.write.format(fmt).options(**{"kafka.bootstrap.servers": self.kafka.bootstrap_servers,
                                             "topic": name, **options}).mode("append").save()
        seconds = time.perf_counter() - started
        self.verify(name)
        return seconds

    # ------------------------------------------------------------------ sources
    def read(self, fmt: str, options: dict[str, str]) -> float:
        assert self.source_topic is not None
        started = time.perf_counter()
        row = (self.spark.read.format(fmt)
               .options(**{"kafka.bootstrap.servers": self.kafka.bootstrap_servers, "subscribe": self.source_topic,
                           "startingOffsets": "earliest", "endingOffsets": "latest", **options}).load()
               .selectExpr("count(*) AS n", "sum(length(key)) AS k", "sum(length(value)) AS v").collect()[0])
        seconds = time.perf_counter() - started
        expected = (self.n, self.key_bytes, self.n * VALUE_BYTES)
        if (row.n, row.k, row.v) != expected:
            raise SystemExit(f"format({fmt!r}) read (count, key bytes, value bytes) {tuple(row)}, not {expected}")
        return seconds

    def consumer(self, pool=None) -> float:
        """confluent-kafka's Consumer reading the source topic (read_committed) without Spark: one process for both
        partitions, or (`pool`) a process per partition; the seconds after the consumers were made."""
        from sluice.connectors.kafka._options import CONSUMER_DEFAULTS

        assert self.source_topic is not None
        config = self.kafka.client_config(**CONSUMER_DEFAULTS)
        started = time.perf_counter()
        if pool is None:
            got, seconds = consume(config, self.source_topic, [0, 1])
        else:
            got, seconds = consume_per_partition(pool, config, self.source_topic, 2), time.perf_counter() - started
        if got != self.n:
            raise SystemExit(f"the consumer read {got} records, not {self.n}")
        return seconds


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--source-only", action="store_true",
                        help="the source's contenders and floors only (the topic is written once, untimed)")
    args = parser.parse_args()
    package = connector_package()
    check_installed_sluice()

    import pyspark

    import sluice
    from sluice.testing import LocalKafka

    spark = sluice.session("bench-kafka", master="local[2]", **{"spark.jars.packages": package})
    started_load = load()
    alo = {"sink.mode": "unordered"}
    eos = {"sink.mode": "global-ordered", "sink.transactional": "true"}
    committed = {"kafka.isolation.level": "read_committed"}
    pool = multiprocessing.get_context("spawn").Pool(2)  # the 2-process consumer floor's, made before any clock
    try:
        with LocalKafka(heap_mb=1024) as kafka:
            bench = Bench(spark, kafka, args.rows)
            floor = register_arrow_floor(spark, args.rows, 2, VALUE_BYTES)
            sinks: dict[str, Callable[[], float]] = {
                "confluent-kafka Producer, 1 process": bench.producer,
                "confluent-kafka Producer, error reports only": lambda: bench.producer(errors_only=True),
                "sluice_kafka unordered, 2 tasks": lambda: bench.write("sluice_kafka", alo),
                "sluice_kafka exactly-once, 2 tasks": lambda: bench.write("sluice_kafka", eos),
                "Spark's kafka sink, 2 tasks": lambda: bench.write("kafka", {}),
            }
            sources: dict[str, Callable[[], float]] = {
                "confluent-kafka Consumer, 1 process": bench.consumer,
                "confluent-kafka Consumer, 2 processes": lambda: bench.consumer(pool),
                "Python source, ready Arrow batches": lambda: bench.read(floor, {}),
                "sluice_kafka source": lambda: bench.read("sluice_kafka", {}),
                "Spark's kafka source": lambda: bench.read("kafka", committed),
            }
            if args.source_only:
                bench.producer(errors_only=True)  # the source topic, untimed
                sinks = {}
            for run in (*sinks.values(), *sources.values()):  # untimed: workers, classes, producer ids, caches
                run()
            times: dict[str, list[float]] = {name: [] for name in (*sinks, *sources)}
            for _ in range(args.rounds):
                for name, run in (*sinks.items(), *sources.items()):
                    times[name].append(run())
                    print(f"  {name:40s} {times[name][-1]:7.2f} s", file=sys.stderr, flush=True)
    finally:
        pool.terminate()
        spark.stop()
    figures = best(times)
    print_table(figures, args, pyspark.__version__, package, started_load)
    return 0


def print_table(figures: dict[str, float], args, spark_version: str, package: str, started_load: str) -> None:
    n = args.rows
    source, spark_source = figures["sluice_kafka source"], figures["Spark's kafka source"]
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"kafka benchmark, {now}, {n:,} rows of a 1-7 byte key and a {VALUE_BYTES}-byte value, pyspark "
          f"{spark_version} with {package}, {os.cpu_count()} cores, local[2], best of {args.rounds}; load average "
          f"(1/5/15 min) {started_load} at the start, {load()} at the end")
    print(f"| {'contender':40s} | seconds | rows/s | ratio |")
    print(f"| {'-' * 40} | ---: | ---: | --- |")
    rows = []
    goals = {}
    if not args.source_only:
        producer, alo = figures["confluent-kafka Producer, 1 process"], figures["sluice_kafka unordered, 2 tasks"]
        eos, spark_sink = figures["sluice_kafka exactly-once, 2 tasks"], figures["Spark's kafka sink, 2 tasks"]
        lean = figures["confluent-kafka Producer, error reports only"]
        rows += [
            ("confluent-kafka Producer, 1 process", producer, "a delivery callback per record"),
            ("confluent-kafka Producer, error reports only", lean, "1 process, delivery.report.only.error"),
            ("sluice_kafka unordered, 2 tasks", alo, f"{producer / alo:.2f}x the producer's rate (goal >= 1.0); "
                                                     f"{lean / alo:.2f}x the error-reports-only producer's"),
            ("Spark's kafka sink, 2 tasks", spark_sink, f"sluice unordered {spark_sink / alo:.2f}x its rate"),
            ("sluice_kafka exactly-once, 2 tasks", eos, f"{eos / alo:.2f}x unordered's time (goal <= 1.3)"),
        ]
        goals |= {"sink vs producer >= 1.0x": producer / alo >= 1.0, "exactly-once cost <= 1.3x": eos / alo <= 1.3}
    floor = figures["Python source, ready Arrow batches"]
    rows += [
        ("confluent-kafka Consumer, 1 process", figures["confluent-kafka Consumer, 1 process"],
         "no Spark, Message objects only, both partitions"),
        ("confluent-kafka Consumer, 2 processes", figures["confluent-kafka Consumer, 2 processes"],
         "no Spark, a process per partition"),
        ("Python source, ready Arrow batches", floor,
         f"no Kafka; {spark_source / floor:.2f}x Spark's source's rate (the most a Python source can reach)"),
        ("Spark's kafka source (read_committed)", spark_source, ""),
        ("sluice_kafka source", source, f"{spark_source / source:.2f}x Spark's source's rate (goal >= 1.0); "
                                        f"{floor / source:.2f}x the Arrow floor's"),
    ]
    for name, seconds, ratio in rows:
        print(f"| {name:40s} | {seconds:.2f} | {n / seconds:,.0f} | {ratio} |")
    goals["source vs Spark's >= 1.0x"] = spark_source / source >= 1.0
    print("goals: " + "; ".join(f"{goal}: {'met' if ok else 'NOT met'}" for goal, ok in goals.items()))


if __name__ == "__main__":
    raise SystemExit(main())
