"""Streaming reads by a tracking column (docs/tracking.md), PostgreSQL: throughput against the batch read of the same
rows, and freshness from commit to arrival at a writer-controlled rate. One run, one throwaway server (LocalPostgres).

Run: `flock /tmp/sluice-bench.lock .venv/bin/python bench/tracking.py [--rows 300000] [--rate 1000] [--seconds 20]`.
`--store opensearch` runs the same measures on an OpenSearch node (bench/_tracking_search.py; default --rows 200000).
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
import os
import threading
import time

import psycopg


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=("postgres", "opensearch"), default="postgres")
    parser.add_argument("--rows", type=int, default=None, help="default: 300,000 (PostgreSQL), 200,000 (OpenSearch)")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--windows", default="0,1000")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.store == "opensearch":
        import _tracking_search

        print(f"load average at start: {os.getloadavg()}")
        _tracking_search.run(argparse.Namespace(**{**vars(args), "rows": args.rows or 200_000}))
        print(f"load average at end: {os.getloadavg()}")
        return
    args.rows = args.rows or 300_000

    import sluice
    from sluice.testing import LocalPostgres

    print(f"load average at start: {os.getloadavg()}")
    with LocalPostgres() as server:
        spark = sluice.session("bench-tracking", master="local[2]")
        url = server.url
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE bulk (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                         "at timestamptz NOT NULL DEFAULT clock_timestamp(), payload text)")
            conn.execute(f"INSERT INTO bulk (payload) SELECT repeat('x', 40) FROM generate_series(1, {args.rows})")
            conn.execute("CREATE INDEX ON bulk (at, id)")
            conn.execute("ANALYZE bulk")
        opts = {"url": url, "table": "bulk"}

        def batch() -> float:
            started = time.perf_counter()
            spark.read.format("postgres").options(**opts).load().write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        def stream() -> float:
            started = time.perf_counter()
            query = (spark.readStream.format("postgres").options(**opts).option("tracking.column", "at")
                     .option("tracking.lag-window-ms", "0").load().writeStream.format("noop")
                     .trigger(availableNow=True).start())
            query.awaitTermination()
            assert sum(p["numInputRows"] for p in query.recentProgress) == args.rows
            return time.perf_counter() - started

        runs: dict[str, list[float]] = {"batch": [], "stream": []}
        for _ in range(args.rounds):  # alternating; the first round pays the JVM's and the workers' warm-up
            runs["batch"].append(batch())
            runs["stream"].append(stream())
        batch_s, stream_s = min(runs["batch"]), min(runs["stream"])
        print(f"throughput, {args.rows:,} rows, best of {args.rounds} (all: {runs}): batch read "
              f"{args.rows / batch_s:,.0f} rows/s ({batch_s:.1f} s), stream (AvailableNow, tasks of 250,000 rows) "
              f"{args.rows / stream_s:,.0f} rows/s ({stream_s:.1f} s, the first planning included)")

        for window in (int(w) for w in args.windows.split(",")):
            p50, p99, count = freshness(spark, url, window, args.rate, args.seconds)
            print(f"freshness at {args.rate:,} rows/s for {args.seconds} s, lag window {window} ms: "
                  f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms ({count:,} rows)")
        print(f"load average at end: {os.getloadavg()}")
        spark.stop()


def freshness(spark, url: str, window_ms: int, rate: int, seconds: int) -> tuple[float, float, int]:
    table = f"fresh_{window_ms}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                     "at timestamptz NOT NULL DEFAULT clock_timestamp(), payload text)")
        conn.execute(f"CREATE INDEX ON {table} (at, id)")
    lags: list[float] = []

    def arrived(frame, _batch_id: int) -> None:
        now = time.time()
        for (at,) in frame.select("at").collect():
            lags.append((now - at.timestamp()) * 1000)

    query = (spark.readStream.format("postgres").options(url=url, table=table).option("tracking.column", "at")
             .option("tracking.lag-window-ms", str(window_ms)).load().writeStream.foreachBatch(arrived).start())
    stop = threading.Event()
    per_tick = max(1, rate // 20)
    written = 0

    def write() -> None:
        nonlocal written
        with psycopg.connect(url, autocommit=True) as conn:
            tick = time.monotonic()
            while not stop.is_set():
                conn.execute(f"INSERT INTO {table} (payload) SELECT 'p' FROM generate_series(1, {per_tick})")
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
