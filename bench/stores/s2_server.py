"""Local S2 server benchmark, through the official s2-sdk. Run: `.venv/bin/python -m bench.stores.s2_server`.

Append throughput (100-byte records, batches of 1000, append sessions; one and two writer processes),
read throughput (one read session), and single-record unary append latency p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import tempfile
import time
from datetime import date

import s2_sdk

from bench.measures import percentile
from sluice.s2local import LocalS2

RECORD = b"x" * 100


def client(url: str) -> s2_sdk.S2:
    return s2_sdk.S2("bench", endpoints=s2_sdk.Endpoints(account=url, basin=url))


async def _append(url: str, stream: str, batches: int) -> None:
    async with client(url) as s2:
        target = s2.basin("bench-basin").stream(stream)
        batch = s2_sdk.AppendInput(records=[s2_sdk.Record(body=RECORD) for _ in range(1000)])
        async with target.append_session() as session:
            tickets = []
            for _ in range(batches):
                tickets.append(await session.submit(batch))
            for ticket in tickets:
                await ticket


def _append_proc(url: str, stream: str, batches: int) -> None:
    asyncio.run(_append(url, stream, batches))


def append_rate(url: str, stream: str, writers: int, batches: int) -> dict:
    procs = [multiprocessing.Process(target=_append_proc, args=(url, stream, batches)) for _ in range(writers)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    elapsed = time.perf_counter() - start
    records = writers * batches * 1000
    return {"writers": writers, "records": records, "seconds": round(elapsed, 3),
            "records_per_s": round(records / elapsed), "mb_per_s": round(records * 100 / elapsed / 1e6, 1)}


async def read_rate(url: str, stream: str) -> dict:
    async with client(url) as s2:
        target = s2.basin("bench-basin").stream(stream)
        tail = (await target.check_tail()).seq_num
        start = time.perf_counter()
        n = 0
        async for batch in target.read_session(start=s2_sdk.SeqNum(0), limit=s2_sdk.ReadLimit(count=tail)):
            n += len(batch.records)
        elapsed = time.perf_counter() - start
    return {"records": n, "seconds": round(elapsed, 3), "records_per_s": round(n / elapsed),
            "mb_per_s": round(n * 100 / elapsed / 1e6, 1)}


async def latency(url: str, stream: str, n: int) -> dict:
    async with client(url) as s2:
        target = s2.basin("bench-basin").stream(stream)
        one = s2_sdk.AppendInput(records=[s2_sdk.Record(body=RECORD)])
        await target.append(one)
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            await target.append(one)
            samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return {"appends": n, "p50_ms": round(statistics.median(samples), 3),
            "p99_ms": round(percentile(samples, 0.99), 3)}


async def setup(url: str) -> None:
    async with client(url) as s2:
        await s2.ensure_basin("bench-basin")
        for name in ("one", "two", "lat"):
            await s2.basin("bench-basin").ensure_stream(name)


def run(mode: str, batches: int, latency_n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, LocalS2(None if mode == "in-memory" else tmp) as server:
        asyncio.run(setup(server.url))
        return {
            "append_1_writer": append_rate(server.url, "one", 1, batches),
            "append_2_writers": append_rate(server.url, "two", 2, batches // 2),
            "read_1_session": asyncio.run(read_rate(server.url, "one")),
            "unary_append_latency": asyncio.run(latency(server.url, "lat", latency_n)),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=300, help="batches of 1000 records per run")
    parser.add_argument("--latency-appends", type=int, default=500)
    args = parser.parse_args()
    out = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "durable (SQLite WAL, fsync per commit)": run("durable", args.batches, args.latency_appends),
           "in-memory": run("in-memory", args.batches, args.latency_appends)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
