"""Kafka at hundreds of partitions: the same rows (--rows of ~100 bytes) in a topic of few partitions and in
topics of many, read by a batch count and by a streaming query (AvailableNow, --micro-batches micro-batches), on one
broker (LocalKafka), local[2], against Spark's own Kafka source on the same topics (the 4.0-4.2 lines: its connector
comes from Maven Central by its coordinates); and written (a cached DataFrame of 2 partitions, keyed) exactly-once,
as it comes and with transaction.by-partition, and at-least-once (sink.mode=unordered), each write with its slowest
request's time (the write summary's submit p99, best run's). At-least-once also runs as the shape before the engine's
window started at several batches: sink.requests.max-buffered=19999 makes Kafka's window start at one batch of 10,000
records (each batch then waits for the producer's queue to drain before the next goes). --writes-only leaves the
reads out.

Each topic is produced once, untimed (librdkafka, round-robin over the partitions). Rounds rotate the contenders; each
figure is the best of --rounds, after one untimed run of each. The sluice source runs with its defaults
(records-per-task packs small partitions into a few read tasks) and, as the shape before it, with records-per-task=0
(a task per partition, Spark's Kafka source's shape), for batch reads up to --task-per-partition-up-to partitions.

    make .venv-spark-4.2/.installed
    .venv-spark-4.2/bin/pip wheel . --no-deps --no-build-isolation -q -w build/bench-wheel
    .venv-spark-4.2/bin/pip install -q --no-deps --force-reinstall build/bench-wheel/sluice-*.whl
    .venv-spark-4.2/bin/python -m bench.kafka_scale [--rows 400000] [--partitions 6,600,3000] [--rounds 3] \
        [--writes-only]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from bench.contenders import rotate
from bench.latency.kafka_hop import spark_kafka_conf
from bench.stores.kafka_sink_source import check_installed_sluice

VALUE = b"x" * 100
# At-least-once as before the window started at several batches: max-buffered / batch.max-size (10,000) rounds to 1.
ONE_BATCH, ONE_BATCH_OPTIONS = " at-least-once one-batch-window", {"sink.requests.max-buffered": "19999"}


def produce(kafka: Any, topic: str, rows: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(kafka.client_config(**{"linger.ms": 50, "queue.buffering.max.messages": 1_000_000}))
    for i in range(rows):
        while True:
            try:
                producer.produce(topic, VALUE, str(i).encode())
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(120):
        raise SystemExit(f"{topic}: records left unsent")


class ScaleBench:
    def __init__(self, spark: Any, kafka: Any, rows: int, micro_batches: int) -> None:
        self.spark, self.kafka, self.rows, self.micro_batches = spark, kafka, rows, micro_batches
        self.last_p99_ms: float | None = None  # the last write's slowest request (its summary's submit p99)

    def _load(self, fmt: str, topic: str, extra: dict[str, str], stream: bool) -> Any:
        servers = ("kafka.bootstrap.servers", self.kafka.bootstrap_servers)
        reader = self.spark.readStream if stream else self.spark.read
        options = {servers[0]: servers[1], "subscribe": topic, "startingOffsets": "earliest", **extra}
        return reader.format(fmt).options(**options).load()

    def batch(self, fmt: str, topic: str, extra: dict[str, str]) -> float:
        started = time.perf_counter()
        got = self._load(fmt, topic, extra, stream=False).count()
        seconds = time.perf_counter() - started
        if got != self.rows:
            raise SystemExit(f"{fmt} batch read of {topic}: {got} records, not {self.rows}")
        return seconds

    def stream(self, fmt: str, topic: str, extra: dict[str, str]) -> float:
        cap = "max-records-per-trigger" if fmt == "sluice_kafka" else "maxOffsetsPerTrigger"
        per_batch = str(-(-self.rows // self.micro_batches))
        name = f"scale_{uuid.uuid4().hex[:8]}"
        with tempfile.TemporaryDirectory() as checkpoint:
            started = time.perf_counter()
            query = (self._load(fmt, topic, {**extra, cap: per_batch}, stream=True).selectExpr("length(value) AS n")
                     .writeStream.format("memory").queryName(name).option("checkpointLocation", checkpoint)
                     .trigger(availableNow=True).start())
            query.awaitTermination()
            seconds = time.perf_counter() - started
        got = self.spark.table(name).count()
        self.spark.sql(f"DROP VIEW IF EXISTS {name}")
        if query.exception() is not None or got != self.rows:
            raise SystemExit(f"{fmt} stream of {topic}: {got} records, not {self.rows} ({query.exception()})")
        return seconds

    def write(self, topic: str, rows: Any, by_partition: bool | None, extra: dict[str, str] | None = None) -> float:
        """A batch write of `rows` (cached) into `topic`: exactly-once (by_partition: transaction.by-partition), or
        at-least-once (by_partition None), with `extra` options. Keeps the write summary's submit p99 in `p99_ms`."""
        import sluice

        options = {"kafka.bootstrap.servers": self.kafka.bootstrap_servers, "topic": topic, "sink.mode": "unordered",
                   **(extra or {})}
        if by_partition is not None:
            options.update({"sink.mode": "global-ordered", "sink.transactional": "true",
                            "transaction.by-partition": str(by_partition).lower()})
        started = time.perf_counter()
        sluice.write(rows, "sluice_kafka", options)
        seconds = time.perf_counter() - started
        self.last_p99_ms = (sluice.last_write_summary() or {}).get("submit_latency_p99_ms")
        return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--partitions", default="6,600,3000")
    parser.add_argument("--micro-batches", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spark-up-to", type=int, default=600,
                        help="Spark's Kafka source only at up to this many partitions (it takes minutes at 600)")
    parser.add_argument("--task-per-partition-up-to", type=int, default=600,
                        help="batch reads with records-per-task=0 only at up to this many partitions (the shape "
                             "before packing; its streaming figures: the issue's)")
    parser.add_argument("--writes-only", action="store_true", help="the writes alone, no topic produced or read")
    args = parser.parse_args()
    check_installed_sluice()

    import pyspark

    import sluice
    from sluice.testing import LocalKafka

    spark = sluice.session("bench-kafka-scale", master="local[2]", **spark_kafka_conf(pyspark.__version__))
    spark.sparkContext.setLogLevel("ERROR")
    counts = [int(n) for n in args.partitions.split(",")]
    started_load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    times: dict[str, list[float]] = {}
    p99s: dict[str, list[float | None]] = {}
    try:
        with LocalKafka(heap_mb=1024) as kafka:
            bench = ScaleBench(spark, kafka, args.rows, args.micro_batches)
            runs: dict[str, Callable[[], float]] = {}
            rows = spark.range(0, args.rows, 1, 2).selectExpr("CAST(id AS STRING) AS key",
                                                             f"repeat('x', {len(VALUE)}) AS value").cache()
            rows.count()
            for n in counts:
                written = f"scale{n}_w_{uuid.uuid4().hex[:6]}"
                kafka.create_topic(written, n)
                for by_partition, label in ((False, ""), (True, " by-partition"), (None, " at-least-once")):
                    runs[f"{n} write sluice{label}"] = lambda t=written, b=by_partition: bench.write(t, rows, b)
                runs[f"{n} write sluice{ONE_BATCH}"] = lambda t=written: bench.write(t, rows, None, ONE_BATCH_OPTIONS)
                if args.writes_only:
                    continue
                topic = f"scale{n}_{uuid.uuid4().hex[:6]}"
                kafka.create_topic(topic, n)
                produce(kafka, topic, args.rows)
                for read in ("batch", "stream"):
                    how = getattr(bench, read)
                    runs[f"{n} {read} sluice"] = lambda h=how, t=topic: h("sluice_kafka", t, {})
                    if read == "batch" and n <= args.task_per_partition_up_to:
                        runs[f"{n} {read} sluice task-per-partition"] = \
                            lambda h=how, t=topic: h("sluice_kafka", t, {"records-per-task": "0"})
                    if n <= args.spark_up_to:
                        runs[f"{n} {read} spark"] = lambda h=how, t=topic: h("kafka", t, {})
            for name, run in runs.items():
                print(f"  {name:45s} {run():8.2f} s (warm-up)", file=sys.stderr, flush=True)

            def timed(name: str) -> Callable[[], None]:
                def run() -> None:
                    times.setdefault(name, []).append(runs[name]())
                    p99s.setdefault(name, []).append(bench.last_p99_ms if " write " in name else None)
                    print(f"  {name:45s} {times[name][-1]:8.2f} s", file=sys.stderr, flush=True)
                return run

            rotate({name: timed(name) for name in runs}, args.rounds)
    finally:
        spark.stop()
    best = {name: min(seconds) for name, seconds in times.items()}
    print(f"\nbench.kafka_scale: {args.rows:,} records of {len(VALUE)} bytes, pyspark {pyspark.__version__}, local[2], "
          f"{os.cpu_count()} cores, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, best of {args.rounds}; load at the start "
          f"{started_load}, at the end {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.writes_only:
        print("\n| read | partitions | sluice (s) | vs the fewest partitions | task per partition (s) | Spark's source "
              "(s) | sluice vs Spark |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for read in () if args.writes_only else ("batch", "stream"):
        base = best[f"{counts[0]} {read} sluice"]
        for n in counts:
            ours = best[f"{n} {read} sluice"]
            alone, spark_s = best.get(f"{n} {read} sluice task-per-partition"), best.get(f"{n} {read} spark")
            print(f"| {read} | {n} | {ours:.2f} | {ours / base:.2f}x | {'-' if alone is None else f'{alone:.2f}'} | "
                  f"{'-' if spark_s is None else f'{spark_s:.2f}'} | "
                  f"{'-' if spark_s is None else f'{spark_s / ours:.2f}x'} |")
    print("\n| write | partitions | time (s) | vs the fewest partitions | a request's p99 (ms) |\n"
          "| --- | ---: | ---: | ---: | ---: |")
    for label, suffix in (("exactly-once, as the rows come", ""), ("exactly-once, transaction.by-partition",
                                                                     " by-partition"),
                          ("at-least-once", " at-least-once"),
                          ("at-least-once, a window of one batch (before)", ONE_BATCH)):
        base = best[f"{counts[0]} write sluice{suffix}"]
        for n in counts:
            name = f"{n} write sluice{suffix}"
            p99 = p99s[name][times[name].index(best[name])]
            print(f"| {label} | {n} | {best[name]:.2f} | {best[name] / base:.2f}x | "
                  f"{'-' if p99 is None else f'{p99:.0f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
