"""A streaming job with bad records in a million keeps running (errors.tolerance=all), and what finding them costs.

Run: `.venv/bin/python -m bench.dead_letters [--rows 1000000] [--batches 10]` (starts a throwaway PostgreSQL with
LocalPostgres; Spark local[2]). A streaming query reads --rows ids from --batches Parquet files, one file a micro-batch
(maxFilesPerTrigger=1, Trigger.AvailableNow), and writes them to a PostgreSQL table with a CHECK constraint,
exactly-once (global-ordered, sink.transactional=true; --at-least-once: unordered COPY), dead letters to a
table-store table in a temporary warehouse. Cases, each a new table and query, in one run:
- clean: no bad record, errors.tolerance=none (the write as it was);
- tolerant-clean: no bad record, errors.tolerance=all (the route is planned, nothing refused);
- one-bad: one row violating the CHECK, errors.tolerance=all;
- ten-bad: ten rows violating it, spread over the micro-batches;
- one-bad-none: the one bad row with errors.tolerance=none: the query fails (its micro-batch commits nothing).
For each: seconds from start to the query's end (or its failure), micro-batches run, rows in the table, dead
letters, and the time relative to clean. A warm-up case runs first and is not shown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import uuid
from datetime import date


def run_case(spark, pg, source: str, warehouse: str, meta: str, name: str, rows: int, bad: list[int],
             tolerant: bool, exactly_once: bool) -> dict:
    import psycopg

    import sluice

    table = f"bench_{name.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
    letters = f"letters_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint, v bigint CHECK (v >= 0))")
    bad_sql = ", ".join(str(b) for b in bad) or "-1"
    stream = (spark.readStream.schema("id BIGINT").option("maxFilesPerTrigger", 1).parquet(source)
              .selectExpr("id", f"CASE WHEN id IN ({bad_sql}) THEN -1 ELSE id END AS v"))
    writer = (stream.writeStream.format("postgres").option("url", pg.url).option("table", table)
              .option("checkpointLocation", tempfile.mkdtemp(prefix="sluice-bench-dl-")).trigger(availableNow=True))
    if exactly_once:
        writer = writer.option("sink.mode", "global-ordered").option("sink.transactional", "true")
    if tolerant:
        writer = (writer.option("errors.tolerance", "all").option("errors.deadletter.format", "tablestore")
                  .option("errors.deadletter.table", letters).option("errors.deadletter.warehouse", warehouse)
                  .option("errors.deadletter.meta", meta))
    began = time.monotonic()
    query = writer.start()
    failed = None
    try:
        query.awaitTermination()
    except Exception as e:  # the case without tolerance: the failure is the result
        lines = str(e).strip().splitlines()
        failed = next((line.strip() for line in lines if "refused" in line), lines[0])[:160]
    seconds = time.monotonic() - began
    batches_run = len(query.recentProgress)
    with psycopg.connect(pg.url) as conn:
        stored = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    dead = 0
    if tolerant:
        try:
            dead = spark.read.format("tablestore").option("table", letters).option("warehouse", warehouse) \
                .option("meta", meta).load().count()
        except Exception as e:  # no dead letter written: the table was never made
            if "not found" not in str(e).lower() and "does not exist" not in str(e).lower():
                raise
    summary = sluice.last_write_summary("postgres") or {}
    return {"case": name, "rows": rows, "bad": len(bad), "seconds": round(seconds, 2), "stored": stored,
            "dead_letters": dead, "summary_dead_letters": summary.get("dead_letters"), "micro_batches": batches_run,
            "failed": failed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--at-least-once", action="store_true", help="unordered COPY writes instead of exactly-once")
    args = parser.parse_args()

    import sluice
    from sluice.testing import LocalPostgres

    rows, batches = args.rows, args.batches
    spark = sluice.session(master="local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    one = [rows // 2 + 7]
    ten = [i * (rows // 10) + 3 for i in range(10)]
    results = []
    with LocalPostgres() as pg, tempfile.TemporaryDirectory(prefix="sluice-bench-dl-") as scratch:
        warehouse, meta = os.path.join(scratch, "warehouse"), os.path.join(scratch, "meta.db")
        source = os.path.join(scratch, "input")
        # One file per micro-batch (maxFilesPerTrigger=1), ids in order: a finite stream, run with AvailableNow.
        spark.range(0, rows, 1, batches).write.parquet(source)
        run_case(spark, pg, source, warehouse, meta, "warm-up", rows, [], True, not args.at_least_once)
        for name, bad, tolerant in (("clean", [], False), ("tolerant-clean", [], True), ("one-bad", one, True),
                                    ("ten-bad", ten, True), ("one-bad-none", one, False)):
            results.append(run_case(spark, pg, source, warehouse, meta, name, rows, bad, tolerant,
                                    not args.at_least_once))
            print(json.dumps(results[-1]), flush=True)
    base = results[0]["seconds"]
    print(f"\n{date.today()} {platform.machine()} {os.cpu_count()} cores, pyspark {spark.version}, {rows:,} rows in "
          f"{batches} micro-batches\n")
    print("| case | bad rows | seconds | vs clean | micro-batches | in the table | dead letters | failed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        print(f"| {r['case']} | {r['bad']} | {r['seconds']} | {r['seconds'] / base:.2f} | {r['micro_batches']} | "
              f"{r['stored']:,} | {r['dead_letters']} | {r['failed'] or '-'} |")


if __name__ == "__main__":
    main()
