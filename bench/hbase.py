"""HBase benchmark: sluice's `format("hbase")` sink (2 Spark tasks) against the Thrift client's own batch write in
one Python process, one run, the same server; and why hbase-spark is not in it.

Run: `.venv/bin/python bench/hbase.py [--rows 500000] [--rounds 3] [--regions 4] [--warmup-rows ROWS] [--only A,B]
[--profile]` (500,000 rows: ~25 s a contender on 2 cores).
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
import sys
import time
import urllib.request
import uuid
from contextlib import ExitStack
from datetime import date
from pathlib import Path

from _cpu import clocked_tree, rss_mib, stdout_to_stderr

ROOT = Path(__file__).resolve().parents[1]
# This script's own folder comes first on sys.path, where its name would shadow an `hbase` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

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


def main() -> int:
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
    # SIGTERM unwinds like an exception, so that the server is stopped and its folder deleted (it runs in a session
    # of its own and would outlive this process).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    import pyarrow.compute as pc
    import thriftpy2
    from thriftpy2.rpc import make_client

    import sluice
    from sluice.connectors.hbase._client import Connection, thrift
    from sluice.testing import LocalHBase

    t = thrift()
    splits = [row_key(args.rows * k // args.regions) for k in range(1, args.regions)]
    with ExitStack() as stack:
        server = stack.enter_context(LocalHBase(full_jit=True, heap="2g", gateway_heap="512m"))

        def on_failure(kind, error, traceback) -> bool:
            if kind is not None and issubclass(kind, Exception):  # before the server and its logs go
                print(f"--- HBase ({'running' if server.pid else 'NOT RUNNING'}):\n{server._log_tail()}\n"
                      f"--- gateway:\n{server.gateway._log_tail()}", file=sys.stderr)
            return False

        stack.push(on_failure)
        # Table calls through sluice's Connection: the gateway closes a link idle for 60 s (as during a write), and
        # Connection.call opens a new one then.
        conn = Connection((server.host,), server.port, 600.0)
        stack.callback(conn.forget)

        class Admin:
            def __getattr__(self, method: str):
                return lambda *args: conn.call(method, *args)

        admin = Admin()

        def timed(action) -> tuple[float, dict[str, float]]:
            return clocked_tree(action, {server.pid: "hbase", server.gateway.pid: "hbase_thrift"})

        def fresh() -> str:
            name = f"b_{uuid.uuid4().hex[:8]}"
            admin.createTable(t.TTableDescriptor(tableName=t.TTableName(ns=b"default", qualifier=name.encode()),
                                                 columns=[t.TColumnFamilyDescriptor(name=FAMILY)]), splits)
            return f"default:{name}"

        def finish(table: str, rows: int) -> float:
            """Every row there (a key-only scan), a sample exactly as expected; then the table dropped. Returns the
            seconds of the scan."""
            start = time.perf_counter()
            scan = t.TScan(caching=10_000, filterString=b"FirstKeyOnlyFilter() AND KeyOnlyFilter()")
            scanner = admin.openScanner(table.encode(), scan)
            got = 0
            try:
                while results := admin.getScannerRows(scanner, 10_000):
                    got += len(results)
            finally:
                admin.closeScanner(scanner)
            seconds = time.perf_counter() - start
            assert got == rows, (table, got, rows)
            sample = random.Random(rows).sample(range(rows), min(SAMPLE, rows))
            results = admin.getMultiple(table.encode(), [t.TGet(row=row_key(i)) for i in sample])
            for i, result in zip(sample, results, strict=True):
                cells = {bytes(c.qualifier): bytes(c.value) for c in result.columnValues or ()}
                assert bytes(result.row) == row_key(i) and cells == expected_cells(i), (table, i, cells)
            drop(table)
            return round(seconds, 2)

        def drop(table: str) -> None:
            name = t.TTableName(ns=b"default", qualifier=table.partition(":")[2].encode())
            admin.disableTable(name)
            admin.deleteTable(name)

        if args.profile:
            # It measured RowEncoder's TPut-object path against the Thrift-bytes prototype that is now _wire.py,
            # and reads TPut fields from the encoder's entries, which are bytes for puts now.
            raise SystemExit("--profile measured the TPut-object encoder that sluice/connectors/hbase/_wire.py "
                             "replaced (figures in docs/hbase.md); it does not run on the current encoder.")
        with stdout_to_stderr():
            spark = sluice.session("sluice-bench-hbase")
        df = spark.range(args.rows).selectExpr(
            "id",
            "concat('region-', cast(id % 10 as string)) AS region",
            "format_string('Order %012d shipped to warehouse %d, priority %d', id, id % 10, id % 7) AS title",
            "cast(id AS double) * 0.25 AS amount",
            "cast(id % 100 as int) AS qty",
        ).repartition(2).cache()
        df.count()
        spark_version = spark.version
        scala = spark.sparkContext._jvm.scala.util.Properties.versionNumberString()
        # The hand-written writer's input: the same rows, collected before any timing.
        arrow = df.toArrow()
        data_bytes = 8 + sum(len(FAMILY) + len(q) + len(v) for q, v in expected_cells(1).items())

        def python_putmultiple(table: str, rows) -> dict[str, float]:
            """The hand-written writer: TPuts of CLIENT_BATCH rows, one putMultiple at a time."""
            import struct

            client = make_client(t.THBaseService, server.host, server.port, timeout=600_000)
            TPut, TColumnValue = t.TPut, t.TColumnValue
            pack_d, pack_i = struct.Struct(">d").pack, struct.Struct(">i").pack
            name = table.encode()
            convert = call = 0.0
            latencies = []
            try:
                for start in range(0, rows.num_rows, CLIENT_BATCH):
                    began = time.perf_counter()
                    chunk = rows.slice(start, CLIENT_BATCH)
                    columns = [chunk.column(c).to_pylist() for c in ("id", *CELLS)]
                    puts = [TPut(row=(i ^ SIGN).to_bytes(8, "big"), columnValues=[
                        TColumnValue(family=b"d", qualifier=b"region", value=region.encode()),
                        TColumnValue(family=b"d", qualifier=b"title", value=title.encode()),
                        TColumnValue(family=b"d", qualifier=b"amount", value=pack_d(amount)),
                        TColumnValue(family=b"d", qualifier=b"qty", value=pack_i(qty)),
                    ]) for i, region, title, amount, qty in zip(*columns, strict=True)]
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
                    "client_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1)}

        base = {"host": server.host, "port": str(server.port), "rowkey": "id", "family": "d"}
        # Warm-up, untimed (see the docstring).
        warm_rows = min(args.warmup_rows, args.rows)  # ids 0 .. warm_rows - 1, in both partitions
        warm = fresh()
        sluice.write(df.where(f"id < {warm_rows}"), "hbase", {**base, "table": warm})
        finish(warm, warm_rows)
        warm = fresh()
        python_putmultiple(warm, arrow.filter(pc.less(arrow.column("id"), warm_rows)))
        finish(warm, warm_rows)

        def run_sluice(name: str, extra: dict[str, str]) -> None:
            table = fresh()
            opts = {**base, "table": table, **extra}
            runs[name].append(timed(lambda: sluice.write(df, "hbase", opts)))
            s = sluice.last_write_summary("hbase")
            assert s["status"] != "failed" and s["records"] == args.rows, s
            details[name].append({
                "client_p50_ms": s["submit_latency_p50_ms"], "client_p99_ms": s["submit_latency_p99_ms"],
                "requests": s["batches"], "rows_per_request": round(s["records"] / s["batches"], 1),
                "peak_inflight": s["peak_inflight"], "tasks": s["tasks"], "retries": s["retries"],
                "throttles": s["throttles"], "flush_reasons": s["flush_reasons"],
                "check_scan_s": finish(table, args.rows)})

        def run_python() -> None:
            table = fresh()
            info: dict[str, float] = {}
            runs["python_putmultiple"].append(timed(lambda: info.update(python_putmultiple(table, arrow))))
            details["python_putmultiple"].append({**info, "check_scan_s": finish(table, args.rows)})

        def run_floor() -> None:
            runs["floor"].append(timed(lambda: sluice.write(df, "sluice_null", {})))
            details["floor"].append({})

        batch_5000 = {"sink.batch.max-size": "5000", "sink.requests.max-buffered": "20000"}
        contenders = {"sluice": lambda: run_sluice("sluice", {}),
                      "sluice_batch_5000": lambda: run_sluice("sluice_batch_5000", batch_5000),
                      "python_putmultiple": run_python, "floor": run_floor}
        if args.only:
            contenders = {name: contenders[name] for name in args.only.split(",")}
        runs: dict[str, list] = {name: [] for name in contenders}
        details: dict[str, list[dict]] = {name: [] for name in contenders}  # per round, as runs
        names = list(contenders)
        for round_ in range(args.rounds):
            # Each round starts one contender later, so that no contender always comes first (or after the same
            # one): the server's flushes, compactions and collections fall on different contenders in each round.
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                contenders[name]()
        spark.stop()
        server_rss, gateway_rss = rss_mib(server.pid), rss_mib(server.gateway.pid)

    finding = hbase_spark_finding(scala, spark_version)
    results = {}
    for name, measured in runs.items():
        best = min(range(len(measured)), key=lambda i: measured[i][0])
        seconds, cpu = measured[best]
        results[name] = {"seconds": round(seconds, 3), "rows_per_s": round(args.rows / seconds),
                         "mb_per_s": round(args.rows * data_bytes / seconds / 1e6, 2),
                         "all_rounds_rows_per_s": [round(args.rows / s) for s, _ in measured],
                         "cpu_s": cpu, **details[name][best]}
    rate = {name: r["rows_per_s"] for name, r in results.items()}
    baseline = rate.get("python_putmultiple")
    from sluice.testing._hbase import HBASE_VERSION

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


def task_batches(rows: int):
    """One of the 2 tasks' rows (every other id: spread over every region, as a hash partition by id gives), as the
    Arrow RecordBatches of 10,000 rows Spark hands a Python writer (spark.sql.execution.arrow.maxRecordsPerBatch)."""
    import numpy as np
    import pyarrow as pa

    ids = np.arange(0, rows, 2, dtype=np.int64)
    out = []
    for start in range(0, len(ids), 10_000):
        chunk = ids[start:start + 10_000]
        out.append(pa.RecordBatch.from_pydict({
            "id": pa.array(chunk),
            "region": pa.array([f"region-{i % 10}" for i in chunk.tolist()]),
            "title": pa.array([f"Order {i:012d} shipped to warehouse {i % 10}, priority {i % 7}"
                               for i in chunk.tolist()]),
            "amount": pa.array(chunk * 0.25),
            "qty": pa.array((chunk % 100).astype(np.int32))}))
    return out


def thrift_puts(keys, cells, stamps):
    """PROTOTYPE of a fix (not sluice's code): each row's TPut as Thrift binary bytes, built column by column in
    Arrow: no Python object per row or cell but one bytes object per row (which the cyclic GC does not track), and
    nothing left to serialize at send time. The same bytes thriftpy2 writes for RowEncoder's TPut objects (checked
    in profile()). keys: binary array; cells: [(family, qualifier, binary array, nulls = no cell)]; stamps: int64."""
    import struct

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def fixed(values, kind: str, width: int):
        raw = pa.py_buffer(np.asarray(values, kind).tobytes())
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(values), [None, raw]).cast(pa.binary())

    def length(array):
        return fixed(pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False), ">i4", 4)

    def const(b: bytes):
        return pa.scalar(b, pa.binary())

    ts = fixed(stamps, ">i8", 8)
    counts = np.zeros(len(keys), np.int64)
    pieces = []
    for family, qualifier, values in cells:  # TColumnValue: 1 family, 2 qualifier, 3 value, 4 timestamp, stop
        head = (b"\x0b\x00\x01" + struct.pack(">i", len(family)) + family + b"\x0b\x00\x02" +
                struct.pack(">i", len(qualifier)) + qualifier + b"\x0b\x00\x03")
        cell = pc.binary_join_element_wise(const(head), length(values), values, const(b"\x0a\x00\x04"), ts,
                                           const(b"\x00"), const(b""), null_handling="emit_null")
        counts += values.is_valid().to_numpy(zero_copy_only=False)
        pieces.append(cell.fill_null(b"") if values.null_count else cell)
    # TPut: 1 row, 2 columnValues (list of structs), 3 timestamp, stop
    return pc.binary_join_element_wise(
        const(b"\x0b\x00\x01"), length(keys), keys, const(b"\x0f\x00\x02\x0c"), fixed(counts, ">i4", 4), *pieces,
        const(b"\x0a\x00\x03"), ts, const(b"\x00"), const(b""))


def put_multiple_raw(client, table: bytes, puts: list[bytes]) -> None:
    """PROTOTYPE: putMultiple(table, puts) with the TPuts already Thrift bytes: one buffer, one send."""
    import struct

    from thriftpy2.thrift import TMessageType

    client._oprot.write_message_begin("putMultiple", TMessageType.CALL, 0)
    client._oprot.trans.write(b"".join([b"\x0b\x00\x01", struct.pack(">i", len(table)), table, b"\x0f\x00\x02\x0c",
                                        struct.pack(">i", len(puts)), *puts, b"\x00"]))
    client._oprot.write_message_end()
    client._oprot.trans.flush()
    client._recv("putMultiple")


def profile(rows: int, fresh, drop, server) -> None:
    """--profile: where one task's time goes. Its share of --rows (task_batches) through RowEncoder alone (GC on and
    off; cProfile with GC off, so that the collections' time is not charged to whichever line allocated), then the
    whole task in this process (RowEncoder -> AsyncSinkWriter -> HBaseStore, sluice's defaults) into a fresh table of
    the real server: as is; with the cyclic GC off; with a 4 MiB Thrift transport buffer in place of thriftpy2's 4 KiB
    (one sendall a request, not ~65: each releases and re-takes the GIL, which the task thread holds while it
    encodes); both; with the prototype thrift_puts/put_multiple_raw; and the hand-written writer on the same batches.
    Each: wall rows/s, this process's CPU a row (every thread), the GC's share (gc.callbacks), the requests."""
    import bisect
    import cProfile
    import gc
    import io
    import pstats
    import struct

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import thriftpy2.transport as transport
    from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType
    from thriftpy2.protocol.cybin import TCyBinaryProtocolFactory
    from thriftpy2.rpc import make_client
    from thriftpy2.transport.buffered.cybuffered import TCyBufferedTransport

    from sluice.connector import Encoded
    from sluice.connectors.hbase import HBaseDataSource
    from sluice.connectors.hbase._client import thrift
    from sluice.connectors.hbase._sink import HBaseStore
    from sluice.engine import AsyncSinkWriter, WriteContext
    from sluice.sink._arrow_writers import batching

    t = thrift()
    batches = task_batches(rows)
    n = sum(b.num_rows for b in batches)
    schema = StructType([StructField("id", LongType()), StructField("region", StringType()),
                         StructField("title", StringType()), StructField("amount", DoubleType()),
                         StructField("qty", IntegerType())])
    collected: dict[int, list] = {}
    began = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            counted = collected.setdefault(info["generation"], [0, 0.0])
            counted[0] += 1
            counted[1] += time.perf_counter() - began[0]

    gc.callbacks.append(on_gc)

    def plan_for(table: str):
        opts = {"host": server.host, "port": str(server.port), "table": table, "rowkey": "id", "family": "d"}
        return HBaseDataSource(opts)._plan(schema, overwrite=False, streaming=False)

    default_factory = transport.TCyBufferedTransportFactory

    class BigBuffer:
        def get_transport(self, trans):
            return TCyBufferedTransport(trans, 4 << 20)

    def measured(label: str, action, table: str | None = None) -> dict:
        """action(table) timed: wall, this process's CPU (all threads), the GC's; the table dropped afterwards."""
        collected.clear()
        cpu, wall = time.process_time(), time.perf_counter()
        extra = action(table) or {}
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if table is not None:
            drop(table)
        gc_s = sum(s for _, s in collected.values())
        row = {"variant": label, "rows_per_s": round(n / wall), "cpu_us_per_row": round(cpu / n * 1e6, 1),
               "gc_us_per_row": round(gc_s / n * 1e6, 1),
               "gc_collections": {f"gen{g}": c for g, (c, _) in sorted(collected.items())}, **extra}
        print(json.dumps(row), file=sys.stderr, flush=True)
        return row

    # 1. The encoder alone.
    table = fresh()
    plan = plan_for(table)
    encoder = plan.open_task(WriteContext()).encode

    def encode_all(_) -> None:
        for b in batches:
            encoder(b)  # its output dropped at once (the engine holds a few chunks' worth)

    encoder_rows = []
    for label, enabled in (("RowEncoder alone", True), ("RowEncoder alone, GC off", False)):
        gc.enable() if enabled else gc.disable()
        encoder_rows.append(measured(label, encode_all))
    profiler = cProfile.Profile()
    profiler.enable()
    for b in batches[:20]:
        encoder(b)
    profiler.disable()
    gc.enable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
    # The prototype writes what thriftpy2 writes.
    first = encoder(batches[0])
    entries = first.entries[:1000]
    wire = transport.TMemoryBuffer()
    TCyBinaryProtocolFactory().get_protocol(wire).write_struct(
        t.THBaseService.putMultiple_args(table=table.encode(), tputs=entries))
    keys = pa.array([e.row for e in entries], pa.binary())
    cells = [(c.family, c.qualifier, pa.array([c.value for c in (e.columnValues[j] for e in entries)], pa.binary()))
             for j, c in enumerate(entries[0].columnValues)]
    raw = thrift_puts(keys, cells, np.array([e.timestamp for e in entries], np.int64)).to_pylist()
    ours = b"".join([b"\x0b\x00\x01", struct.pack(">i", len(table)), table.encode(), b"\x0f\x00\x02\x0c",
                     struct.pack(">i", len(raw)), *raw, b"\x00"])
    assert wire.getvalue() == ours, "the prototype's bytes differ from thriftpy2's"
    drop(table)

    # 2. The whole task against the server.
    def task(variant: str):
        def run(table: str) -> dict:
            transport.TCyBufferedTransportFactory = BigBuffer if "4 MiB" in variant else default_factory
            plan = plan_for(table)
            writer_task = plan.open_task(WriteContext())
            encode, store = writer_task.encode, writer_task.store
            if "prototype" in variant:
                encoder = encode

                def encode(b):  # the prototype in place of RowEncoder's per-row loop
                    keys = encoder.plan.key.encode(b)
                    cells = [(f, q, pa.array(fn(b.column(c)), pa.binary())) for c, f, q, fn in encoder.cell_encoders]
                    puts = thrift_puts(pa.array(keys, pa.binary()), cells, np.asarray(encoder._stamps(b, keys)))
                    return Encoded(puts.to_pylist(), pc.binary_length(puts).to_numpy().tolist(), None,
                                   [bisect.bisect_right(encoder.plan.region_starts, k) for k in keys])

                class RawStore(HBaseStore):
                    def write_batch(self, batch) -> None:
                        put_multiple_raw(self.conn.client(self.gateway), self.table_bytes, batch.entries)

                store = RawStore(store.conn, store.table, store.io_threads, store.gateway)
            creator, buffer = batching(plan)
            if "GC off" in variant:
                gc.disable()
            try:
                with AsyncSinkWriter(store, plan.config, batch_creator=creator, buffer=buffer) as writer:
                    for b in batches:
                        e = encode(b)
                        writer.write_keyed(e.entries, e.sizes, e.groups, None)
                    writer.finish()
            finally:
                gc.enable()
                transport.TCyBufferedTransportFactory = default_factory
            return {"requests": writer.stats.batches}
        return run

    def hand(table: str) -> dict:
        client = make_client(t.THBaseService, server.host, server.port, timeout=600_000)
        TPut, TColumnValue = t.TPut, t.TColumnValue
        pack_d, pack_i = struct.Struct(">d").pack, struct.Struct(">i").pack
        convert = 0.0
        for b in batches:
            for start in range(0, b.num_rows, CLIENT_BATCH):
                began_at = time.perf_counter()
                chunk = b.slice(start, CLIENT_BATCH)
                columns = [chunk.column(c).to_pylist() for c in ("id", *CELLS)]
                puts = [TPut(row=(i ^ SIGN).to_bytes(8, "big"), columnValues=[
                    TColumnValue(family=b"d", qualifier=b"region", value=region.encode()),
                    TColumnValue(family=b"d", qualifier=b"title", value=title.encode()),
                    TColumnValue(family=b"d", qualifier=b"amount", value=pack_d(amount)),
                    TColumnValue(family=b"d", qualifier=b"qty", value=pack_i(qty)),
                ]) for i, region, title, amount, qty in zip(*columns, strict=True)]
                convert += time.perf_counter() - began_at
                client.putMultiple(table.encode(), puts)
        client.close()
        return {"requests": n // CLIENT_BATCH, "convert_us_per_row": round(convert / n * 1e6, 1)}

    measured("warm-up (untimed)", task("sluice task"), fresh())
    variants = ["sluice task", "sluice task, GC off", "sluice task, 4 MiB transport buffer",
                "sluice task, 4 MiB transport buffer, GC off", "sluice task, prototype thrift_puts"]
    task_rows = [measured(v, task(v), fresh()) for v in variants]
    task_rows.append(measured("hand-written putMultiple", hand, fresh()))
    print(f"\n| variant (one task's {n} rows, this process) | rows/s | CPU us/row | GC us/row | GC collections |")
    print("| --- | --- | --- | --- | --- |")
    for row in encoder_rows + task_rows:
        print(f"| {row['variant']} | {row['rows_per_s']} | {row['cpu_us_per_row']} | {row['gc_us_per_row']} | "
              f"{row['gc_collections']} |")
    print(f"\ncProfile of RowEncoder (GC off), {sum(b.num_rows for b in batches[:20])} rows, by own time:")
    print("\n".join(text.getvalue().splitlines()[4:]))


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
