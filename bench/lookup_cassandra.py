"""Lookup joins against a three-node Cassandra: rows read from the store per micro-batch, lookups/s against the bare
driver, and whether `lookup.repartition-by-replica` pays.

Run: `.venv/bin/python -m bench.lookup --store cassandra [--rows 1000000] [--keys 1000] [--keys-high 10000]
[--batches 5]`: each measure below at --keys keys per micro-batch, then again at --keys-high (0: not), except the
stream-static join, run at --keys only (it reads the whole table whatever the keys).
The cluster: bench.stores.cassandra_write's three nodes on 127.0.0.1-3 (512 MiB heap each, 16 interleaved tokens a
node), keyspace `bench` at replication factor 1 (each key on one node: the case replica placement is for); the table
`dim (id bigint PRIMARY KEY, name text, value bigint)`, --rows rows loaded through the driver's
`execute_concurrent_with_args`. Key batches as bench/lookup.py's: uniform over 1 .. 1.1 x rows (one in eleven missing).
- streaming, Spark local[2], a file stream of the key batches (one file, one micro-batch each, Trigger.AvailableNow,
  the noop sink): `sluice.lookup` against the stream joined to `spark.read.format("cassandra")` of the table (the
  stream-static join), and the lookup four ways: a SELECT per key (lookup.max-keys-per-request=1) and, by default (an
  IN per replica's group of up to 100 keys), on the stream's own partitioning (one file, one task), after
  `repartition(3)` (round robin: the shuffle alone), and with lookup.repartition-by-replica (partitions-per-host 1:
  three tasks, each one node's keys), each lookup twice in turn, the faster kept. Rows read from the store are
  counted by sluice's tasks on its metrics collector: `sluice_source_numRecordsIn_total` (the batch read's rows)
  and `sluice_lookup_numRecordsLoaded_total` (the lookup's; a key in two tasks of a micro-batch is read twice).
- one process, no Spark, the same Arrow batches: sluice's worker path (`enrich`: dedupe, the SELECTs through the
  driver's `execute_concurrent`, rows to Arrow, the join back) at each of KEYS_PER_REQUEST_TRIED's
  lookup.max-keys-per-request (1: a SELECT per key) against the bare driver's loop of a SELECT per key (distinct
  keys, sluice's per-key prepared SELECT at the same consistency, `execute_concurrent_with_args` with concurrency
  64, rows to Arrow columns, no join): keys looked up per second, the best of two alternating runs after an untimed
  pass.
The streaming figures include each micro-batch's addBatch time (its run through the lookup into the sink) at p50/p99.
`--per-batch N [--nodes 1]` runs instead, in one process, no Spark: N uniform batches, each batch's lookup timed
(p50/p99), then N batches of keys drawn from a Zipf distribution (a = 1.2, capped at --rows) with lookup.cache=none
and then partial (max-rows 10000, a fresh cache): hit ratio, rows read from the store (the lookup's own count), seconds.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

SETTLE_TIMEOUT_S = 30.0
# lookup.max-keys-per-request in the one-process measure: 1 is a SELECT per key (the bare driver's loop), the others
# an IN per replica's group of that many keys at most.
KEYS_PER_REQUEST_TRIED = (1, 50, 100, 200)


def keys_of(rng: np.random.Generator, rows: int, keys: int, batches: int) -> list[np.ndarray]:
    """bench/lookup.py's uniform key batches (which runs this module: it cannot import that one back)."""
    return [rng.integers(1, int(rows * 1.1) + 1, keys, dtype=np.int64) for _ in range(batches)]


