"""An at-least-once Kafka task's requests against the engine's window at the start: one task (the engine and
KafkaStore as a Spark task opens them, no Spark) writes --rows keyed rows of 100 bytes in Arrow batches of 10,000 into
topics of --partitions partitions on one broker (LocalKafka), its window starting at each of --windows batches of
sink.batch.max-size (10,000; the plan's own start is sink.requests.max-buffered / sink.batch.max-size = 10). Each
figure: the task's time and librdkafka's ProduceRequests (its statistics), best of --rounds by time.

    .venv/bin/python -m bench.kafka_window [--rows 200000] [--partitions 6,600] [--windows 1,10,20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

VALUE = b"x" * 100
ARROW_BATCH = 10_000


def one_task(kafka: Any, topic: str, rows: int, window_batches: int) -> tuple[float, int]:
    """One task's write of `rows` into `topic` with the window starting at `window_batches` batches: its seconds and
    the ProduceRequests its producer sent."""
    from pyspark.sql.types import StringType, StructField, StructType

    from sluice.connector import SinkConfig, WriteContext
    from sluice.connectors.kafka import KafkaDataSource
    from sluice.connectors.kafka._checks import RecordColumns
    from sluice.connectors.kafka._options import WriteOptions
    from sluice.connectors.kafka._sink import KafkaWritePlan
    from sluice.engine import AsyncSinkWriter

    options = KafkaDataSource({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                               "sink.mode": "unordered"}).write_options()
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    plan = KafkaWritePlan("sluice_kafka", options, schema, SinkConfig.of(options), WriteOptions.of(options),
                          RecordColumns(True, False, False, False, False), 1_048_588, frozenset([topic]), topic)
    context = WriteContext(write_id=f"window-{uuid.uuid4().hex[:8]}", partition_id=0)
    task = plan.open_task(context)
    produce_requests: list[int] = []
    reported = threading.Event()

    def on_stats(raw: str) -> None:
        produce_requests.append(sum(b["req"].get("Produce", 0) for b in json.loads(raw)["brokers"].values()))
        reported.set()

    task.store.producer_config = {**task.store.producer_config, "statistics.interval.ms": 100, "stats_cb": on_stats}
    task.store.window_start_batches = window_batches
    values = pa.array([VALUE] * ARROW_BATCH, pa.binary())
    started = time.perf_counter()
    with AsyncSinkWriter(task.store, plan.config, context=context) as writer:
        for first in range(0, rows, ARROW_BATCH):
            n = min(ARROW_BATCH, rows - first)
            keys = pa.array([str(i) for i in range(first, first + n)])
            encoded = task.encode(pa.RecordBatch.from_pydict({"key": keys, "value": values.slice(0, n)}))
            writer.write_chunk(encoded.entries, encoded.sizes)
        writer.finish()
        seconds = time.perf_counter() - started
        reported.clear()  # the statistics after the last batch was acknowledged: every request is in them
        if not reported.wait(30):
            raise SystemExit("no statistics from the producer within 30 s")
    return seconds, produce_requests[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", default="6,600")
    parser.add_argument("--windows", default="1,10,20")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from sluice.testing import LocalKafka

    counts = [int(n) for n in args.partitions.split(",")]
    windows = [int(w) for w in args.windows.split(",")]
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    runs: dict[tuple[int, int], list[tuple[float, int]]] = {}
    with LocalKafka(heap_mb=1024) as kafka:
        for n in counts:
            topic = f"window{n}_{uuid.uuid4().hex[:6]}"
            kafka.create_topic(topic, n)
            one_task(kafka, topic, args.rows, 1)  # untimed: the new topic's leaders and metadata
            for _ in range(args.rounds):
                for w in windows:
                    runs.setdefault((n, w), []).append(one_task(kafka, topic, args.rows, w))
                    print(f"  {n} partitions, window {w}: {runs[n, w][-1]}", file=sys.stderr, flush=True)
    print(f"\nbench.kafka_window: one task, {args.rows:,} records of {len(VALUE)} bytes, {os.cpu_count()} cores, "
          f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, best of {args.rounds}; load at the start {load}, at the end "
          f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}\n\n| partitions | window at the start (batches) | time (s) "
          "| ProduceRequests |\n| ---: | ---: | ---: | ---: |")
    for (n, w), results in runs.items():
        seconds, requests = min(results)
        print(f"| {n} | {w} | {seconds:.2f} | {requests:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
