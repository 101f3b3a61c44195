"""Lookup joins against PostgreSQL: rows read from the store per micro-batch, lookups/s, and the cache on Zipf keys.

Run: `.venv/bin/python -m bench.lookup [--rows 200000] [--keys 1000] [--batches 10]` (starts a throwaway PostgreSQL).
`--latency-seconds N`, instead of the measures below: latency from a key's arrival to its enriched row in a
PostgreSQL sink, p50/p99, `sluice.lookup` against Spark's stream-static join, keys arriving at --rate a second for N
seconds each (bench/lookup_latency.py; with `--store cassandra`, the table in a three-node Cassandra).
`--store cassandra` runs bench/lookup_cassandra.py's measures on a three-node Cassandra instead; `--store hbase`
bench/lookup_hbase.py's on one HBase (--region-servers region servers in its JVM) whose table is pre-split into
--regions regions. `--measure concurrency --store clickhouse|opensearch|hbase`: the concurrency measure below on
that store, against its own bare client (bench/lookup_stores.py).
Data: a table `dim (id bigint PRIMARY KEY, name text, value bigint)` of --rows rows; --batches micro-batches of
--keys keys each, drawn uniformly from 1 .. 1.1 x rows (about one key in eleven missing).
- streaming, Spark local[2]: a file stream of the key batches (one file per micro-batch, Trigger.AvailableNow, Spark's
  noop sink) enriched by `sluice.lookup` against the same stream joined to `spark.read.format("postgres")` of the
  table (Spark's stream-static join). Rows read from the store are counted by the server: the table's
  `seq_tup_read + idx_tup_fetch` (pg_stat_user_tables) over the query, read once every connection of the run has
  ended (a backend reports its counts when it exits; the lookup's pooled connections end 10 s after their last use).
- one process, no Spark, the same Arrow batches: sluice's worker path (`enrich`: dedupe, one prepared `= ANY`, rows to
  Arrow, the join back) against a bare psycopg loop (the distinct keys, the same prepared `= ANY`, rows to Arrow
  columns, no join): keys looked up per second.
- the cache: --batches batches of keys drawn from a Zipf distribution (a = 1.2) over the table, sluice's worker path
  with lookup.cache=partial (max-rows 10000) against lookup.cache=none: hit rate and time.
- concurrency (also alone, `--measure concurrency`): --batches batches of --keys-high keys (10,000), sluice's worker
  path with lookup.max-concurrent-requests=1 against the default (4), each batch's keys in statements of
  lookup.max-keys-per-request (1,000), and beside them 4 of 2,500 keys and 1 of the whole batch: keys looked up per
  second by one task; each split one with its statements in the batch's one snapshot and, beside it, each in its own
  (autocommit, the reader's private switch); and the bare psycopg loop's one statement per batch.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg
import pyarrow as pa

SETTLE_TIMEOUT_S = 60.0


def keys_of(rng: np.random.Generator, rows: int, keys: int, batches: int, zipf: bool = False) -> list[np.ndarray]:
    if zipf:
        return [np.minimum(rng.zipf(1.2, keys), rows).astype(np.int64) for _ in range(batches)]
    return [rng.integers(1, int(rows * 1.1) + 1, keys, dtype=np.int64) for _ in range(batches)]


def rows_read(url: str, table: str) -> int:
    """The table's rows read by scans and index fetches since the last reset, once no sluice connection is left."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    with psycopg.connect(url, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sluice'").fetchone()[0]:
            if time.monotonic() > deadline:
                left = conn.execute("SELECT state, backend_start, left(query, 80) FROM pg_stat_activity "
                                    "WHERE application_name = 'sluice'").fetchall()
                raise RuntimeError(f"sluice connections left after 60 s (counts would be partial): {left}")
            time.sleep(0.5)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        count = conn.execute("SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables "
                             "WHERE relname = %s", (table,)).fetchone()[0]
    return int(count)


