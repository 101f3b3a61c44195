"""S2 sink benchmark: Spark -> format("s2") vs the raw s2-sdk vs a naive foreachPartition, one run, one server.

Run: `.venv/bin/python -m bench.stores.s2_sink [--records 1000000] [--rounds 3]` (in-memory local S2 server; 100-byte
records, format=raw).
- raw SDK: one Python process, one append session, batches of 1000 records (the server-bound limit);
- sluice: the same records from a cached DataFrame (2 partitions) through format("s2"), unordered;
- naive: df.foreachPartition appending one record per unary call (what a first attempt often looks like).
The raw SDK and sluice alternate for --rounds rounds (medians compared); each write also gives the CPU seconds of
the processes it ran on (bench/cpu.py: this process, where the raw SDK runs; Spark's JVM; its Python workers; the
S2 server), which move less than wall times on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from datetime import date

import s2_sdk

import sluice
from bench.cpu import clocked_tree
from sluice.s2local import LocalS2

BODY_SQL = "concat(lpad(CAST(id AS STRING), 20, '0'), repeat('x', 80)) AS body"


def client(url: str) -> s2_sdk.S2:
    return s2_sdk.S2("bench", endpoints=s2_sdk.Endpoints(account=url, basin=url))


async def setup(url: str) -> None:
    async with client(url) as s2:
        await s2.ensure_basin("sink-bench")
        for name in ("raw", "sluice", "naive"):
            await s2.basin("sink-bench").ensure_stream(name)


async def raw_sdk(url: str, n: int) -> float:
    bodies = [f"{i:020d}".encode() + b"x" * 80 for i in range(n)]
    start = time.perf_counter()
    async with client(url) as s2:
        stream = s2.basin("sink-bench").stream("raw")
        async with stream.append_session() as session:
            tickets = []
            for i in range(0, n, 1000):
                records = [s2_sdk.Record(body=b) for b in bodies[i:i + 1000]]
                tickets.append(await session.submit(s2_sdk.AppendInput(records=records)))
            for ticket in tickets:
                await ticket
    return time.perf_counter() - start


def naive_partition(url: str):
    def write(rows):
        import asyncio as aio

        import s2_sdk as sdk

        async def go():
            async with sdk.S2("bench", endpoints=sdk.Endpoints(account=url, basin=url)) as s2:
                stream = s2.basin("sink-bench").stream("naive")
                for row in rows:
                    await stream.append(sdk.AppendInput(records=[sdk.Record(body=row.body.encode())]))

        aio.run(go())

    return write


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--naive-records", type=int, default=4_000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the raw SDK and sluice")
    args = parser.parse_args()
    with LocalS2() as server:
        asyncio.run(setup(server.url))
        spark = sluice.session("s2-sink-bench", **{"spark.sql.shuffle.partitions": "2"})
        df = spark.range(0, args.records, 1, 2).selectExpr(BODY_SQL).cache()
        df.count()
        opts = {"s2.basin": "sink-bench", "s2.endpoints.account": server.url, "s2.endpoints.basin": server.url,
                "s2.auth-token": "bench", "format": "raw"}
        # Warm-up: Python workers, imports, connections.
        df.limit(1000).write.format("s2").options(**opts).option("s2.stream", "sluice").mode("append").save()

        raw_runs, sluice_runs, cpu = [], [], {"raw_sdk": [], "sluice": []}
        summary = None
        for _ in range(args.rounds):
            took, used = clocked_tree(lambda: asyncio.run(raw_sdk(server.url, args.records)), {})
            raw_runs.append(took)
            cpu["raw_sdk"].append(used)
            took, used = clocked_tree(lambda: df.write.format("s2").options(**opts).option("s2.stream", "sluice")
                                      .mode("append").save(), {})
            sluice_runs.append(took)
            cpu["sluice"].append(used)
            summary = sluice.last_write_summary("s2")
        raw_s, sluice_s = statistics.median(raw_runs), statistics.median(sluice_runs)
        naive_df = spark.range(0, args.naive_records, 1, 2).selectExpr(BODY_SQL)
        start = time.perf_counter()
        naive_df.foreachPartition(naive_partition(server.url))
        naive_s = time.perf_counter() - start

        async def tails():
            async with client(server.url) as s2:
                return {n: (await s2.basin("sink-bench").stream(n).check_tail()).seq_num
                        for n in ("raw", "sluice", "naive")}

        counts = asyncio.run(tails())
        spark.stop()
    assert counts["raw"] == args.rounds * args.records and counts["sluice"] == args.rounds * args.records + 1000, counts
    # >=: the SDK's default retry policy (ALL) may resend a unary append that had landed (seen: 4002 of 4000).
    assert counts["naive"] >= args.naive_records, counts
    raw_rate, sluice_rate, naive_rate = args.records / raw_s, args.records / sluice_s, args.naive_records / naive_s
    print(json.dumps({
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "records": args.records, "record_bytes": 100, "rounds": args.rounds, "load": os.getloadavg(),
        "raw_sdk_records_per_s": round(raw_rate), "sluice_s2_sink_records_per_s": round(sluice_rate),
        "naive_foreach_partition_records_per_s": round(naive_rate),
        "sluice_vs_raw_sdk": round(sluice_rate / raw_rate, 3), "sluice_vs_naive": round(sluice_rate / naive_rate, 1),
        "raw_sdk_seconds": [round(t, 2) for t in raw_runs], "sluice_seconds": [round(t, 2) for t in sluice_runs],
        "cpu_s_per_write": {side: {part: round(statistics.median(u.get(part, 0.0) for u in runs), 2)
                                   for part in sorted({p for u in runs for p in u})} for side, runs in cpu.items()},
        "naive_records_on_stream": counts["naive"], "sink_summary": summary,
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
