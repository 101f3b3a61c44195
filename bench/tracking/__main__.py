"""Streaming reads by a tracking column (docs/tracking.md): throughput against the batch read of the same rows, and
freshness from commit to arrival at a writer-controlled rate. One run, one throwaway server (LocalPostgres;
LocalCassandra with --store cassandra; the tests' chdb stand-in with --store clickhouse, `id` its tie-breaker;
HBase's, by cell timestamps, in hbase_stream.py).

Run: `flock /tmp/sluice-bench.lock .venv/bin/python -m bench.tracking [--store postgres|cassandra|clickhouse|hbase]
[--rows 300000] [--rate 1000] [--seconds 20]`.
`--store opensearch` runs the same measures on an OpenSearch node (bench/tracking/search_stream.py; default --rows
200000).
- throughput (best of --rounds, alternating): N rows of (id, at timestamp, payload text); the batch read
  (format(store), PostgreSQL: its default splits; Cassandra: partitions=2, as its size estimates lag a fresh load)
  and the stream (tracking.column=at, window 0, Trigger.AvailableNow: one micro-batch; PostgreSQL: tasks of
  tracking.rows-per-task rows; Cassandra: partitions=2 token slices) both into Spark's noop sink; rows/s of each.
  PostgreSQL: id bigint identity primary key, `at` clock_timestamp(), an index (at, id). Cassandra: id int primary
  key, `at` one millisecond apart per row (loaded by the driver in UNLOGGED batches), an SAI index on `at`;
- freshness: one writer writes `--rate` rows/s (rate/20 rows every 50 ms; PostgreSQL: one transaction, `at` =
  clock_timestamp(); Cassandra: UNLOGGED batches, `at` = toTimestamp(now()), the node's clock) for `--seconds`;
  the stream (default trigger) hands each micro-batch to foreachBatch, which notes now - at of every row: p50/p99
  per lag window (0: the naive poller's floor; 1,000 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable, Iterator

import psycopg

from bench.tracking.measures import alternating, arrivals, paced


class PostgresStore:
    name = "postgres"
    tasks = "tasks of 250,000 rows"
    batch_options: dict[str, str] = {}
    stream_options: dict[str, str] = {}

    def __init__(self, stack: contextlib.ExitStack) -> None:
        from sluice.testing import LocalPostgres

        self.url = stack.enter_context(LocalPostgres()).url

    def options(self, table: str) -> dict[str, str]:
        return {"url": self.url, "table": table}

    def bulk(self, table: str, rows: int) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                         "at timestamptz NOT NULL DEFAULT clock_timestamp(), payload text)")
            conn.execute(f"INSERT INTO {table} (payload) SELECT repeat('x', 40) FROM generate_series(1, {rows})")
            conn.execute(f"CREATE INDEX ON {table} (at, id)")
            conn.execute(f"ANALYZE {table}")

    def fresh(self, table: str) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                         "at timestamptz NOT NULL DEFAULT clock_timestamp(), payload text)")
            conn.execute(f"CREATE INDEX ON {table} (at, id)")

    @contextlib.contextmanager
    def writer(self, table: str) -> Iterator[Callable[[int], None]]:
        """A function that writes n rows (one transaction), `at` the moment of each row's insert."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            yield lambda n: conn.execute(f"INSERT INTO {table} (payload) SELECT 'p' FROM generate_series(1, {n})")