def streaming(spark, url: str, batches: list[np.ndarray], folder: Path) -> dict[str, dict[str, float]]:
    import sluice

    files = folder / "keys"
    files.mkdir()
    for i, keys in enumerate(batches):
        (files / f"{i:05d}.json").write_text("\n".join(json.dumps({"id": int(k)}) for k in keys))
    options = {"url": url, "table": "dim"}
    out = {}
    for name in ("sluice.lookup", "stream-static join"):
        stream = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(files))
        if name == "sluice.lookup":
            enriched = sluice.lookup(stream, "postgres", options, on="id")
        else:
            # consistent-snapshot=false: a snapshot is no use to a static side, and the held ones would keep
            # connections open past the query (the counts are read once every connection has ended).
            static = spark.read.format("postgres").options(**options).option("consistent-snapshot", "false").load()
            enriched = stream.join(static, "id", "left")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_reset()")
        started = time.perf_counter()
        query = enriched.writeStream.format("noop").trigger(availableNow=True) \
            .option("checkpointLocation", str(folder / name.replace(" ", "_"))).start()
        query.awaitTermination()
        seconds = time.perf_counter() - started
        micro_batches = len([p for p in query.recentProgress if p["numInputRows"]])
        read = rows_read(url, "dim")
        out[name] = {"micro_batches": micro_batches, "rows_read_per_micro_batch": read / max(1, micro_batches),
                     "seconds_per_micro_batch": seconds / max(1, micro_batches)}
    return out


def bare_loop(url: str, batches: list[pa.RecordBatch]) -> float:
    """Seconds for a bare psycopg loop over the batches: distinct keys, prepared = ANY, rows to Arrow columns."""
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        for batch in batches:
            keys = list(set(batch.column(0).to_pylist()))
            rows = conn.execute("SELECT id, name, value FROM dim WHERE id = ANY(%s::int8[])", [keys],
                                prepare=True).fetchall()
            columns = list(zip(*rows, strict=True))
            pa.table({"id": pa.array(columns[0], pa.int64()), "name": pa.array(columns[1], pa.string()),
                      "value": pa.array(columns[2], pa.int64())})
        return time.perf_counter() - started


def sluice_loop(url: str, batches: list[pa.RecordBatch], cache: str, one_snapshot: bool = True,
                **options: str) -> tuple[float, object]:
    """Seconds for sluice's worker path over the batches, and its cache's counts; `options`: more lookup options;
    `one_snapshot=False`: a split batch's statements each in autocommit, a snapshot each (as before they shared one)."""
    from pyspark.sql.types import LongType, StructField, StructType

    from sluice.metrics._lookups import LookupTally
    from sluice.source._lookup_cache import cache_for
    from sluice.source._lookup_dataframe import plan_lookup
    from sluice.source._lookup_join import enrich

    schema = StructType([StructField("id", LongType())])
    plan, _ = plan_lookup(schema, "postgres", {"url": url, "table": "dim", "lookup.cache": cache,
                                               "lookup.partial-cache.max-rows": "10000", **options}, "id", "left",
                          None)
    plan.reader._one_snapshot = one_snapshot  # type: ignore[attr-defined]  # postgres's reader
    store = cache_for(plan.lookup_id, plan.cache)
    try:
        started = time.perf_counter()
        for batch in batches:
            enrich(plan, batch, store, LookupTally())
        seconds = time.perf_counter() - started
    finally:
        plan.reader.close(clean=True)
    return seconds, store.stats() if store is not None else None


