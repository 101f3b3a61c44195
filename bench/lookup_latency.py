"""Lookup joins against PostgreSQL or a three-node Cassandra: latency from a key's arrival to its enriched row in
the sink, p50/p99, `sluice.lookup` against Spark's stream-static join, one after the other in one run, alternating.

Run: `.venv/bin/python -m bench.lookup --latency-seconds 60 [--store cassandra] [--rate 1000] [--rows 1000000]
[--warmup 10] [--latency-rounds 2] [--drain-seconds 300]`.
- Keys arrive at --rate a second, evenly spaced: key number n arrives at t0 + n / rate (t0: just before the query
  starts) and is offered from then on by a minimal Python streaming source (its offset is the number of keys
  arrived so far, read from the clock when Spark plans a micro-batch), with its arrival time as a column. The keys
  are drawn over 1 .. 1.1 x rows by a multiplicative hash of n (about one in eleven missing). Spark's `rate` source
  is not used: its offsets move by whole seconds, which would add up to a second of waiting of its own.
- Each contender (--latency-rounds times, the order reversed each round), Spark local[2] with the default trigger
  (the next micro-batch as soon as the last one ends): `sluice.lookup(keys, "postgres", ..., on="id")`, and the same
  keys joined (left) to `spark.read.format("postgres")` of the table, which Spark reads again for every micro-batch.
  Both write into a PostgreSQL table of their own with `format("postgres")` (append), whose `sunk_at` defaults to
  `clock_timestamp()`.
- `--store cassandra`: the table is in bench.stores.cassandra_write's three nodes (bench/lookup_cassandra.py's
  cluster, keyspace and load, replication factor 1); the contenders are `sluice.lookup(keys, "cassandra", ...)`
  with a SELECT per key (lookup.max-keys-per-request=1), the same by default (an IN per replica's group of keys),
  that with lookup.repartition-by-replica (partitions-per-host 1: three tasks, each one node's keys) and the
  keys joined to `spark.read.format("cassandra")` of the table. The sink stays PostgreSQL: one clock.
- A row's latency is `sunk_at - arrived_at`: the machine's one clock, read by the Python worker and by the server.
  Keys arriving before the query's first micro-batch has ended and --warmup seconds after it are left out; the
  --latency-seconds after them are measured (p99 also for each 10 s of them), and the query runs until every one
  of them is in the sink (each key gives one row: a left join on the primary key), or --drain-seconds after the
  window ended: a contender that falls behind the keys is then stopped and reported as such (`drained` false, the
  window's keys in the sink, the keys arrived and not in the sink when it stopped, its micro-batches' keys and
  durations), its latencies over the window's keys that reached the sink only (none, or lower bounds: the keys
  still waiting would be later). `--rate` may name several rates (`10000,1500`): each contender at each, the
  table loaded once. Micro-batch figures are over
  Spark's recent progress (its last 100 micro-batches), with its keys/s offered (input) and run (processed).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg

from bench import cpu
from bench.measures import percentile

KEYS_SCHEMA = "n bigint, id bigint, arrived_at timestamp"


def arriving_keys(t0: float, rate: int, rows: int) -> type:
    """A streaming Python data source of the keys arrived since t0 at `rate` a second (defined here, not at module
    level, so that Spark's workers get the classes by value: they do not import `bench`)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class ArrivingKeysReader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"n": 0}

        def latestOffset(self, start: dict | None = None, limit: object = None) -> dict:
            return {"n": max(0, int((time.time() - t0) * rate))}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition((start["n"], end["n"]))] if end["n"] > start["n"] else []

        def read(self, partition: InputPartition):
            import numpy as np
            import pyarrow as pa

            first, end = partition.value
            n = np.arange(first, end, dtype=np.int64)
            keys = (n * 2654435761) % int(rows * 1.1) + 1
            arrived_us = ((t0 + n / rate) * 1_000_000).astype(np.int64)
            yield pa.RecordBatch.from_arrays(
                [pa.array(n), pa.array(keys), pa.array(arrived_us).cast(pa.timestamp("us", tz="UTC"))],
                names=["n", "id", "arrived_at"])

        def commit(self, end: dict) -> None:
            pass

    class ArrivingKeys(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_arriving_keys"

        def schema(self) -> str:
            return KEYS_SCHEMA

        def streamReader(self, schema: object) -> ArrivingKeysReader:
            return ArrivingKeysReader()

    return ArrivingKeys


def enrichers(spark, store: str, options: dict[str, str]) -> dict[str, Callable[[Any], Any]]:
    """Each contender: the keys' stream to its enriched stream."""
    import sluice

    if store == "postgres":
        def static() -> Any:
            return spark.read.format("postgres").options(**options).option("consistent-snapshot", "false").load()

        return {"sluice.lookup": lambda keys: sluice.lookup(keys, "postgres", options, on="id"),
                "stream-static join": lambda keys: keys.join(static(), "id", "left")}
    by_replica = {**options, "lookup.repartition-by-replica": "true", "lookup.partitions-per-host": "1"}
    per_key = {**options, "lookup.max-keys-per-request": "1"}
    return {"sluice.lookup, a SELECT per key": lambda keys: sluice.lookup(keys, "cassandra", per_key, on="id"),
            "sluice.lookup": lambda keys: sluice.lookup(keys, "cassandra", options, on="id"),
            "sluice.lookup, lookup.repartition-by-replica":
                lambda keys: sluice.lookup(keys, "cassandra", by_replica, on="id"),
            "stream-static join":
                lambda keys: keys.join(spark.read.format("cassandra").options(**options).load(), "id", "left")}


def contender(spark, url: str, name: str, enrich: Callable[[Any], Any], rows: int, rate: int, seconds: float,
              warmup: float, folder: Path, round_: str, drain: float = 300.0,
              servers: dict[int, str] | None = None) -> dict:
    table = "sink_" + re.sub(r"\W+", "_", name) + f"_{round_}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (n bigint, id bigint, arrived_at timestamptz, name text, value bigint, "
                     "sunk_at timestamptz DEFAULT clock_timestamp())")
    t0 = time.time()
    spark.dataSource.register(arriving_keys(t0, rate, rows))
    enriched = enrich(spark.readStream.format("bench_arriving_keys").load())
    query = (enriched.writeStream.format("postgres").options(url=url, table=table)
             .option("checkpointLocation", str(folder / table)).start())
    try:
        # The query's first micro-batch (a cold start: connections, Python workers) is not the steady state: the
        # measured keys arrive from --warmup seconds after it ended.
        deadline = time.monotonic() + 120
        while not query.recentProgress and time.monotonic() < deadline:
            query.awaitTermination(0.2)
        assert query.recentProgress, f"{name}: no micro-batch in 120 s: {query.exception()}"
        cpu_before, cpu_started = cpu.snapshot(), time.time()
        measured_from = time.time() + warmup
        measured_to = measured_from + seconds
        first, end = int((measured_from - t0) * rate), int((measured_to - t0) * rate)  # the measured keys' numbers
        expected = end - first
        window = f"n >= {first} AND n < {end}"
        deadline = measured_to + drain
        drained, behind = True, 0
        sunk = f"SELECT count(*) FROM {table}"
        while True:
            # the keys' pace, not an event: look again once a second whether the window's rows are all in
            query.awaitTermination(1.0)
            if query.exception() is not None:
                raise RuntimeError(f"{name}: the query failed: {query.exception()}")
            if time.time() > measured_to:
                with psycopg.connect(url, autocommit=True) as conn:
                    count = conn.execute(f"SELECT count(*) FROM {table} WHERE {window}").fetchone()[0]
                if count >= expected:
                    break
                if time.time() > deadline:  # fallen behind the keys: stopped, reported as such
                    with psycopg.connect(url, autocommit=True) as conn:
                        drained, behind = False, int((time.time() - t0) * rate) - conn.execute(sunk).fetchone()[0]
                    print(json.dumps({name: f"{count} of the window's {expected} keys in the sink {drain:.0f} s "
                                      f"after it ended; {behind} keys arrived and not in the sink"}),
                          file=sys.stderr, flush=True)
                    break
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        mine = cpu.own_processes()
        cpu_after, cpu_seconds = cpu.snapshot(), time.time() - cpu_started
    finally:
        query.stop()
    with psycopg.connect(url, autocommit=True) as conn:
        latencies = conn.execute(f"SELECT n, extract(epoch FROM sunk_at - arrived_at) * 1000 FROM {table} "
                                 f"WHERE {window} ORDER BY n").fetchall()
        ms = [float(r[1]) for r in latencies]
        enriched_rows = conn.execute(f"SELECT count(*) FROM {table} WHERE {window} AND name IS NOT NULL").fetchone()[0]
    assert len(ms) == expected if drained else len(ms) <= expected, (name, len(ms), expected)  # a row a key, once
    return {"keys_measured": expected, "drained": drained, "keys_in_sink": len(ms),
            "keys_arrived_not_in_sink_at_stop": behind, "keys_found": enriched_rows,
            **({"p50_ms": round(percentile(ms, .5)), "p95_ms": round(percentile(ms, .95)),
                "p99_ms": round(percentile(ms, .99)), "max_ms": round(max(ms))} if ms else {}),
            **({} if drained else {"micro_batches_keys_and_ms": [
                (p["numInputRows"], p["durationMs"]["triggerExecution"]) for p in progress]}),
            "p99_ms_of_each_10_s": [round(percentile(ms[i:i + 10 * rate], .99)) for i in range(0, len(ms), 10 * rate)],
            "recent_micro_batches": len(progress),
            "micro_batch_median_ms": statistics.median(p["durationMs"]["triggerExecution"] for p in progress),
            "keys_per_micro_batch_median": statistics.median(p["numInputRows"] for p in progress),
            # Spark's own rates: keys offered per second of the source (input) and run per second of a micro-batch
            # (processed); processed below input means the query falls behind the keys.
            "input_keys_per_s_median": round(statistics.median(p["inputRowsPerSecond"] for p in progress)),
            "processed_keys_per_s_median": round(statistics.median(p["processedRowsPerSecond"] for p in progress)),
            # cores each component kept busy from the end of the first micro-batch to the stop (this run's processes)
            "cores_busy": cores_busy(cpu_before, cpu_after, mine, servers or {}, cpu_seconds)}


