"""HBase benchmark: sluice's `format("hbase")` sink (2 Spark tasks) against the Thrift client's own batch write in
one Python process, one run, the same server; and why hbase-spark is not in it.

Run: `.venv/bin/python -m bench.stores.hbase_write [--rows 500000] [--rounds 3] [--regions 4] [--warmup-rows ROWS]
[--only A,B] [--profile]` (500,000 rows: ~25 s a contender on 2 cores).
The server is one standalone HBase 2.6 (`sluice.testing.LocalHBase`, `make check-hbase` fetches it: master, region
server and ZooKeeper in one JVM with a 2 GiB heap, its Thrift2 gateway in a second JVM with 512 MiB, both with their
optimizing compiler on (full_jit: the test harness runs them on C1 alone). Data: rows (id long, region string of 10
values, title string of 53 bytes, amount double, qty int) in a DataFrame cached in 2 partitions; row key: id, as
sluice encodes a long (8 bytes big-endian, sign bit flipped); every other column a cell of family d, its value as
HBase's `Bytes.toBytes` writes it (UTF-8, 8-byte big-endian double, 4-byte big-endian int): 105 bytes of key,
families, qualifiers and values a row ("data" in MB/s). Each contender writes into a fresh table, pre-split into
--regions regions of equal id ranges (one family d, the defaults otherwise: WAL on), which is checked afterwards
(every row there: a key-only scan; 1,000 sampled rows hold exactly the expected cells) and then dropped, so every
contender meets the same server. Contenders:
- sluice: `sluice.write(df, "hbase", {host, port, table, rowkey: id, family: d})` with its defaults (partition-ordered
  by the row key: a shuffle by id first; batches of one region each, at most 1,000 rows or 4 MiB, one batch a region
  in flight, sink.requests.max-inflight 16, 2,000 entries buffered a task; every cell with its timestamp), 2 Spark
  tasks (local[2]);
- sluice_batch_5000: the same with sink.batch.max-size 5000 and sink.requests.max-buffered 20000 (which must exceed
  it): fewer, larger putMultiple calls;
- python_putmultiple: what a user writes by hand in one process: a thriftpy2 client of the gateway (make_client's
  defaults: the Cython binary protocol and buffered transport, as sluice's), each 1,000 rows of the same rows made
  into TPut objects (the same key and cell bytes, no timestamps: the server's clock) and sent with one putMultiple,
  one call at a time. Its input is the DataFrame collected to this process as a pyarrow Table before the timing; the
  timing includes converting it (Arrow columns to Python values to TPut), shown apart as convert_s next to call_s
  (the putMultiple calls: serializing, the gateway and the region server);
- floor: the same DataFrame into `sluice_null` (Spark's hand-over of rows to Python workers, no store).
hbase-spark (org.apache.hbase.connectors.spark:hbase-spark, Maven Central) is not run: the script reads the Scala and
Spark versions its newest release was built for from its parent pom on Maven Central and prints them next to this
pyspark's; its 1.0.1 is built for Spark 3.3.2 on Scala 2.12 (1.0.0: Spark 2.4.0, Scala 2.11), and pyspark 4 runs on
Scala 2.13, whose binaries a Scala 2.12 jar does not link against. No release for Spark 4 exists.
Each round runs every contender once, starting one contender later than the round before (so none always comes
first). Each figure is rows per second, the best of --rounds; sluice's with the engine's per-request latency of that
round (p50/p99, submit to acknowledgement), its requests, and what closed them (flush_reasons); every contender's with
the CPU seconds of each component of this process's own tree ("hbase": the server's JVM, "hbase_thrift": the
gateway's, counted apart from spark_jvm, which _cpu.py would lump them in with, all being `java`; bench_process: this
process, where the Python client runs). Before the rounds, untimed, --warmup-rows rows go through sluice and through
the Python client (each into a table dropped afterwards): Spark's Python workers started, the client's modules
imported, and the server's and gateway's hot code compiled, which the first contender would otherwise pay for.
`--profile` runs no contenders but one task's share of the rows in this process, to show where a task's time goes:
RowEncoder alone (with and without Python's cyclic GC, and under cProfile), the whole task against the server as
sluice runs it and with single changes (GC off, a larger Thrift transport buffer, a prototype that builds each put as
Thrift bytes in Arrow), and the hand-written writer on the same rows (see profile()).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import statistics
import struct
import sys
import time
import urllib.request
import uuid
from contextlib import ExitStack
from datetime import date

from bench.contenders import best_rounds, rotate, write_details
from bench.cpu import clocked_tree, rss_mib, stdout_to_stderr
from bench.measures import percentile

FAMILY = b"d"
CELLS = ("region", "title", "amount", "qty")  # the non-key columns, each a cell d:<name>
CLIENT_BATCH = 1000  # rows per putMultiple of the hand-written writer
SAMPLE = 1000  # rows of each table compared cell by cell
HBASE_SPARK = "org.apache.hbase.connectors.spark:hbase-spark"
MAVEN = "https://repo1.maven.org/maven2"
SIGN = 1 << 63


def row_key(i: int) -> bytes:
    """sluice's key of a long: big-endian, sign bit flipped (so negative ids sort first)."""
    return (i ^ SIGN).to_bytes(8, "big") if i >= 0 else (i + SIGN).to_bytes(8, "big")


