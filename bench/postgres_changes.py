"""Change capture benchmark: changes/s of format("postgres_changes") end to end vs the bare fetch of the same changes.

Run: `.venv/bin/python bench/postgres_changes.py [--changes 1000000] [--rounds 3]` (starts a throwaway PostgreSQL
with wal_level=logical). Narrow rows (id bigint primary key, v bigint, s text of 8 characters), inserted in
transactions of 1,000 rows, then updated the same way (half the changes are updates). One slot per Spark round,
all created before the changes, so every contender reads exactly the same changes:
- fetch: one Python process, `SELECT data FROM pg_logical_slot_peek_binary_changes(...)` over ADBC into one
  Arrow binary column: the server decoding the WAL and sending pgoutput messages, nothing else (the limit);
- decode: the same fetch plus sluice's decoding into typed Arrow rows, one process, no Spark;
- spark: `spark.readStream.format("postgres_changes")` with Trigger.AvailableNow into `sluice_null` (local[2]),
  wall time from start() to the end of the query (its start included);
- spark in micro-batches: the same run's changes over the sum of its micro-batches' triggerExecution (what Spark
  reports as processedRowsPerSecond; what a long-running query sustains, without the query's one-off start).
- spark floor: the same number of rows of the same schema, ready-made (one 65,536-row Arrow batch built once and
  yielded over and over) by a minimal Python streaming source into `sluice_null`, in micro-batches: what Spark's
  hand-over from a Python source to a Python sink costs with no fetch and no decoding, the bound on any source.
decode and spark run once with `fetch-ranges` 1 (one fetch of the whole batch) and once with the default, 2 (the
second half fetched from a copy of the slot while the first is decoded), alternating within each round.
Each figure is the best of --rounds.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from datetime import date

import psycopg

PUBLICATION = "bench_pub"
PHASES: list = []  # Spark's durationMs of each micro-batch of each round
RANGES = (1, 2)  # fetch-ranges: one fetch of the whole batch; the default


def generate(url: str, changes: int) -> None:
    rows = changes // 2
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(0, rows, 1000):
            conn.execute("INSERT INTO narrow SELECT g, g * 2, md5(g::text)::char(8) "
                         "FROM generate_series(%s::bigint, %s::bigint) g", (lo, min(lo + 999, rows - 1)))
        for lo in range(0, rows, 1000):
            conn.execute("UPDATE narrow SET v = v + 1 WHERE id BETWEEN %s::bigint AND %s::bigint",
                         (lo, min(lo + 999, rows - 1)))
        conn.execute("SET synchronous_commit = on")
        conn.execute("CREATE TEMP TABLE flush_marker (x int)")  # a synchronous commit flushes everything before it


def fetch(url: str, slot: str) -> tuple[float, int]:
    import adbc_driver_postgresql.dbapi as adbc

    start = time.perf_counter()
    with adbc.connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT data FROM pg_logical_slot_peek_binary_changes('{slot}', NULL, NULL, 'proto_version', "
                    f"'1', 'publication_names', '{PUBLICATION}')")
        table = cur.fetch_arrow_table()
    return time.perf_counter() - start, table.num_rows


def decode(url: str, slot: str, ranges: int) -> tuple[float, int]:
    from sluice.connectors.postgres import PostgresChangesDataSource

    source = PostgresChangesDataSource({"url": url, "table": "narrow", "slot": slot, "publication": PUBLICATION,
                                        "snapshot": "false", "fetch-ranges": str(ranges)})
    reader = source.streamReader(source.schema())
    start_offset = reader.initialOffset()
    start = time.perf_counter()
    end = reader.latestOffset(start_offset, reader.getDefaultReadLimit())
    rows = sum(b.num_rows for p in reader.partitions(start_offset, end) for b in reader.read(p))
    return time.perf_counter() - start, rows


def spark_run(spark, url: str, slot: str, ranges: int) -> tuple[float, float, int]:
    df = (spark.readStream.format("postgres_changes")
          .options(url=url, table="narrow", slot=slot, publication=PUBLICATION, snapshot="false",
                   **{"fetch-ranges": str(ranges)}).load())
    with tempfile.TemporaryDirectory() as ck:
        start = time.perf_counter()
        q = df.writeStream.format("sluice_null").option("checkpointLocation", ck).trigger(availableNow=True).start()
        q.awaitTermination()
        elapsed = time.perf_counter() - start
        rows = sum(p["numInputRows"] for p in q.recentProgress)
        PHASES.append([p["durationMs"] for p in q.recentProgress])
        in_batches = sum(p["durationMs"]["triggerExecution"] for p in q.recentProgress if p["numInputRows"]) / 1000
    return elapsed, in_batches, rows


FLOOR_SCHEMA = ("id bigint, v bigint, s string, _op string, _lsn bigint, _commit_time timestamp, _xid bigint, "
                "_table string")


def floor_source(rows: int) -> type:
    """A streaming Python data source of `rows` ready-made change rows (one batch built once, yielded repeatedly)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class ReadyMadeReader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"rows": 0}

        def latestOffset(self, start: dict | None = None, limit: object = None) -> dict:
            return {"rows": rows}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(end["rows"] - start["rows"])] if end["rows"] > start["rows"] else []

        def read(self, partition: InputPartition):
            import numpy as np
            import pyarrow as pa
            import pyarrow.compute as pc

            n = 65_536
            ids = pa.array(np.arange(n, dtype=np.int64))
            batch = pa.RecordBatch.from_arrays([
                ids, pc.multiply(ids, 2), pc.cast(pc.add(ids, 10_000_000), pa.string()),
                pa.array(["insert"] * (n // 2) + ["update"] * (n - n // 2)), pc.divide(ids, 1000),
                pa.array(np.full(n, 1_700_000_000_000_000, np.int64)).cast(pa.timestamp("us", tz="UTC")),
                pc.divide(ids, 1000), pa.array(["public.narrow"] * n)],
                names=["id", "v", "s", "_op", "_lsn", "_commit_time", "_xid", "_table"])
            for first in range(0, partition.value, n):
                yield batch.slice(0, min(n, partition.value - first))

        def commit(self, end: dict) -> None:
            pass

    class ReadyMade(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_ready_made_changes"

        def schema(self) -> str:
            return FLOOR_SCHEMA

        def streamReader(self, schema: object) -> ReadyMadeReader:
            return ReadyMadeReader()

    return ReadyMade


def floor_run(spark, rows: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as ck:
        q = (spark.readStream.format("bench_ready_made_changes").load().writeStream.format("sluice_null")
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
        q.awaitTermination()
    done = [p for p in q.recentProgress if p["numInputRows"]]
    return sum(p["durationMs"]["triggerExecution"] for p in done) / 1000, sum(p["numInputRows"] for p in done)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import sluice
    from sluice.testing import LocalPostgres

    with LocalPostgres(settings={"wal_level": "logical", "max_replication_slots": "20",
                                 "max_wal_size": "4GB"}) as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE narrow (id bigint PRIMARY KEY, v bigint, s text)")
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE narrow")
            slots = [f"bench_{i}" for i in range(2 * args.rounds + 1)]
            for slot in slots:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        generate(pg.url, args.changes)
        results: dict[str, list[float]] = {"fetch": []}
        counts: dict[str, int] = {}
        for _ in range(args.rounds):
            seconds, counts["fetch"] = fetch(pg.url, slots[0])
            results["fetch"].append(round(seconds, 3))
            for ranges in RANGES:
                seconds, counts[f"decode_r{ranges}"] = decode(pg.url, slots[0], ranges)
                results.setdefault(f"decode_r{ranges}", []).append(round(seconds, 3))
        spark = sluice.session("bench-postgres-changes")
        spark.dataSource.register(floor_source(args.changes))
        real_schema = (spark.readStream.format("postgres_changes")
                       .options(url=pg.url, table="narrow", slot=slots[0], publication=PUBLICATION).load().schema)
        assert real_schema.simpleString() == f"struct<{FLOOR_SCHEMA.replace(' ', ':').replace(',:', ',')}>", \
            real_schema.simpleString()
        for i in range(args.rounds):
            for j, ranges in enumerate(RANGES):
                seconds, in_batches, n = spark_run(spark, pg.url, slots[1 + 2 * i + j], ranges)
                results.setdefault(f"spark_r{ranges}", []).append(round(seconds, 3))
                results.setdefault(f"spark_in_micro_batches_r{ranges}", []).append(round(in_batches, 3))
                counts[f"spark_r{ranges}"] = n
            seconds, counts["spark_floor"] = floor_run(spark, args.changes)
            results.setdefault("spark_floor_in_micro_batches", []).append(round(seconds, 3))
        spark.stop()
    best = {name: min(runs) for name, runs in results.items()}
    out = {
        "date": str(date.today()), "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "changes": args.changes, "rows_read": counts, "seconds_every_round": results,
        "changes_per_s": {name: round(args.changes / s) for name, s in best.items()},
        "vs_fetch": {name: round(best["fetch"] / s, 2) for name, s in best.items() if name != "fetch"},
        "spark_phases_ms": PHASES,
    }
    assert all(n == args.changes for name, n in counts.items() if name != "fetch"), counts
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
