"""Streaming reads by a tracking column (docs/tracking.md): throughput against the batch read of the same rows, and
freshness from commit to arrival at a writer-controlled rate. One run, one throwaway server: `--store postgres`
(LocalPostgres, the default) or `--store clickhouse` (the tests' chdb stand-in, tests/clickhouse_chdb; `id` is the
tie-breaker, the sorting key (at, id)).

Run: `flock /tmp/sluice-bench.lock .venv/bin/python bench/tracking.py [--store clickhouse] [--rows 300000]
[--rate 1000] [--seconds 20]`.
- throughput (best of --rounds, alternating): N rows of (id bigint identity primary key, at timestamptz, payload
  text) with an index (at, id); the batch read (format("postgres"), its default splits) and the stream
  (tracking.column=at, window 0, Trigger.AvailableNow: one micro-batch, tasks of tracking.rows-per-task rows) both
  into Spark's noop sink; rows/s of each;
- freshness: one writer commits `--rate` rows/s (a transaction of rate/20 rows every 50 ms, `at` =
  clock_timestamp()) for `--seconds`; the stream (default trigger) hands each micro-batch to foreachBatch, which
  notes now - at of every row: p50/p99 per lag window (0: the naive poller's floor; 1,000 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from pathlib import Path

import psycopg


class Postgres:
    """LocalPostgres; the tracking column `at` (timestamptz, clock_timestamp()), the primary key breaks ties."""

    name, fmt, stream_options = "PostgreSQL", "postgres", {}

    def __enter__(self) -> Postgres:
        from sluice.testing import LocalPostgres

        self.server = LocalPostgres()
        self.url = self.server.__enter__().url
        return self

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)

    def opts(self, table: str) -> dict[str, str]:
        return {"url": self.url, "table": table}

    def create(self, table: str, rows: int = 0) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                         "at timestamptz NOT NULL DEFAULT clock_timestamp(), payload text)")
            if rows:
                conn.execute(f"INSERT INTO {table} (payload) SELECT repeat('x', 40) FROM generate_series(1, {rows})")
            conn.execute(f"CREATE INDEX ON {table} (at, id)")
            conn.execute(f"ANALYZE {table}")

    @contextlib.contextmanager
    def inserter(self, table: str):
        with psycopg.connect(self.url, autocommit=True) as conn:
            yield lambda n: conn.execute(f"INSERT INTO {table} (payload) SELECT 'p' FROM generate_series(1, {n})")


class ClickHouse:
    """The chdb stand-in of the tests (ClickHouse's engine behind its HTTP interface, tests/clickhouse_chdb); the
    tracking column `at` (DateTime64(6) DEFAULT now64(6): the server's clock at the insert), `id` the tie-breaker,
    the sorting key (at, id)."""

    name, fmt, stream_options = "ClickHouse", "clickhouse", {"tracking.tie-breaker": "id"}

    def __enter__(self) -> ClickHouse:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.clickhouse_chdb import ChdbClickHouse

        self.server = ChdbClickHouse().__enter__()
        self.next_id = 0
        return self

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)

    def opts(self, table: str) -> dict[str, str]:
        return {"url": self.server.url, "table": table, "password": self.server.password}

    def create(self, table: str, rows: int = 0) -> None:
        self.server.sql(f"CREATE TABLE {table} (id UInt64, at DateTime64(6, 'UTC') DEFAULT now64(6), payload String) "
                        "ENGINE = MergeTree() ORDER BY (at, id)")
        if rows:
            self.server.sql(f"INSERT INTO {table} (id, payload) SELECT number + 1, repeat('x', 40) "
                            f"FROM numbers({rows})")

    @contextlib.contextmanager
    def inserter(self, table: str):
        def insert(n: int) -> None:
            self.server.sql(f"INSERT INTO {table} (id, payload) SELECT number + {self.next_id}, 'p' FROM numbers({n})")
            self.next_id += n

        yield insert


STORES = {"postgres": Postgres, "clickhouse": ClickHouse}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=sorted(STORES), default="postgres")
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--windows", default="0,1000")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import sluice

    print(f"load average at start: {os.getloadavg()}")
    with STORES[args.store]() as store:
        spark = sluice.session("bench-tracking", master="local[2]")
        store.create("bulk", args.rows)
        fmt, opts = store.fmt, store.opts("bulk")

        def batch() -> float:
            started = time.perf_counter()
            spark.read.format(fmt).options(**opts).load().write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        def stream() -> float:
            started = time.perf_counter()
            query = (spark.readStream.format(fmt).options(**opts).options(**store.stream_options)
                     .option("tracking.column", "at").option("tracking.lag-window-ms", "0").load()
                     .writeStream.format("noop").trigger(availableNow=True).start())
            query.awaitTermination()
            assert sum(p["numInputRows"] for p in query.recentProgress) == args.rows
            return time.perf_counter() - started

        runs: dict[str, list[float]] = {"batch": [], "stream": []}
        for _ in range(args.rounds):  # alternating; the first round pays the JVM's and the workers' warm-up
            runs["batch"].append(batch())
            runs["stream"].append(stream())
        batch_s, stream_s = min(runs["batch"]), min(runs["stream"])
        print(f"{store.name}: throughput, {args.rows:,} rows, best of {args.rounds} (all: {runs}): batch read "
              f"{args.rows / batch_s:,.0f} rows/s ({batch_s:.1f} s), stream (AvailableNow, tasks of 250,000 rows) "
              f"{args.rows / stream_s:,.0f} rows/s ({stream_s:.1f} s, the first planning included)")

        for window in (int(w) for w in args.windows.split(",")):
            p50, p99, count = freshness(spark, store, window, args.rate, args.seconds)
            print(f"freshness at {args.rate:,} rows/s for {args.seconds} s, lag window {window} ms: "
                  f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms ({count:,} rows)")
        print(f"load average at end: {os.getloadavg()}")
        spark.stop()


def freshness(spark, store, window_ms: int, rate: int, seconds: int) -> tuple[float, float, int]:
    table = f"fresh_{window_ms}"
    store.create(table)
    lags: list[float] = []

    def arrived(frame, _batch_id: int) -> None:
        now = time.time()
        for (at,) in frame.select("at").collect():
            lags.append((now - at.timestamp()) * 1000)

    query = (spark.readStream.format(store.fmt).options(**store.opts(table))
             .options(**store.stream_options).option("tracking.column", "at")
             .option("tracking.lag-window-ms", str(window_ms)).load().writeStream.foreachBatch(arrived).start())
    stop = threading.Event()
    per_tick = max(1, rate // 20)
    written = 0

    def write() -> None:
        nonlocal written
        with store.inserter(table) as insert:
            tick = time.monotonic()
            while not stop.is_set():
                insert(per_tick)
                written += per_tick
                tick += 0.05
                time.sleep(max(0.0, tick - time.monotonic()))

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(seconds)  # the measured period: the writer's pace, not a synchronization
    stop.set()
    writer.join()
    deadline = time.monotonic() + 60
    while len(lags) < written and time.monotonic() < deadline:
        query.processAllAvailable()  # returns while the window holds rows back: polled
        time.sleep(0.1)
    query.stop()
    ordered = sorted(lags)
    if len(ordered) != written:
        raise SystemExit(f"window {window_ms} ms: {len(ordered)} rows arrived of {written} written")
    return ordered[len(ordered) // 2], ordered[int(len(ordered) * 0.99)], len(ordered)


if __name__ == "__main__":
    main()