def expected_cells(i: int) -> dict[bytes, bytes]:
    """The cells of row `i`, as the DataFrame below makes it and Bytes.toBytes writes its values."""
    import struct

    return {b"region": f"region-{i % 10}".encode(),
            b"title": f"Order {i:012d} shipped to warehouse {i % 10}, priority {i % 7}".encode(),
            b"amount": struct.pack(">d", i * 0.25), b"qty": struct.pack(">i", i % 100)}


def hbase_spark_finding(scala: str, spark_version: str) -> dict[str, str]:
    """hbase-spark's newest release and the Spark/Scala versions its pom says it is built for (Maven Central),
    against this pyspark's. It is only ever reported, never run: see the docstring."""
    def get(path: str) -> str:
        with urllib.request.urlopen(f"{MAVEN}/{path}", timeout=30) as answer:
            return answer.read().decode()

    group, artifact = HBASE_SPARK.split(":")
    base = f"{group.replace('.', '/')}/{artifact}"
    try:
        version = re.search(r"<release>([^<]+)</release>", get(f"{base}/maven-metadata.xml")).group(1)
        pom = get(f"{base}/{version}/{artifact}-{version}.pom")
        parent = re.search(r"<parent>\s*<groupId>([^<]+)</groupId>\s*<artifactId>([^<]+)</artifactId>\s*"
                           r"<version>([^<]+)</version>", pom)
        pgroup, partifact, pversion = parent.groups()
        parent_pom = get(f"{pgroup.replace('.', '/')}/{partifact}/{pversion}/{partifact}-{pversion}.pom")
        props = {name: re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", parent_pom).group(1)
                 for name in ("scala.binary.version", "scala.version", "spark.version")}
    except Exception as e:  # offline: say so, rather than a figure
        return {"line": f"hbase-spark: not run; its pom could not be read from Maven Central ({e!r})"}
    ours = ".".join(scala.split(".")[:2])
    theirs = props["scala.binary.version"]
    verdict = (f"not run: a Scala {theirs} jar does not link against Scala {ours}'s library" if theirs != ours else
               "Scala versions match, but this script does not run it (see the docstring)")
    return {"artifact": f"{HBASE_SPARK}:{version}", "parent_pom": f"{pgroup}:{partifact}:{pversion}",
            "built_for": f"Spark {props['spark.version']}, Scala {props['scala.version']} ({theirs})",
            "this_spark": f"pyspark {spark_version}, Scala {scala} ({ours})",
            "line": f"hbase-spark {version}: built for Spark {props['spark.version']} / Scala {theirs} "
                    f"(scala.binary.version in {pgroup}:{partifact}:{pversion}'s pom); pyspark {spark_version} runs "
                    f"Scala {ours}: {verdict}"}


