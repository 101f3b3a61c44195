"""Kafka sink benchmark: format("sluice_kafka") at-least-once and exactly-once vs confluent-kafka's producer in one
process, on the same rows, one run, one throwaway broker (LocalKafka: `make check-kafka` fetches it).

Run: `.venv/bin/python bench/kafka_sink.py [--rows 1000000] [--rounds 2]`.
Data: N rows of (key: the id as text, value: 100 bytes of text) in a cached DataFrame of 2 partitions (local[2]).
- producer: one Python process, no Spark: confluent_kafka.Producer.produce per row from ready-made lists, with a
  delivery callback per record counting acknowledgements (what any at-least-once writer needs), then flush();
- sluice unordered (idempotent producer, 2 tasks) and sluice exactly-once (global-ordered + transactional: a Kafka
  transaction per task), each timed end to end through Spark (its row production included).
Each figure is the best of --rounds runs; a fresh topic of 2 partitions per run; counts checked by a read_committed
consumer so nothing faster-than-possible is reported.
"""

from __future__ import annotations

import argparse
import platform
import time
import uuid
from datetime import date


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import sluice
    from sluice.testing import LocalKafka, count_committed

    spark = sluice.session("bench-kafka", master="local[2]")
    n = args.rows
    df = spark.range(0, n, 1, 2).selectExpr("CAST(id AS STRING) AS key", "repeat('v', 100) AS value").cache()
    df.count()
    keys = [str(i).encode() for i in range(n)]
    value = b"v" * 100
    with LocalKafka(heap_mb=1024) as kafka:
        def topic() -> str:
            name = f"bench-{uuid.uuid4().hex[:8]}"
            kafka.create_topic(name, partitions=2)
            return name

        def producer() -> float:
            from confluent_kafka import Producer

            name = topic()
            p = Producer(kafka.client_config(**{"enable.idempotence": True, "linger.ms": 5,
                                                "queue.buffering.max.messages": 1_000_000,
                                                "partitioner": "murmur2_random"}))
            acked = [0]

            def delivered(err, msg):
                acked[0] += 1

            started = time.perf_counter()
            produce = p.produce
            for key in keys:
                while True:
                    try:
                        produce(name, value, key, on_delivery=delivered)
                        break
                    except BufferError:
                        p.poll(0.01)
                p.poll(0)
            p.flush()
            seconds = time.perf_counter() - started
            assert acked[0] == n and count_committed(kafka.client_config(), name) == n
            return seconds

        def sluice_write(extra: dict[str, str]) -> float:
            name = topic()
            started = time.perf_counter()
            df.write.format("sluice_kafka").options(**{"kafka.bootstrap.servers": kafka.bootstrap_servers,
                                                       "topic": name, **extra}).mode("append").save()
            seconds = time.perf_counter() - started
            assert count_committed(kafka.client_config(), name) == n
            return seconds

        contenders = {
            "producer (1 process)": producer,
            "sluice unordered (2 tasks)": lambda: sluice_write({}),
            "sluice exactly-once (2 tasks)": lambda: sluice_write({"sink.mode": "global-ordered",
                                                                    "sink.transactional": "true"}),
        }
        best = {name: min(run() for _ in range(args.rounds)) for name, run in contenders.items()}
    spark.stop()
    print(f"kafka sink benchmark, {date.today()}, {n:,} rows of ~105 bytes, {platform.node()}, best of {args.rounds}")
    for name, seconds in best.items():
        print(f"  {name:32s} {seconds:7.2f} s  {n / seconds:>12,.0f} rows/s")
    base = best["producer (1 process)"]
    alo, eos = best["sluice unordered (2 tasks)"], best["sluice exactly-once (2 tasks)"]
    print(f"  sluice unordered vs producer: {base / alo:.2f}x; exactly-once cost vs at-least-once: {eos / alo:.2f}x")


if __name__ == "__main__":
    main()
