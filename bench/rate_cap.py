"""The write's rate cap (sink.rate.records-per-second) against real stores: does a 5,000 rows/s cap hold with 2 and 4
tasks, and does the store's own throttling still work beneath it?

Run: `.venv/bin/python -m bench.rate_cap [--seconds 65] [--cap 5000]` (starts a throwaway PostgreSQL with
LocalPostgres and one Cassandra node with LocalCassandra, 512 MiB heap, for the run only; Spark local[4]).
Each case writes cap * seconds rows with sluice.write (which shares the cap evenly: sink.rate.tasks = min(the
DataFrame's partitions, Spark's default parallelism)) and reports rows / wall seconds of the write and its ratio to
the cap. Wall seconds include starting the write's tasks, and every task's bucket starts full (one second of its
share), so the ratio over a minute is a little under or over 1 for those two reasons alone.
- postgres / cassandra, 2 and 4 partitions (tasks), the cap set;
- cassandra_throttled: the same node's native-transport rate limiter (native_transport_max_requests_per_second,
  with throw_on_overload) lets through fewer requests than the cap asks for when every row is its own request
  (batch.grouping=none): the node refuses, the engine counts throttles, backs off and retries, and the rate is the
  node's, under the cap. The capped cases batch 100 rows of one partition per request, far under the limit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import uuid
from datetime import date

REQUESTS_PER_SECOND = 2000  # the Cassandra node's limit: under the cap when each row is a request


def run_case(spark, name: str, rows: int, partitions: int, cap: int, fmt: str, options: dict[str, str]) -> dict:
    import sluice

    df = spark.range(0, rows, 1, partitions).selectExpr(
        "CAST(id DIV 100 AS INT) AS pk", "CAST(id % 100 AS INT) AS ck", "concat('value-', id) AS v")
    began = time.monotonic()
    sluice.write(df, fmt, {**options, "sink.rate.records-per-second": str(cap)})
    seconds = time.monotonic() - began
    summary = sluice.last_write_summary(fmt)
    assert summary is not None, f"no summary of the {fmt} write"
    rate = rows / seconds
    return {"case": name, "tasks": partitions, "rows": rows, "seconds": round(seconds, 2),
            "rows_per_s": round(rate), "ratio_to_cap": round(rate / cap, 3),
            "rate_wait_s": summary["rate_wait_s"], "throttles": summary["throttles"], "retries": summary["retries"],
            "records": summary["records"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=65.0, help="each capped case's length at the cap")
    parser.add_argument("--throttled-seconds", type=float, default=20.0, help="the throttled case's rows, in seconds "
                        "at the node's limit")
    parser.add_argument("--cap", type=int, default=5000)
    args = parser.parse_args()

    import psycopg

    import sluice
    from sluice.testing import LocalCassandra, LocalPostgres

    rows = int(args.cap * args.seconds)
    results = []
    settings: dict[str, str | int | bool] = {"native_transport_rate_limiting_enabled": True,
                                             "native_transport_max_requests_per_second": REQUESTS_PER_SECOND,
                                             "native_transport_throw_on_overload": True}
    spark = sluice.session("bench-rate-cap", master="local[4]", **{"spark.sql.shuffle.partitions": "4"})
    with LocalPostgres() as pg:
        def pg_table() -> str:
            name = f"r_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(pg.url, autocommit=True) as c:
                c.execute(f"CREATE TABLE {name} (pk int, ck int, v text)")
            return name

        # Untimed: starts Spark's Python workers, which the first case would otherwise pay for.
        sluice.write(spark.range(1000).selectExpr("CAST(id AS INT) AS pk", "0 AS ck", "'w' AS v"), "postgres",
                     {"url": pg.url, "table": pg_table()})
        for tasks in (2, 4):
            results.append(run_case(spark, "postgres", rows, tasks, args.cap, "postgres",
                                    {"url": pg.url, "table": pg_table()}))
            print(json.dumps(results[-1]), flush=True)
    with LocalCassandra(settings=settings) as server, server.cluster() as cluster:
        session = cluster.connect()
        session.execute("CREATE KEYSPACE rate WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")

        def cass_table() -> dict[str, str]:
            name = f"r_{uuid.uuid4().hex[:8]}"
            session.execute(f"CREATE TABLE rate.{name} (pk int, ck int, v text, PRIMARY KEY ((pk), ck))")
            return {"host": server.host, "port": str(server.port), "keyspace": "rate", "table": name}

        for tasks in (2, 4):
            results.append(run_case(spark, "cassandra", rows, tasks, args.cap, "cassandra", cass_table()))
            print(json.dumps(results[-1]), flush=True)
        throttled_rows = int(REQUESTS_PER_SECOND * args.throttled_seconds)
        results.append(run_case(spark, "cassandra_throttled", throttled_rows, 2, args.cap, "cassandra",
                                {**cass_table(), "batch.grouping": "none", "sink.max-retries": "50",
                                 "sink.retry-delay-ms": "100"}))
        print(json.dumps(results[-1]), flush=True)
    spark.stop()
    print(json.dumps({"bench": "rate_cap", "date": date.today().isoformat(), "cap_rows_per_s": args.cap,
                      "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
                      "node_requests_per_s": REQUESTS_PER_SECOND, "results": results}, indent=2))


if __name__ == "__main__":
    main()
