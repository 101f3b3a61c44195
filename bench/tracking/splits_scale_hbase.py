"""The cost of planning a micro-batch of an HBase tracking stream (cell timestamps) as the table's regions grow.

    flock /tmp/sluice-cpu.lock .venv/bin/python -m bench.tracking.splits_scale_hbase [--regions 1,10,100]

One standalone HBase (LocalHBase: heap 1g, gateway 256m, full JIT); for each region count a table pre-split into
that many regions, 1,000 rows over them, then `batches` plannings after 100 new rows each (spread over the
regions) and `batches` plannings with nothing new (an idle stream plans at every trigger), on the driver as
Spark's micro-batch loop does: `latestOffset` then `partitions`, timed with time.perf_counter. Counted per
planning: the Thrift2 calls the driver sends, by method. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter
from typing import Any

ROWS = 1000
PER_BATCH = 100
KEYS = 10_000  # row keys r0000-r9999: a table of n regions is split every KEYS / n keys


class Counting:
    """A gateway connection that counts the calls sent through it, by method (`sent`)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sent: Counter[str] = Counter()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.sent[method] += 1
        return self.conn.call(method, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def measure(server: Any, regions: int, batches: int) -> dict[str, Any]:
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    from sluice.connectors.hbase import HBaseDataSource
    from sluice.connectors.hbase._client import Connection, thrift
    from sluice.spark._compat import ReadAllAvailable

    t = thrift()
    conn = Connection((server.host,), server.port, 60.0)
    name = f"regions_{regions}"
    splits = [f"r{i * KEYS // regions:04d}".encode() for i in range(1, regions)]
    conn.call("createTable", t.TTableDescriptor(tableName=t.TTableName(ns=b"default", qualifier=name.encode()),
                                                columns=[t.TColumnFamilyDescriptor(name=b"d")]), splits or None)
    written = 0

    def put(n: int) -> None:
        nonlocal written
        step = KEYS // n  # spread over every region
        conn.call("putMultiple", f"default:{name}".encode(), [
            t.TPut(row=f"r{(j * step + written // n) % KEYS:04d}".encode(),
                   columnValues=[t.TColumnValue(family=b"d", qualifier=b"v", value=b"x")]) for j in range(n)])
        written += n

    put(ROWS)
    schema = StructType([StructField("id", StringType()), StructField("v", StringType()),
                         StructField("at", TimestampType())])
    reader = HBaseDataSource({"host": server.host, "port": str(server.port), "table": f"default:{name}",
                              "rowkey": "id", "family": "d", "tracking.column": "at",
                              "tracking.lag-window-ms": "0"}).streamReader(schema)
    scans = reader.enumerator.scans  # the driver's scans: the enumerator's calls go through the counting one
    scans.conn = Counting(scans.conn)
    sent = scans.conn.sent
    start = reader.initialOffset()
    plannings = []
    for i in range(1 + 2 * batches):  # the backlog, then `batches` with new rows, then `batches` idle
        if 0 < i <= batches:
            put(PER_BATCH)
        before = Counter(sent)
        began = time.perf_counter()
        end = reader.latestOffset(start, ReadAllAvailable())
        parts = reader.partitions(start, end)
        took = time.perf_counter() - began
        calls = sent - before
        plannings.append({"kind": "backlog" if i == 0 else "new rows" if i <= batches else "idle",
                          "planning_ms": round(took * 1000, 1), "tasks": len(parts),
                          "calls": sum(calls.values()), "by_method": dict(calls)})
        start = end
    reader.stop()

    def of(kind: str) -> dict[str, Any]:
        chosen = [p for p in plannings if p["kind"] == kind]
        return {"median_planning_ms": round(statistics.median(p["planning_ms"] for p in chosen), 1),
                "calls_per_planning": sorted({p["calls"] for p in chosen})}

    return {"regions": regions, "new_rows": of("new rows"), "idle": of("idle"), "plannings": plannings}


def main() -> None:
    from sluice.testing import LocalHBase

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regions", default="1,10,100", help="regions per table, comma-separated")
    parser.add_argument("--batches", type=int, default=5, help="plannings with new rows, and as many idle")
    args = parser.parse_args()
    began = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    runs = []
    with LocalHBase(full_jit=True, heap="1g", gateway_heap="256m") as server:
        for regions in (int(r) for r in args.regions.split(",")):
            runs.append(measure(server, regions, args.batches))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "plannings"}), flush=True)
    print(json.dumps({"began": began, "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                      "load_average_end": os.getloadavg(), "cores": os.cpu_count(), "rows": ROWS,
                      "rows_per_batch": PER_BATCH, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