def concurrency(url: str, batches: list[pa.RecordBatch]) -> dict[str, object]:
    """Keys looked up per second by sluice's worker path (one task's): lookup.max-concurrent-requests 1 against the
    default, side by side, and the default with larger requests (lookup.max-keys-per-request), which the default's
    choice rests on; each split setting with its statements sharing the batch's snapshot (sluice's way) and each in a
    snapshot of its own (autocommit: the way before): alternating runs after an untimed pass, the best of three each."""
    from sluice.source._lookup_requests import DEFAULT_CONCURRENT_REQUESTS as C
    from sluice.source._lookup_requests import DEFAULT_KEYS_PER_REQUEST as K

    looked_up = sum(len(set(b.column(0).to_pylist())) for b in batches)
    split = {f"concurrency 1, {K} keys a request": (1, K),
             f"concurrency {C} (default), {K} keys a request (default)": (C, K),
             f"concurrency {C}, 2500 keys a request": (C, 2500)}
    settings = {**{f"{name}, one snapshot a batch": (*how, True) for name, how in split.items()},
                **{f"{name}, a snapshot a statement": (*how, False) for name, how in split.items()},
                f"concurrency 1, {10 * K} keys a request (one a batch)": (1, 10 * K, True)}
    sluice_loop(url, batches[:1], "none")  # warm: the server's cache of the table and the index
    best: dict[str, float] = {}
    for _ in range(3):
        for name, (requests, keys, one_snapshot) in settings.items():
            seconds, _ = sluice_loop(url, batches, "none", one_snapshot, **{
                "lookup.max-concurrent-requests": str(requests), "lookup.max-keys-per-request": str(keys)})
            best[name] = min(best.get(name, seconds), seconds)
    bare = min(bare_loop(url, batches) for _ in range(3))
    return {"distinct_keys": looked_up, "sluice_keys_per_s": {name: looked_up / s for name, s in best.items()},
            "bare_psycopg_one_statement_a_batch_keys_per_s": looked_up / bare}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=1000, help="keys per micro-batch")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--store", choices=("postgres", "cassandra", "hbase", "clickhouse", "opensearch"),
                        default="postgres", help="cassandra: a three-node cluster (bench/lookup_cassandra.py); hbase: "
                        "one HBase (bench/lookup_hbase.py); with --measure concurrency, clickhouse, opensearch and "
                        "hbase: bench/lookup_stores.py")
    parser.add_argument("--keys-high", type=int, default=10_000, help="cassandra, hbase: keys per micro-batch of a "
                        "second round (0: none)")
    parser.add_argument("--regions", type=int, default=8, help="hbase: regions the table is pre-split into")
    parser.add_argument("--region-servers", type=int, default=1, help="hbase: region servers in the standalone "
                        "HBase's JVM, the table's regions spread over them")
    parser.add_argument("--nodes", type=int, default=3, help="cassandra: nodes of the cluster")
    parser.add_argument("--per-batch", type=int, default=0, metavar="N", help="cassandra: instead of the streaming "
                        "and bare-driver measures, N batches in one process: p50/p99 of a batch's lookup, and N Zipf "
                        "batches with the cache off and on")
    parser.add_argument("--latency-seconds", type=float, default=0, metavar="N", help="postgres, cassandra: instead "
                        "of the measures above, p50/p99 latency from a key's arrival to its enriched row in the sink, "
                        "keys arriving at --rate a second, N seconds measured per contender (bench/lookup_latency.py)")
    parser.add_argument("--rate", default="1000", help="--latency-seconds: keys arriving per second; several, "
                        "comma-separated (10000,1500): each contender at each, in turn")
    parser.add_argument("--warmup", type=float, default=10, help="--latency-seconds: seconds of keys left out "
                        "after each query's first micro-batch")
    parser.add_argument("--latency-rounds", type=int, default=2, help="--latency-seconds: rounds of both "
                        "contenders, the order reversed each round")
    parser.add_argument("--drain-seconds", type=float, default=300, help="--latency-seconds: how long after its "
                        "window a contender may take to sink the window's keys; one still behind then is stopped "
                        "and reported as falling behind")
    parser.add_argument("--measure", choices=("all", "concurrency"), default="all", help="postgres, clickhouse, "
                        "opensearch, hbase: concurrency alone measures lookups/s per task at "
                        "lookup.max-concurrent-requests 1 and the default, on --batches batches of --keys-high keys")
    args = parser.parse_args(argv)
    if args.latency_seconds:
        if args.store not in ("postgres", "cassandra"):
            parser.error("--latency-seconds measures the PostgreSQL or Cassandra lookup (--store postgres or "
                         "cassandra)")
        from bench.lookup_latency import run as run_latency

        rates = [int(r) for r in args.rate.split(",")]
        print(json.dumps(run_latency(args.rows, rates, args.latency_seconds, args.warmup, args.latency_rounds,
                                     args.store, args.drain_seconds), indent=2))
        return 0
    if args.measure == "concurrency" and args.store in ("clickhouse", "opensearch", "hbase"):
        from bench.lookup_stores import run as run_stores

        print(json.dumps(run_stores(args.store, args.rows, args.keys_high, args.batches), indent=2))
        return 0
    if args.store in ("clickhouse", "opensearch"):
        parser.error(f"--store {args.store} measures requests in flight only: add --measure concurrency")
    if args.store == "hbase":
        from bench.lookup_hbase import run as run_hbase

        sizes = [args.keys, *([args.keys_high] if args.keys_high else [])]
        print(json.dumps(run_hbase(args.rows, args.regions, sizes, args.batches, args.region_servers), indent=2))
        return 0
    if args.store == "cassandra":
        from bench.lookup_cassandra import run

        sizes = [args.keys, *([args.keys_high] if args.keys_high else [])]
        print(json.dumps(run(args.rows, sizes, args.batches, args.nodes, args.per_batch), indent=2))
        return 0

    import sluice
    from sluice.testing import LocalPostgres

    rng = np.random.default_rng(7)
    with LocalPostgres() as server, tempfile.TemporaryDirectory() as tmp:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE dim (id bigint PRIMARY KEY, name text, value bigint)")
            conn.execute("INSERT INTO dim SELECT g, 'name-' || g, g * 7 FROM generate_series(1, %s) g", (args.rows,))
            conn.execute("VACUUM ANALYZE dim")
        uniform = keys_of(rng, args.rows, args.keys, args.batches)
        report: dict[str, object] = {"rows": args.rows, "keys_per_batch": args.keys, "batches": args.batches}
        high = [pa.record_batch({"id": pa.array(k)})  # a generator of its own: the other draws stay as they were
                for k in keys_of(np.random.default_rng(11), args.rows, args.keys_high, args.batches)]
        if args.measure == "concurrency":
            report["concurrency"] = {"keys_per_batch": args.keys_high, **concurrency(server.url, high)}
            print(json.dumps(report, indent=2))
            return 0

        spark = sluice.session("bench-lookup", master="local[2]", **{"spark.sql.shuffle.partitions": "2"})
        try:
            report["streaming"] = streaming(spark, server.url, uniform, Path(tmp))
        finally:
            spark.stop()

        arrow = [pa.record_batch({"id": pa.array(k)}) for k in uniform]
        sluice_loop(server.url, arrow[:1], "none")  # warm: the server's cache of the table and the index
        bare_s = bare_loop(server.url, arrow)
        sluice_s, _ = sluice_loop(server.url, arrow, "none")
        looked_up = sum(len(set(k.tolist())) for k in uniform)
        report["one_process"] = {"bare_psycopg_keys_per_s": looked_up / bare_s,
                                 "sluice_keys_per_s": looked_up / sluice_s, "ratio": bare_s / sluice_s}

        zipf = [pa.record_batch({"id": pa.array(k)}) for k in keys_of(rng, args.rows, args.keys, args.batches, True)]
        off_s, _ = sluice_loop(server.url, zipf, "none")
        on_s, stats = sluice_loop(server.url, zipf, "partial")
        report["cache_zipf"] = {"seconds_off": off_s, "seconds_on": on_s, "speed_up": off_s / on_s,
                                "hit_rate": stats.hits / max(1, stats.hits + stats.misses),  # type: ignore[attr-defined]
                                "evictions": stats.evictions}  # type: ignore[attr-defined]
        if args.keys_high:
            report["concurrency"] = {"keys_per_batch": args.keys_high, **concurrency(server.url, high)}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