class CassandraStore:
    name = "cassandra"
    tasks = "2 token slices"
    batch_options = {"partitions": "2"}
    stream_options = {"partitions": "2"}  # a micro-batch read in 2 token slices

    def __init__(self, stack: contextlib.ExitStack) -> None:
        from sluice.testing import LocalCassandra

        self.server = stack.enter_context(LocalCassandra(full_jit=True, cluster_name="sluice-bench"))
        self.cluster = self.server.cluster()
        stack.callback(self.cluster.shutdown)
        self.session = self.cluster.connect()
        self.session.execute("CREATE KEYSPACE bench WITH replication = "
                             "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        self._ids = 0

    def options(self, table: str) -> dict[str, str]:
        return {"host": self.server.host, "port": str(self.server.port), "keyspace": "bench", "table": table}

    def _table(self, table: str) -> None:
        self.session.execute(f"CREATE TABLE bench.{table} (id int PRIMARY KEY, at timestamp, payload text)")
        self.session.execute(f"CREATE INDEX ON bench.{table} (at) USING 'sai'")

    def bulk(self, table: str, rows: int) -> None:
        import datetime as dt

        self._table(table)
        base = dt.datetime(2026, 1, 1)
        self._batches(f"INSERT INTO bench.{table} (id, at, payload) VALUES (?, ?, ?)",
                      [(i, base + dt.timedelta(milliseconds=i), "x" * 40) for i in range(rows)])

    def _batches(self, insert: str, rows: list[tuple]) -> None:
        """UNLOGGED batches of 40 rows (under the 5 KiB warning), 32 in flight."""
        from cassandra.concurrent import execute_concurrent
        from cassandra.query import BatchStatement, BatchType

        prepared = self.session.prepare(insert)
        batches = []
        for first in range(0, len(rows), 40):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for row in rows[first:first + 40]:
                batch.add(prepared, row)
            batches.append((batch, ()))
        execute_concurrent(self.session, batches, concurrency=32, raise_on_first_error=True)

    def fresh(self, table: str) -> None:
        self._table(table)

    @contextlib.contextmanager
    def writer(self, table: str) -> Iterator[Callable[[int], None]]:
        """A function that writes n rows (UNLOGGED batches), `at` the node's clock at each row's write."""

        def write(n: int) -> None:
            self._batches(f"INSERT INTO bench.{table} (id, at, payload) VALUES (?, toTimestamp(now()), 'p')",
                          [(self._ids + i,) for i in range(n)])
            self._ids += n

        yield write


class ClickHouseStore:
    """The chdb stand-in of the tests (ClickHouse's engine behind its HTTP interface, tests/clickhouse_chdb); the
    tracking column `at` (DateTime64(6) DEFAULT now64(6): the server's clock at the insert), `id` the tie-breaker,
    the sorting key (at, id)."""

    name = "clickhouse"
    tasks = "tasks of 250,000 rows"
    batch_options: dict[str, str] = {}
    stream_options = {"tracking.tie-breaker": "id"}

    def __init__(self, stack: contextlib.ExitStack) -> None:
        from tests.clickhouse_chdb import ChdbClickHouse

        self.server = stack.enter_context(ChdbClickHouse())
        self.next_id = 0

    def options(self, table: str) -> dict[str, str]:
        return {"url": self.server.url, "table": table, "password": self.server.password}

    def fresh(self, table: str) -> None:
        self.server.sql(f"CREATE TABLE {table} (id UInt64, at DateTime64(6, 'UTC') DEFAULT now64(6), payload String) "
                        "ENGINE = MergeTree() ORDER BY (at, id)")

    def bulk(self, table: str, rows: int) -> None:
        self.fresh(table)
        self.server.sql(f"INSERT INTO {table} (id, payload) SELECT number + 1, repeat('x', 40) FROM numbers({rows})")

    @contextlib.contextmanager
    def writer(self, table: str) -> Iterator[Callable[[int], None]]:
        """A function that inserts n rows (one INSERT), `at` the server's clock at the insert."""

        def insert(n: int) -> None:
            self.server.sql(f"INSERT INTO {table} (id, payload) SELECT number + {self.next_id}, 'p' FROM numbers({n})")
            self.next_id += n

        yield insert


STORES = {"postgres": PostgresStore, "cassandra": CassandraStore, "clickhouse": ClickHouseStore}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=sorted([*STORES, "hbase", "opensearch"]), default="postgres")
    parser.add_argument("--rows", type=int, default=None, help="default: 300,000 (200,000 on OpenSearch)")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--windows", default="0,1000")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.store == "opensearch":
        from bench.tracking import search_stream

        print(f"load average at start: {os.getloadavg()}")
        search_stream.run(argparse.Namespace(**{**vars(args), "rows": args.rows or 200_000}))
        print(f"load average at end: {os.getloadavg()}")
        return
    args.rows = args.rows or 300_000
    if args.store == "hbase":
        from bench.tracking import hbase_stream

        hbase_stream.run(args)
        return

    import sluice

    print(f"load average at start: {os.getloadavg()}")
    with contextlib.ExitStack() as stack:
        store = STORES[args.store](stack)
        spark = sluice.session("bench-tracking", master="local[2]")
        store.bulk("bulk", args.rows)
        opts = store.options("bulk")

        def batch() -> float:
            started = time.perf_counter()
            (spark.read.format(store.name).options(**opts, **store.batch_options).load()
             .write.format("noop").mode("overwrite").save())
            return time.perf_counter() - started

        def stream() -> float:
            started = time.perf_counter()
            query = (spark.readStream.format(store.name).options(**opts, **store.stream_options)
                     .option("tracking.column", "at")
                     .option("tracking.lag-window-ms", "0").load().writeStream.format("noop")
                     .trigger(availableNow=True).start())
            query.awaitTermination()
            assert sum(p["numInputRows"] for p in query.recentProgress) == args.rows
            return time.perf_counter() - started

        batch_s, stream_s, runs = alternating(args.rounds, batch, stream)
        print(f"{store.name}: throughput, {args.rows:,} rows, best of {args.rounds} (all: {runs}): batch read "
              f"{args.rows / batch_s:,.0f} rows/s ({batch_s:.1f} s), stream (AvailableNow, {store.tasks}) "
              f"{args.rows / stream_s:,.0f} rows/s ({stream_s:.1f} s, the first planning included)")

        for window in (int(w) for w in args.windows.split(",")):
            p50, p99, count = freshness(spark, store, window, args.rate, args.seconds)
            print(f"freshness at {args.rate:,} rows/s for {args.seconds} s, lag window {window} ms: "
                  f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms ({count:,} rows)")
        print(f"load average at end: {os.getloadavg()}")
        spark.stop()


def freshness(spark, store, window_ms: int, rate: int, seconds: int) -> tuple[float, float, int]:
    table = f"fresh_{window_ms}"
    store.fresh(table)
    lags, arrived = arrivals()
    query = (spark.readStream.format(store.name).options(**store.options(table), **store.stream_options)
             .option("tracking.column", "at")
             .option("tracking.lag-window-ms", str(window_ms)).load().writeStream.foreachBatch(arrived).start())
    with store.writer(table) as insert:
        return paced(query, lags, insert, rate, seconds, window_ms)


if __name__ == "__main__":
    main()