def load(session: Any, rows: int) -> float:
    """Seconds to write `rows` rows into bench.dim."""
    from cassandra.concurrent import execute_concurrent_with_args

    session.execute("CREATE KEYSPACE bench WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
    session.execute("CREATE TABLE bench.dim (id bigint PRIMARY KEY, name text, value bigint)")
    insert = session.prepare("INSERT INTO bench.dim (id, name, value) VALUES (?, ?, ?)")
    started = time.perf_counter()
    step = 50_000
    for low in range(1, rows + 1, step):
        params = [(i, f"name-{i}", i * 7) for i in range(low, min(rows, low + step - 1) + 1)]
        execute_concurrent_with_args(session, insert, params, concurrency=256, raise_on_first_error=True)
    return time.perf_counter() - started


def counter(url: str, name: str, store: str = "cassandra") -> float:
    """A sluice counter of format `store` on the collector (0 before any report)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found = re.search(rf'^{name}\{{[^}}]*format="{store}"[^}}]*\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def settled(url: str, name: str, store: str = "cassandra") -> float:
    """The counter once it stops moving (tasks report when they end; the last reports arrive after the query)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = counter(url, name, store)
    while time.monotonic() < deadline:
        time.sleep(2.5)
        now = counter(url, name, store)
        if now == last:
            return now
        last = now
    raise RuntimeError(f"{name} still moving after {SETTLE_TIMEOUT_S} s")


def streaming(spark: Any, options: dict[str, str], batches: list[np.ndarray], folder: Path,
              metrics: str, static_join: bool) -> dict[str, dict[str, float]]:
    import sluice

    folder.mkdir()
    files = folder / "keys"
    files.mkdir()
    for i, keys in enumerate(batches):
        (files / f"{i:05d}.json").write_text("\n".join(json.dumps({"id": int(k)}) for k in keys))
    by_replica = {**options, "lookup.repartition-by-replica": "true", "lookup.partitions-per-host": "1"}
    per_key = {**options, "lookup.max-keys-per-request": "1"}
    contenders = {
        "sluice.lookup, a SELECT per key (lookup.max-keys-per-request=1)":
            lambda s: sluice.lookup(s, "cassandra", per_key, on="id"),
        "sluice.lookup (the stream's partitioning)": lambda s: sluice.lookup(s, "cassandra", options, on="id"),
        "sluice.lookup after repartition(3)": lambda s: sluice.lookup(s.repartition(3), "cassandra", options, on="id"),
        "sluice.lookup, lookup.repartition-by-replica": lambda s: sluice.lookup(s, "cassandra", by_replica, on="id"),
        "stream-static join": lambda s: s.join(spark.read.format("cassandra").options(**options).load(), "id", "left"),
    }
    if not static_join:
        del contenders["stream-static join"]
    out: dict[str, dict[str, float]] = {}
    # The lookups twice, in turn, each keeping its faster run (the first query also starts Spark's Python workers);
    # the stream-static join, reading the whole table, once.
    for run in range(2):
        for name, enrich in contenders.items():
            if run and name == "stream-static join":
                continue
            stream = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(files))
            counted = "sluice_source_numRecordsIn_total" if name == "stream-static join" else \
                "sluice_lookup_numRecordsLoaded_total"
            before = settled(metrics, counted)
            started = time.perf_counter()
            query = enrich(stream).writeStream.format("noop").trigger(availableNow=True) \
                .option("checkpointLocation", str(folder / (re.sub(r"\W+", "_", name) + f"-{run}"))).start()
            query.awaitTermination()
            seconds = time.perf_counter() - started
            progress = [p for p in query.recentProgress if p["numInputRows"]]
            micro_batches = len(progress)
            read = settled(metrics, counted) - before
            # addBatch: the micro-batch's run through the lookup (or the join) into the sink, planning excluded.
            run_ms = np.array([p["durationMs"].get("addBatch", 0) for p in progress] or [0], dtype=np.float64)
            figures = {"micro_batches": micro_batches, "rows_read_per_micro_batch": read / max(1, micro_batches),
                       "seconds_per_micro_batch": seconds / max(1, micro_batches),
                       "add_batch_ms_p50": float(np.percentile(run_ms, 50)),
                       "add_batch_ms_p99": float(np.percentile(run_ms, 99))}
            print(json.dumps({name: figures, "run": run}), file=sys.stderr, flush=True)  # kept should a step fail
            if name not in out or figures["seconds_per_micro_batch"] < out[name]["seconds_per_micro_batch"]:
                out[name] = figures
    return out