class Tables:
    """Fresh tables on the server, pre-split into the regions, each checked (every row there, a sample exactly as
    expected) and dropped after its write; and a write timed with the server's and gateway's CPU."""

    def __init__(self, server, rows: int, regions: int) -> None:
        from sluice.connectors.hbase._client import Connection, thrift

        self.server, self.t = server, thrift()
        self.splits = [row_key(rows * k // regions) for k in range(1, regions)]
        # Table calls through sluice's Connection: the gateway closes a link idle for 60 s (as during a write), and
        # Connection.call opens a new one then.
        self.conn = Connection((server.host,), server.port, 600.0)

    def call(self, method: str, *args):
        return self.conn.call(method, *args)

    def timed(self, action) -> tuple[float, dict[str, float]]:
        return clocked_tree(action, {self.server.pid: "hbase", self.server.gateway.pid: "hbase_thrift"})

    def fresh(self) -> str:
        t = self.t
        name = f"b_{uuid.uuid4().hex[:8]}"
        self.call("createTable", t.TTableDescriptor(tableName=t.TTableName(ns=b"default", qualifier=name.encode()),
                                                    columns=[t.TColumnFamilyDescriptor(name=FAMILY)]), self.splits)
        return f"default:{name}"

    def finish(self, table: str, rows: int) -> float:
        """Every row there (a key-only scan), a sample exactly as expected; then the table dropped. Returns the
        seconds of the scan."""
        t = self.t
        start = time.perf_counter()
        scan = t.TScan(caching=10_000, filterString=b"FirstKeyOnlyFilter() AND KeyOnlyFilter()")
        scanner = self.call("openScanner", table.encode(), scan)
        got = 0
        try:
            while results := self.call("getScannerRows", scanner, 10_000):
                got += len(results)
        finally:
            self.call("closeScanner", scanner)
        seconds = time.perf_counter() - start
        assert got == rows, (table, got, rows)
        sample = random.Random(rows).sample(range(rows), min(SAMPLE, rows))
        results = self.call("getMultiple", table.encode(), [t.TGet(row=row_key(i)) for i in sample])
        for i, result in zip(sample, results, strict=True):
            cells = {bytes(c.qualifier): bytes(c.value) for c in result.columnValues or ()}
            assert bytes(result.row) == row_key(i) and cells == expected_cells(i), (table, i, cells)
        self.drop(table)
        return round(seconds, 2)

    def drop(self, table: str) -> None:
        name = self.t.TTableName(ns=b"default", qualifier=table.partition(":")[2].encode())
        self.call("disableTable", name)
        self.call("deleteTable", name)


_PACK_DOUBLE, _PACK_INT = struct.Struct(">d").pack, struct.Struct(">i").pack


def client_puts(t, chunk) -> list:
    """The rows of an Arrow chunk as the Thrift client's TPut objects (`t`: the loaded hbase.thrift), by hand."""
    columns = [chunk.column(c).to_pylist() for c in ("id", *CELLS)]
    return [t.TPut(row=(i ^ SIGN).to_bytes(8, "big"), columnValues=[
        t.TColumnValue(family=b"d", qualifier=b"region", value=region.encode()),
        t.TColumnValue(family=b"d", qualifier=b"title", value=title.encode()),
        t.TColumnValue(family=b"d", qualifier=b"amount", value=_PACK_DOUBLE(amount)),
        t.TColumnValue(family=b"d", qualifier=b"qty", value=_PACK_INT(qty)),
    ]) for i, region, title, amount, qty in zip(*columns, strict=True)]


def python_putmultiple(server, table: str, rows) -> dict[str, float]:
    """The hand-written writer: TPuts of CLIENT_BATCH rows, one putMultiple at a time."""
    from thriftpy2.rpc import make_client

    from sluice.connectors.hbase._client import thrift

    t = thrift()
    client = make_client(t.THBaseService, server.host, server.port, timeout=600_000)
    name = table.encode()
    convert = call = 0.0
    latencies = []
    try:
        for start in range(0, rows.num_rows, CLIENT_BATCH):
            began = time.perf_counter()
            chunk = rows.slice(start, CLIENT_BATCH)
            puts = client_puts(t, chunk)
            sent = time.perf_counter()
            client.putMultiple(name, puts)
            done = time.perf_counter()
            convert += sent - began
            call += done - sent
            latencies.append(done - sent)
    finally:
        client.close()
    latencies.sort()
    return {"convert_s": round(convert, 2), "call_s": round(call, 2), "requests": len(latencies),
            "client_p50_ms": round(statistics.median(latencies) * 1000, 1),
            "client_p99_ms": round(percentile(latencies, 0.99) * 1000, 1)}


def orders(spark, rows: int):
    """The rows (id, region, title, amount, qty) in 2 partitions, cached and counted."""
    df = spark.range(rows).selectExpr(
        "id",
        "concat('region-', cast(id % 10 as string)) AS region",
        "format_string('Order %012d shipped to warehouse %d, priority %d', id, id % 10, id % 7) AS title",
        "cast(id AS double) * 0.25 AS amount",
        "cast(id % 100 as int) AS qty",
    ).repartition(2).cache()
    df.count()
    return df


def warm_up(tables: Tables, df, arrow, base: dict[str, str], warm_rows: int) -> None:
    """Both writers once on ids 0 .. warm_rows - 1, untimed (see the docstring)."""
    import pyarrow.compute as pc

    import sluice

    warm = tables.fresh()
    sluice.write(df.where(f"id < {warm_rows}"), "hbase", {**base, "table": warm})
    tables.finish(warm, warm_rows)
    warm = tables.fresh()
    python_putmultiple(tables.server, warm, arrow.filter(pc.less(arrow.column("id"), warm_rows)))
    tables.finish(warm, warm_rows)


def contend(tables: Tables, df, arrow, base: dict[str, str], rows: int, rounds: int,
            only: str | None) -> tuple[dict[str, list], dict[str, list[dict]]]:
    """Every contender once a round, each round starting one contender later: (name -> (seconds, CPU) per round,
    name -> its details per round)."""
    import sluice

    def run_sluice(name: str, extra: dict[str, str]) -> None:
        table = tables.fresh()
        opts = {**base, "table": table, **extra}
        runs[name].append(tables.timed(lambda: sluice.write(df, "hbase", opts)))
        details[name].append({**write_details(sluice.last_write_summary("hbase"), rows),
                              "check_scan_s": tables.finish(table, rows)})

    def run_python() -> None:
        table = tables.fresh()
        info: dict[str, float] = {}
        runs["python_putmultiple"].append(tables.timed(
            lambda: info.update(python_putmultiple(tables.server, table, arrow))))
        details["python_putmultiple"].append({**info, "check_scan_s": tables.finish(table, rows)})

    def run_floor() -> None:
        runs["floor"].append(tables.timed(lambda: sluice.write(df, "sluice_null", {})))
        details["floor"].append({})

    batch_5000 = {"sink.batch.max-size": "5000", "sink.requests.max-buffered": "20000"}
    contenders = {"sluice": lambda: run_sluice("sluice", {}),
                  "sluice_batch_5000": lambda: run_sluice("sluice_batch_5000", batch_5000),
                  "python_putmultiple": run_python, "floor": run_floor}
    if only:
        contenders = {name: contenders[name] for name in only.split(",")}
    runs: dict[str, list] = {name: [] for name in contenders}
    details: dict[str, list[dict]] = {name: [] for name in contenders}  # per round, as runs
    rotate(contenders, rounds)
    return runs, details


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--regions", type=int, default=4)
    parser.add_argument("--warmup-rows", type=int, default=None, help="rows of the untimed warm-up (default: --rows)")
    parser.add_argument("--only", default=None, help="comma-separated contenders to run (default: all)")
    parser.add_argument("--profile", action="store_true",
                        help="in place of the contenders: one task's share in this process (see the docstring)")
    args = parser.parse_args()
    if args.warmup_rows is None:
        args.warmup_rows = args.rows
    return args


def main() -> int:
    args = arguments()
    # SIGTERM unwinds like an exception, so that the server is stopped and its folder deleted (it runs in a session
    # of its own and would outlive this process).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    import thriftpy2

    import sluice
    from sluice.testing import LocalHBase
    from sluice.testing._hbase import HBASE_VERSION

    with ExitStack() as stack:
        server = stack.enter_context(LocalHBase(full_jit=True, heap="2g", gateway_heap="512m"))

        def on_failure(kind, error, traceback) -> bool:
            if kind is not None and issubclass(kind, Exception):  # before the server and its logs go
                print(f"--- HBase ({'running' if server.pid else 'NOT RUNNING'}):\n{server._log_tail()}\n"
                      f"--- gateway:\n{server.gateway._log_tail()}", file=sys.stderr)
            return False

        stack.push(on_failure)
        tables = Tables(server, args.rows, args.regions)
        stack.callback(tables.conn.forget)
        if args.profile:
            # It measured RowEncoder's TPut-object path against the Thrift-bytes prototype that is now _wire.py,
            # and reads TPut fields from the encoder's entries, which are bytes for puts now.
            raise SystemExit("--profile measured the TPut-object encoder that sluice/connectors/hbase/_wire.py "
                             "replaced (figures in docs/hbase.md); it does not run on the current encoder.")
        with stdout_to_stderr():
            spark = sluice.session("sluice-bench-hbase")
        df = orders(spark, args.rows)
        spark_version = spark.version
        scala = spark.sparkContext._jvm.scala.util.Properties.versionNumberString()
        # The hand-written writer's input: the same rows, collected before any timing.
        arrow = df.toArrow()
        data_bytes = 8 + sum(len(FAMILY) + len(q) + len(v) for q, v in expected_cells(1).items())
        base = {"host": server.host, "port": str(server.port), "rowkey": "id", "family": "d"}
        warm_up(tables, df, arrow, base, min(args.warmup_rows, args.rows))
        runs, details = contend(tables, df, arrow, base, args.rows, args.rounds, args.only)
        spark.stop()
        server_rss, gateway_rss = rss_mib(server.pid), rss_mib(server.gateway.pid)

    finding = hbase_spark_finding(scala, spark_version)
    results = best_rounds(runs, details, args.rows,
                          lambda seconds: {"mb_per_s": round(args.rows * data_bytes / seconds / 1e6, 2)})
    rate = {name: r["rows_per_s"] for name, r in results.items()}
    baseline = rate.get("python_putmultiple")
    report = {
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "hbase": f"{HBASE_VERSION} standalone (heap 2g), Thrift2 gateway (heap 512m), full JIT, "
                 f"{args.regions} regions, WAL on",
        "hbase_rss_mib_end": server_rss, "gateway_rss_mib_end": gateway_rss, "spark": spark_version,
        "thriftpy2": thriftpy2.__version__, "rows": args.rows, "data_bytes_per_row": data_bytes,
        "rounds": args.rounds, "results": results,
        **({"ratios_vs_python_putmultiple": {name: round(r / baseline, 2) for name, r in rate.items()}}
           if baseline else {}),
        "hbase_spark": finding,
    }
    print(json.dumps(report, indent=2))
    print(table(results, baseline, finding["line"]), file=sys.stderr)
    return 0


def table(results: dict[str, dict], baseline: int | None, hbase_spark: str) -> str:
    """The figures as a markdown table, hbase-spark's line last."""
    components = sorted({c for r in results.values() for c in r["cpu_s"]})
    head = ["contender", "rows/s", "MB/s", "vs python", "p50 ms", "p99 ms", *(f"cpu {c}" for c in components)]
    lines = [head, ["---"] * len(head)]
    for name, r in results.items():
        lines.append([name, str(r["rows_per_s"]), str(r["mb_per_s"]),
                      f"{r['rows_per_s'] / baseline:.2f}x" if baseline else "-",
                      str(r.get("client_p50_ms", "-")), str(r.get("client_p99_ms", "-")),
                      *(str(r["cpu_s"].get(c, 0.0)) for c in components)])
    lines.append(["hbase_spark", hbase_spark, *[""] * (len(head) - 2)])
    return "\n".join("| " + " | ".join(row) + " |" for row in lines)


if __name__ == "__main__":
    sys.exit(main())