def cores_busy(before: dict, after: dict, mine: set[int], servers: dict[int, str], seconds: float) -> dict:
    """CPU seconds per wall second of each component (bench/cpu.py's, the servers in `servers` by their names),
    counting only this run's processes; `total` of the machine's 2 cores."""
    def ours(shot: dict) -> dict:
        return {pid: (servers.get(pid, kind), used) for pid, (kind, used) in shot.items() if pid in mine}

    busy = {name: round(used / seconds, 2) for name, used in cpu.used(ours(before), ours(after)).items()}
    return {**busy, "total": round(sum(busy.values()), 2)}


def run(rows: int, rates: list[int], seconds: float, warmup: float, rounds: int = 2, store: str = "postgres",
        drain: float = 300.0) -> dict:
    import sluice
    from sluice.testing import LocalPostgres

    load_start, started = os.getloadavg(), time.time()
    report: dict[str, Any] = {"store": store}
    servers: dict[int, str] = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        server = stack.enter_context(LocalPostgres())  # the sink, and PostgreSQL's table
        if store == "postgres":
            with psycopg.connect(server.url, autocommit=True) as conn:
                conn.execute("CREATE TABLE dim (id bigint PRIMARY KEY, name text, value bigint)")
                conn.execute("INSERT INTO dim SELECT g, 'name-' || g, g * 7 FROM generate_series(1, %s) g",
                             (rows,))
                conn.execute("VACUUM ANALYZE dim")
            options = {"url": server.url, "table": "dim"}
        else:
            from bench.lookup_cassandra import load
            from bench.stores.cassandra_write import start_nodes

            nodes, info = start_nodes(stack, 3)
            servers = {node.pid: "cassandra_nodes" for node in nodes if node.pid is not None}
            report["cluster_start_seconds"] = info["start_seconds"]
            cluster = stack.enter_context(nodes[0].cluster())
            report["load_seconds"] = round(load(cluster.connect(), rows), 1)
            options = {"host": nodes[0].host, "port": str(nodes[0].port), "keyspace": "bench", "table": "dim"}
        spark = sluice.session("bench-lookup-latency", master="local[2]", **{"spark.sql.shuffle.partitions": "2"})
        try:
            contenders = enrichers(spark, store, options)
            by_rate: dict[int, dict[str, list[dict]]] = {}
            for rate in rates:
                out = by_rate[rate] = {name: [] for name in contenders}
                for i in range(rounds):  # the order reversed each round: a load that comes and goes falls on both
                    for name in list(out) if i % 2 == 0 else list(out)[::-1]:
                        out[name].append(contender(spark, server.url, name, contenders[name], rows, rate, seconds,
                                                   warmup, Path(tmp), f"{rate}_{i}", drain, servers))
                        print(json.dumps({name: out[name][-1], "rate": rate, "round": i}), file=sys.stderr,
                              flush=True)
        finally:
            spark.stop()
    latency = {"latency": by_rate[rates[0]]} if len(rates) == 1 else {"latency_by_keys_per_s": by_rate}
    return {**report, "rows": rows, "keys_per_s": rates[0] if len(rates) == 1 else rates, "seconds_measured": seconds,
            "warmup_s": warmup, "drain_s": drain, "rounds": rounds,
            "utc_start": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
            "utc_end": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "load_average_1_5_15_min": {"start": load_start, "end": os.getloadavg()}, **latency}