def bare_driver(session: Any, batches: list[pa.RecordBatch], cql: str, consistency: str) -> float:
    """Seconds for the bare driver over the batches: distinct keys, execute_concurrent_with_args, rows to Arrow."""
    from cassandra import ConsistencyLevel
    from cassandra.cluster import ExecutionProfile
    from cassandra.concurrent import execute_concurrent_with_args
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
    from cassandra.query import tuple_factory

    if "tuples" not in session.cluster.profile_manager.profiles:
        session.cluster.add_execution_profile("tuples", ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()), row_factory=tuple_factory))
    select = session.prepare(cql)
    select.consistency_level = ConsistencyLevel.name_to_value[consistency]
    started = time.perf_counter()
    for batch in batches:
        keys = [(k,) for k in set(batch.column(0).to_pylist())]
        results = execute_concurrent_with_args(session, select, keys, concurrency=64, raise_on_first_error=True,
                                               execution_profile="tuples")
        rows = [row for result in results for row in result.result_or_exc]
        columns = list(zip(*rows, strict=True))
        pa.table({"id": pa.array(columns[0], pa.int64()), "name": pa.array(columns[1], pa.string()),
                  "value": pa.array(columns[2], pa.int64())})
    return time.perf_counter() - started


def sluice_path(options: dict[str, str], batches: list[pa.RecordBatch]) -> tuple[float, str, str]:
    """Seconds for sluice's worker path over the batches, and the reader's SELECT and consistency."""
    seconds, _, reader = timed_batches(options, batches)
    return sum(seconds), reader.cql, reader.consistency


def timed_batches(options: dict[str, str], batches: list[pa.RecordBatch]) -> tuple[list[float], Any, Any]:
    """sluice's worker path over the batches (with the cache the options ask for, fresh): each batch's seconds, the
    counts (a LookupTally over all batches) and the reader."""
    from pyspark.sql.types import LongType, StructField, StructType

    from sluice.metrics._lookups import LookupTally
    from sluice.source._lookup_cache import cache_for
    from sluice.source._lookup_dataframe import plan_lookup
    from sluice.source._lookup_join import enrich

    plan, _ = plan_lookup(StructType([StructField("id", LongType())]), "cassandra", options, "id", "left", None)
    reader: Any = plan.reader
    cache = cache_for(plan.lookup_id, plan.cache)
    tally = LookupTally()
    seconds = []
    try:
        for batch in batches:
            started = time.perf_counter()
            enrich(plan, batch, cache, tally)
            seconds.append(time.perf_counter() - started)
    finally:
        reader.close(clean=True)
    return seconds, tally, reader


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    return {"p50_ms": float(np.percentile(seconds, 50)) * 1000, "p99_ms": float(np.percentile(seconds, 99)) * 1000,
            "max_ms": max(seconds) * 1000}


def per_batch(options: dict[str, str], uniform: list[np.ndarray], zipf: list[np.ndarray]) -> dict[str, object]:
    """One process, no Spark: each uniform batch's lookup time (p50/p99), and the Zipf batches with the cache off,
    then on (partial, max-rows 10000, a fresh cache): hit ratio, rows read from the store, seconds."""
    uniform_arrow = [pa.record_batch({"id": pa.array(k)}) for k in uniform]
    timed_batches(options, uniform_arrow[:1])  # untimed: the session and the prepared SELECT
    seconds, tally, _ = timed_batches(options, uniform_arrow)
    report: dict[str, object] = {"uniform": {"batches": len(seconds), **percentiles_ms(seconds),
                                             "rows_read_per_batch": tally.records_loaded / len(seconds)}}
    zipf_arrow = [pa.record_batch({"id": pa.array(k)}) for k in zipf]
    for cache in ("none", "partial"):
        seconds, tally, _ = timed_batches({**options, "lookup.cache": cache,
                                           "lookup.partial-cache.max-rows": "10000"}, zipf_arrow)
        report[f"zipf_cache_{cache}"] = {
            "batches": len(seconds), "seconds": sum(seconds), **percentiles_ms(seconds),
            "distinct_keys_per_batch": (tally.hits + tally.misses) / len(seconds),
            "hit_ratio": tally.hits / max(1, tally.hits + tally.misses),
            "rows_read_per_batch": tally.records_loaded / len(seconds)}
        print(json.dumps({f"zipf_cache_{cache}": report[f"zipf_cache_{cache}"]}), file=sys.stderr, flush=True)
    return report


