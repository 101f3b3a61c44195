"""python -m bench.tracking --store hbase: the stream by cell timestamps (docs/hbase.md) against the batch read of the
same rows, and freshness from put to arrival. One standalone HBase (LocalHBase: heap 1g, gateway 256m, full JIT).

- throughput (best of --rounds, alternating): N rows of (id long row key, payload string of 40 bytes) written by
  sluice.write (cell timestamps: the executors' clock) into a table of two regions; the batch read (one split per
  region) and the stream (tracking.column=at, window 0, Trigger.AvailableNow: one micro-batch, one task per region)
  both into Spark's noop sink; rows/s of each;
- freshness: one writer puts `--rate` rows/s through the Thrift2 gateway (putMultiple of rate/20 rows every 50 ms,
  timestamps given by the region server) for `--seconds`; the stream (default trigger) hands each micro-batch to
  foreachBatch, which notes now - at (the row's cell timestamp) of every row: p50/p99 per lag window.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench.tracking.measures import alternating, arrivals, paced


def run(args: Any) -> None:
    import sluice
    from sluice.connectors.hbase._client import Connection, thrift
    from sluice.testing import LocalHBase

    print(f"load average at start: {os.getloadavg()}")
    t = thrift()
    with LocalHBase(full_jit=True, heap="1g", gateway_heap="256m") as server:
        conn = Connection((server.host,), server.port, 60.0)

        def table(name: str, splits: list[bytes]) -> str:
            conn.call("createTable", t.TTableDescriptor(
                tableName=t.TTableName(ns=b"default", qualifier=name.encode()),
                columns=[t.TColumnFamilyDescriptor(name=b"d")]), splits or None)
            return f"default:{name}"

        spark = sluice.session("bench-tracking-hbase", master="local[2]")
        base = {"host": server.host, "port": str(server.port), "rowkey": "id", "family": "d"}
        middle = (1 << 63 | args.rows // 2).to_bytes(8, "big")  # ids are sign-flipped big-endian longs
        bulk = table("bulk", [middle])
        rows = spark.range(0, args.rows, 1, 2).selectExpr("id", "repeat('x', 40) AS payload")
        sluice.write(rows, "hbase", {**base, "table": bulk})
        opts = {**base, "table": bulk}

        def batch() -> float:
            started = time.perf_counter()
            spark.read.format("hbase").options(**opts).schema("id long, payload string").load() \
                .write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        def stream() -> float:
            started = time.perf_counter()
            query = (spark.readStream.format("hbase").options(**opts).schema("id long, payload string, at timestamp")
                     .option("tracking.column", "at").option("tracking.lag-window-ms", "0").load()
                     .writeStream.format("noop").trigger(availableNow=True).start())
            query.awaitTermination()
            assert sum(p["numInputRows"] for p in query.recentProgress) == args.rows
            return time.perf_counter() - started

        batch_s, stream_s, runs = alternating(args.rounds, batch, stream)
        print(f"throughput, {args.rows:,} rows in 2 regions, best of {args.rounds} (all: {runs}): batch read "
              f"{args.rows / batch_s:,.0f} rows/s ({batch_s:.1f} s), stream (AvailableNow, a task per region) "
              f"{args.rows / stream_s:,.0f} rows/s ({stream_s:.1f} s, the first planning included)")

        for window in (int(w) for w in args.windows.split(",")):
            name = table(f"fresh_{window}", [])
            p50, p99, count = freshness(spark, conn, {**base, "table": name}, window, args.rate, args.seconds)
            print(f"freshness at {args.rate:,} rows/s for {args.seconds} s, lag window {window} ms: "
                  f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms ({count:,} rows)")
        print(f"load average at end: {os.getloadavg()}")
        spark.stop()


def freshness(spark: Any, conn: Any, opts: dict[str, str], window_ms: int, rate: int,
              seconds: int) -> tuple[float, float, int]:
    from sluice.connectors.hbase._client import thrift

    t = thrift()
    lags, arrived = arrivals()
    query = (spark.readStream.format("hbase").options(**opts).schema("id long, payload string, at timestamp")
             .option("tracking.column", "at").option("tracking.lag-window-ms", str(window_ms)).load()
             .writeStream.foreachBatch(arrived).start())
    table = opts["table"].encode()
    written = 0

    def insert(n: int) -> None:
        nonlocal written
        puts = [t.TPut(row=(1 << 63 | i).to_bytes(8, "big"),
                       columnValues=[t.TColumnValue(family=b"d", qualifier=b"payload", value=b"p")])
                for i in range(written, written + n)]
        conn.call("putMultiple", table, puts)  # no timestamp: the region server's clock
        written += n

    return paced(query, lags, insert, rate, seconds, window_ms)
