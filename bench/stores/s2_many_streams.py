"""The sink-modes design's split table at scale: the same rows routed by `s2.stream=st/{k}` into 1 .. 10,000 streams.

Run: `.venv/bin/python -m bench.stores.s2_many_streams` (in-memory local S2 server; 100,000 rows of ~100 bytes,
2 Spark tasks, unordered, streams created by the sink). Every row is checked to be on the right stream.
Prints rows/s per stream count and each rate as a fraction of the single-stream rate, and the memory the streams
take: the Python workers' peak resident memory during the write (bench/scale.py's sampling, every 0.2 s) and the
S2 server's after it, with their growth over the first count's divided by the streams added (KiB per stream).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from datetime import date

import s2_sdk

import sluice
from bench.cpu import rss_mib
from bench.scale import PeakWorkerMemory
from sluice.s2local import LocalS2


async def stream_tails(url: str, basin: str) -> tuple[dict[str, int], int]:
    """Each stream's tail, and how many appends the server took (its append-ops metric)."""
    async with s2_sdk.S2("bench", endpoints=s2_sdk.Endpoints(account=url, basin=url)) as s2:
        handle = s2.basin(basin)
        names = [s.name async for s in handle.list_all_streams(prefix="st/")]
        tails = await asyncio.gather(*(handle.stream(n).check_tail() for n in names))
        (appends,) = await s2.basin_metrics(basin, set=s2_sdk.BasinMetricSet.APPEND_OPS)
    return {n: t.seq_num for n, t in zip(names, tails, strict=True)}, int(appends.values[-1][1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--streams", default="1,10,100,1000,10000")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra sink option for every write (repeatable)")
    parser.add_argument("--one-call", action="store_true",
                        help="write with sluice.write() (rows of a stream in one task) instead of df.write")
    args = parser.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    results = {}
    with LocalS2() as server:
        spark = sluice.session("s2-many-streams-bench")
        opts = {"s2.endpoints.account": server.url, "s2.endpoints.basin": server.url, "s2.auth-token": "bench",
                "s2.stream": "st/{k}", "s2.create-streams": "true", "s2.create-basin": "true",
                **dict(option.split("=", 1) for option in args.option)}
        warm = spark.range(0, 1000, 1, 2).selectExpr("id % 2 AS k", "repeat('x', 90) AS body")
        warm.write.format("s2").options(**opts).option("s2.basin", "many-warm-up").mode("append").save()
        for n in counts:
            basin = f"many-streams-{n}"
            df = spark.range(0, args.rows, 1, 2).selectExpr(f"id % {n} AS k", "repeat('x', 90) AS body").cache()
            df.count()
            with PeakWorkerMemory() as memory:
                start = time.perf_counter()
                if args.one_call:
                    sluice.write(df, "s2", {**opts, "s2.basin": basin})
                else:
                    df.write.format("s2").options(**opts).option("s2.basin", basin).mode("append").save()
                seconds = time.perf_counter() - start
            summary = sluice.last_write_summary("s2")
            tails, appends = asyncio.run(stream_tails(server.url, basin))
            expected = {f"st/{k}": args.rows // n + (1 if k < args.rows % n else 0) for k in range(n)}
            assert tails == expected, f"{n} streams: rows missing or misrouted"
            results[n] = {"seconds": round(seconds, 2), "rows_per_s": round(args.rows / seconds),
                          "batches": summary["batches"], "appends": appends, "retries": summary["retries"],
                          "peak_worker_mib": round(memory.peak, 1), "server_mib": rss_mib(server.process.pid)}
            df.unpersist()
            print(n, results[n], flush=True)
        spark.stop()
    first = results[counts[0]]
    for n in counts:
        results[n]["vs_first"] = round(results[n]["rows_per_s"] / first["rows_per_s"], 3)
        if n > counts[0]:
            for part in ("peak_worker_mib", "server_mib"):
                grown = (results[n][part] or 0) - (first[part] or 0)
                results[n][part.replace("_mib", "_kib_per_stream")] = round(grown * 1024 / (n - counts[0]), 1)
    print(json.dumps({"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                      "load": os.getloadavg(),
                      "rows": args.rows, "tasks": 2, "path": "sluice.write" if args.one_call else "df.write",
                      "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