def measured(session: Any, options: dict[str, str], uniform: list[np.ndarray], folder: Path, metrics: str,
             static_join: bool) -> dict[str, object]:
    """The streaming figures and the one-process ones for one size of key batches."""
    import sluice

    report: dict[str, object] = {}
    spark = sluice.session("bench-lookup-cassandra", master="local[2]", **{"spark.sql.shuffle.partitions": "2"})
    try:
        report["streaming"] = streaming(spark, options, uniform, folder, metrics, static_join)
    finally:
        spark.stop()
    arrow = [pa.record_batch({"id": pa.array(k)}) for k in uniform]
    # One untimed pass warms the session and the nodes' caches of these keys' partitions; then each contender
    # twice, alternating, the best of each. The bare driver's SELECT is sluice's per-key one.
    _, cql, consistency = sluice_path({**options, "lookup.max-keys-per-request": "1"}, arrow)
    sluice_path(options, arrow)
    tried = {f"sluice_{n}_keys_per_request": {**options, "lookup.max-keys-per-request": str(n)}
             for n in KEYS_PER_REQUEST_TRIED}
    best = dict.fromkeys(["bare_driver", *tried], float("inf"))
    for _ in range(2):
        best["bare_driver"] = min(best["bare_driver"], bare_driver(session, arrow, cql, consistency))
        for name, opts in tried.items():
            best[name] = min(best[name], sluice_path(opts, arrow)[0])
    looked_up = sum(len(set(k.tolist())) for k in uniform)
    report["one_process"] = {**{f"{name}_keys_per_s": looked_up / s for name, s in best.items()},
                             **{f"{name}_against_bare_driver": best["bare_driver"] / best[name] for name in tried}}
    print(json.dumps(report["one_process"]), file=sys.stderr, flush=True)
    return report


def run(rows: int, keys: list[int], batches: int, nodes: int = 3, only_batches: int = 0) -> dict[str, object]:
    """The measures above; with `only_batches`, instead, `per_batch`'s alone on that many batches of each size."""
    import sluice.metrics
    from bench.stores.cassandra_write import start_nodes

    rng = np.random.default_rng(7)
    report: dict[str, object] = {"store": "cassandra", "nodes": nodes, "replication_factor": 1, "rows": rows,
                                 "keys_per_batch": keys, "batches": only_batches or batches,
                                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
                                 "load_average_start": os.getloadavg()}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        servers, started = start_nodes(stack, nodes)
        report["cluster_start_seconds"] = started["start_seconds"]
        cluster = stack.enter_context(servers[0].cluster())
        session = cluster.connect()
        report["load_seconds"] = load(session, rows)
        print(json.dumps({"load_seconds": report["load_seconds"]}), file=sys.stderr, flush=True)
        options = {"host": servers[0].host, "port": str(servers[0].port), "keyspace": "bench", "table": "dim"}
        if only_batches:
            for size in keys:
                zipf = [np.minimum(rng.zipf(1.2, size), rows).astype(np.int64) for _ in range(only_batches)]
                report[f"{size}_keys_per_batch"] = per_batch(options, keys_of(rng, rows, size, only_batches), zipf)
            report["load_average_end"] = os.getloadavg()
            return report
        collector = stack.enter_context(sluice.metrics.serve())
        metrics = f"http://127.0.0.1:{collector.port}/metrics"
        for at, size in enumerate(keys):
            report[f"{size}_keys_per_micro_batch"] = measured(session, options, keys_of(rng, rows, size, batches),
                                                              Path(tmp) / str(size), metrics, static_join=at == 0)
    report["load_average_end"] = os.getloadavg()
    return report
