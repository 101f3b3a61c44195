"""ClickHouse benchmark: sluice's append and read, before and after the move to Arrow, against ClickHouse's own
client and the store's limit, one run, one server.

Run: `.venv/bin/python -m bench.stores.clickhouse_write_read [--rows 2000000] [--rounds 2] [--before 6cec1cf]`. The
server is ClickHouse 26.9's engine (chdb-core) behind the tests' HTTP stand-in (tests/clickhouse_chdb/), started once
for every contender. Data: N narrow rows (id Int64, k Int32, v Float64, s String of ~12 bytes) into `MergeTree ORDER
BY id`; the DataFrame is cached in 2 partitions.
- sluice: `sluice.write(df, "clickhouse", ...)` end to end (ArrowStream INSERTs of 100,000 rows), and
  `spark.read.format("clickhouse")` (4 splits) into Spark's `noop` sink;
- sluice before: the same two, with the connector of commit --before (Native-encoded INSERTs, CSV reads), run from
  a git worktree in a child process against the same server;
- clickhouse-connect: ClickHouse's Python client in one process, `insert_arrow` of the same Arrow rows in slices
  of 100,000 and `query_arrow` of the table (compress=False and uncompressed Arrow output: loopback, as sluice);
- limit: one process encoding the same Arrow slices as ArrowStream bodies (as the sink does) and POSTing them
  through sluice's client, and reading `FORMAT ArrowStream` through it: what the server takes and gives one client
  without Spark. The encoding is timed, as `insert_arrow`'s is, so the two clients are compared on the same work;
- floor: the same DataFrame into `sluice_null` (Spark's hand-over of rows to Python workers, no store), in each
  Spark session (the checkout's and --before's), so each write is also seen against its own session's floor.
Each figure is rows per second, the best of --rounds; with the CPU seconds of each component.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import uuid
from datetime import date

from bench.checkouts import ROOT, child_env, module_command, remove_worktree, worktree
from bench.cpu import clocked

COLUMNS = "id Int64, k Int32, v Float64, s String"
BATCH = 100_000
CHILD_PASSWORD = "SLUICE_BENCH_CLICKHOUSE_PASSWORD"  # the server's password, handed to the --before child


def sluice_runs(url: str, password: str, rows: int, rounds: int, fresh) -> dict[str, list]:
    """sluice's write and read with whichever sluice this process imports (the checkout, or --before's)."""
    import sluice

    spark = sluice.session("sluice-bench-clickhouse")
    df = spark.range(0, rows, 1, 2).selectExpr("id", "CAST(id % 1000 AS INT) AS k", "CAST(id AS DOUBLE) * 0.25 AS v",
                                               "concat('name-', CAST(id AS STRING)) AS s").cache()
    df.count()
    runs: dict[str, list] = {"write": [], "read": [], "floor": []}
    for _ in range(rounds):
        table = fresh()
        opts = {"url": url, "password": password, "table": table}
        runs["write"].append(clocked(lambda o=opts: sluice.write(df, "clickhouse", o)))
        read = spark.read.format("clickhouse").options(**opts).load()
        runs["read"].append(clocked(lambda r=read: r.write.format("noop").mode("overwrite").save()))
        runs["floor"].append(clocked(lambda: sluice.write(df, "sluice_null", {})))
    spark.stop()
    return runs


def client_runs(url: str, password: str, rows: int, rounds: int, fresh, count) -> dict[str, list]:
    """One process, no Spark: ClickHouse's own client, and sluice's client (the limit), each encoding the same Arrow
    slices inside its timed part."""
    import clickhouse_connect
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from sluice.connectors.clickhouse._client import Connection
    from sluice.connectors.clickhouse._options import WRITE_SPEC

    ids = np.arange(rows, dtype=np.int64)
    arrow = pa.table({"id": ids, "k": (ids % 1000).astype(np.int32), "v": ids * 0.25,
                      "s": pc.binary_join_element_wise("name-", pa.array(ids).cast(pa.string()), "")})
    slices = [arrow.slice(i, BATCH) for i in range(0, rows, BATCH)]

    def post_all(conn, insert: str) -> None:
        for piece in slices:  # each body encoded as the sink's InsertPlan.body does, then POSTed
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, piece.schema) as writer:
                writer.write_table(piece)
            conn.request(insert, body=sink.getvalue().to_pybytes())

    host, port = url.removeprefix("http://").split(":")
    client = clickhouse_connect.get_client(host=host, port=int(port), username="default", password=password,
                                           autogenerate_session_id=False, compress=False)
    uncompressed = {"output_format_arrow_compression_method": "none"}
    runs: dict[str, list] = {"cc_insert": [], "cc_query": [], "limit_insert": [], "limit_read": []}
    for _ in range(rounds):
        table = fresh()
        runs["cc_insert"].append(clocked(lambda t=table: [client.insert_arrow(t, piece) for piece in slices]))
        count(table)
        select = f"SELECT * FROM {table}"
        runs["cc_query"].append(clocked(lambda q=select: client.query_arrow(q, settings=uncompressed)))
        table = fresh()
        conn = Connection.from_options(WRITE_SPEC.parse({"url": url, "password": password, "table": table}))
        insert = f"INSERT INTO {table} FORMAT ArrowStream"
        runs["limit_insert"].append(clocked(lambda c=conn, i=insert: post_all(c, i)))
        count(table)
        select = f"SELECT * FROM {table}"
        runs["limit_read"].append(clocked(lambda c=conn, q=select: sum(b.num_rows for b in c.arrow_batches(q))))
    client.close()
    return runs


def before_runs(rev: str, url: str, password: str, rows: int, rounds: int) -> dict[str, list]:
    """sluice at `rev`, from a git worktree, in a child process (its Spark workers import that sluice too)."""
    tree, importable = worktree(rev)
    try:
        env = {**child_env(importable), CHILD_PASSWORD: password}  # never on a command line (`ps`)
        out = subprocess.run(module_command("bench.stores.clickhouse_write_read", "--child", url, "--rows", str(rows),
                                            "--rounds", str(rounds)), env=env, cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:  # its output was captured: show why it failed
            raise RuntimeError(f"the --before {rev} run exited with {out.returncode}:\n{out.stderr[-4000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        remove_worktree(tree)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before", default="6cec1cf", help="the commit whose connector is 'sluice before'")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)  # run sluice's contenders only
    args = parser.parse_args()
    if args.child:
        from sluice.testing._clickhouse import ClickHouseHTTP

        password = os.environ[CHILD_PASSWORD]
        server = ClickHouseHTTP(password=password)
        server.port = int(args.child.rsplit(":", 1)[1])
        print(json.dumps(sluice_runs(args.child, password, args.rows, args.rounds, fresh_table(server))))
        return 0

    from tests.clickhouse_chdb import ChdbClickHouse

    with ChdbClickHouse() as ch:
        fresh = fresh_table(ch)

        def count(table: str) -> None:
            assert ch.rows(f"SELECT count() FROM {table}") == [[str(args.rows)]]

        runs = {f"sluice_{k}": v for k, v in sluice_runs(ch.url, ch.password, args.rows, args.rounds, fresh).items()}
        runs.update(client_runs(ch.url, ch.password, args.rows, args.rounds, fresh, count))
        # Last: a finished child's CPU shows up in the counters of the processes that waited for it.
        runs.update({f"before_{k}": v for k, v in before_runs(args.before, ch.url, ch.password, args.rows,
                                                               args.rounds).items()})
        version = ch.rows("SELECT version()")[0][0]
    results = {}
    for name, measured in runs.items():
        seconds, cpu = min(measured, key=lambda r: r[0])
        results[name] = {"seconds": round(seconds, 3), "rows_per_s": round(args.rows / seconds), "cpu_s": cpu}
    rate = {name: r["rows_per_s"] for name, r in results.items()}
    print(json.dumps({
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "clickhouse": f"{version} (chdb-core behind tests/clickhouse_chdb)", "rows": args.rows, "results": results,
        "ratios": {"write_after_vs_before": round(rate["sluice_write"] / rate["before_write"], 2),
                   "read_after_vs_before": round(rate["sluice_read"] / rate["before_read"], 2),
                   "write_vs_clickhouse_connect": round(rate["sluice_write"] / rate["cc_insert"], 2),
                   "read_vs_clickhouse_connect": round(rate["sluice_read"] / rate["cc_query"], 2),
                   "write_vs_limit": round(rate["sluice_write"] / rate["limit_insert"], 2),
                   "read_vs_limit": round(rate["sluice_read"] / rate["limit_read"], 2),
                   "write_vs_floor": round(rate["sluice_write"] / rate["sluice_floor"], 2),
                   "before_write_vs_its_floor": round(rate["before_write"] / rate["before_floor"], 2)},
    }, indent=2))
    return 0


def fresh_table(server):
    def fresh() -> str:
        name = f"b_{uuid.uuid4().hex[:8]}"
        server.sql(f"CREATE TABLE {name} ({COLUMNS}) ENGINE = MergeTree() ORDER BY id")
        return name

    return fresh


if __name__ == "__main__":
    raise SystemExit(main())
