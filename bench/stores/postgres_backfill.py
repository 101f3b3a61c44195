"""Snapshots on demand under load: a 1M-row table added to a running change stream while a writer makes 1,000
changes/s, read in chunks between its changes; then the replica is compared with the source.

Run: `.venv/bin/python -m bench.stores.postgres_backfill [--rows 1000000] [--rate 1000] [--chunk 50000]` (starts a
throwaway PostgreSQL with wal_level=logical). No Spark: the stream reader is driven as Spark's micro-batch loop drives
it (latestOffset, partitions, read, commit; tests/connectors/postgres/test_changes_backfill.py does the same), and
every batch is applied to an in-memory replica keyed by id as an upsert sink applies it. Two runs on the same
server, one after the other, with the same writer (rows id bigint primary key, n bigint, s text of 8 characters;
70% updates, 20% inserts, 10% deletes, in transactions of 10 changes, paced to --rate):
- backfill: the table joins the publication and the restarted stream reads its rows (snapshot.new-tables), until
  the last chunk is committed;
- changes only: the same for as long, with snapshot.new-tables=none (the freshness the chunks are measured against).
Printed: the chunks' rows/s, each run's change lag (commit to the end of the micro-batch that read it) p50/p99, the
micro-batches, and whether the replica equals the source (backfill run).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

import psycopg
import pyarrow as pa

from sluice.connectors.postgres import PostgresChangesDataSource
from sluice.spark._compat import to_arrow_schema
from sluice.testing import LocalPostgres


def run_sql(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


class Writer(threading.Thread):
    def __init__(self, url: str, table: str, first_new: int, rate: int) -> None:
        super().__init__(daemon=True)
        self.url, self.table, self.next_id, self.rate = url, table, first_new, rate
        self.stop = threading.Event()
        self.changes = 0

    def run(self) -> None:
        rng = random.Random(11)
        began = time.monotonic()
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                with conn.transaction():
                    for _ in range(10):
                        step, k = rng.random(), rng.randrange(self.next_id)
                        if step < 0.7:
                            conn.execute(f"UPDATE {self.table} SET n = n + 1 WHERE id = %s", (k,))
                        elif step < 0.9:
                            conn.execute(f"INSERT INTO {self.table} VALUES (%s, 0, 'new')", (self.next_id,))
                            self.next_id += 1
                        else:
                            conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (k,))
                self.changes += 10
                pause = began + self.changes / self.rate - time.monotonic()  # paced: a load, not a sync point
                if pause > 0:
                    time.sleep(pause)


def apply(replica: dict[int, tuple[int, str]], rows: pa.Table, table: str) -> None:
    for r in rows.select(["id", "n", "s", "_op", "_table"]).to_pylist():
        if r["_table"] != table:
            continue
        if r["_op"] == "delete":
            replica.pop(r["id"], None)
        else:
            replica[r["id"]] = (r["n"], r["s"])


def stream_run(url: str, table: str, rows: int, rate: int, chunk: int, new_tables: str, seconds: float | None
               ) -> dict[str, float]:
    run_sql(url, f"DROP TABLE IF EXISTS {table}", f"DROP PUBLICATION IF EXISTS {table}_pub",
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, n bigint, s text)",
            f"INSERT INTO {table} SELECT g, 0, 'abcdefgh' FROM generate_series(0, {rows - 1}) g",
            f"CREATE TABLE {table}_other (id bigint PRIMARY KEY)", f"CREATE PUBLICATION {table}_pub FOR TABLE "
            f"{table}_other")
    options = {"url": url, "publication": f"{table}_pub", "slot": f"{table}_slot", "snapshot": "false",
               "snapshot.chunk-size": str(chunk), "snapshot.new-tables": new_tables}
    first = PostgresChangesDataSource(options)
    reader = first.streamReader(first.schema())
    at = reader.initialOffset()
    reader.stop()
    run_sql(url, f"ALTER PUBLICATION {table}_pub ADD TABLE {table}")
    source = PostgresChangesDataSource(options)
    reader = source.streamReader(source.schema())
    schema = to_arrow_schema(reader.schema)
    writer = Writer(url, table, rows, rate)
    writer.start()
    replica: dict[int, tuple[int, str]] = {}
    lags: list[float] = []
    batches = read_rows = 0
    began = time.monotonic()
    read_seconds = 0.0
    while True:
        end = reader.latestOffset(at, reader.getDefaultReadLimit())
        if end == at:
            if seconds is not None and time.monotonic() - began > seconds:
                break
            continue
        t0 = time.monotonic()
        got = [b for p in reader.partitions(at, end) for b in reader.read(p)]
        out = pa.Table.from_batches(got, schema=schema) if got else schema.empty_table()
        done = time.time()
        reads = out.column("_op").to_pylist().count("read")
        if reads:
            read_seconds += time.monotonic() - t0
        read_rows += reads
        lags += [done - t.timestamp() for t, op in zip(out.column("_commit_time").to_pylist(),
                                                       out.column("_op").to_pylist(), strict=True) if op != "read"]
        if new_tables == "incremental":
            apply(replica, out, f"public.{table}")
        reader.commit(end)
        at = end
        batches += 1
        if seconds is None and not end.get("backfill", {}).get("queue") and not end.get("backfill", {}).get("chunk"):
            break
    elapsed = time.monotonic() - began
    writer.stop.set()
    writer.join()
    equal = None
    if new_tables == "incremental":  # drain the writer's last changes, then compare
        while (end := reader.latestOffset(at, reader.getDefaultReadLimit())) != at:
            got = [b for p in reader.partitions(at, end) for b in reader.read(p)]
            apply(replica, pa.Table.from_batches(got, schema=schema) if got else schema.empty_table(),
                  f"public.{table}")
            reader.commit(end)
            at = end
        with psycopg.connect(url) as conn:
            source_rows = {i: (n, s) for i, n, s in conn.execute(f"SELECT id, n, s FROM {table}")}
        equal = float(replica == source_rows)
    reader.stop()
    lags.sort()
    return {"seconds": elapsed, "batches": batches, "read_rows": read_rows, "changes": writer.changes,
            "read_rows_per_s": read_rows / read_seconds if read_seconds else 0.0,
            "lag_p50_ms": 1000 * statistics.median(lags) if lags else 0.0,
            "lag_p99_ms": 1000 * lags[int(0.99 * (len(lags) - 1))] if lags else 0.0, "equal": equal or 0.0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=1_000)
    ap.add_argument("--chunk", type=int, default=50_000)
    args = ap.parse_args()
    with LocalPostgres(settings={"wal_level": "logical", "synchronous_commit": "on"}) as server:
        backfill = stream_run(server.url, "bf", args.rows, args.rate, args.chunk, "incremental", None)
        plain = stream_run(server.url, "plain", args.rows, args.rate, args.chunk, "none", backfill["seconds"])
    print(f"{args.rows:,} rows added under {args.rate:,} changes/s, chunks of {args.chunk:,}")
    print("| run | seconds | micro-batches | changes | chunk rows read | chunk rows/s | change lag p50 (ms) | "
          "p99 (ms) | replica = source |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, r in (("backfill", backfill), ("changes only", plain)):
        same = ("yes" if r["equal"] else "NO") if name == "backfill" else "-"
        print(f"| {name} | {r['seconds']:.1f} | {r['batches']:.0f} | {r['changes']:,.0f} | {r['read_rows']:,.0f} | "
              f"{r['read_rows_per_s']:,.0f} | {r['lag_p50_ms']:.0f} | {r['lag_p99_ms']:.0f} | {same} |")


if __name__ == "__main__":
    main()
