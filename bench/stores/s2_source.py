"""S2 source benchmark: Spark batch reads vs raw s2-sdk read sessions, same data, same server, one run.

Run: `.venv/bin/python -m bench.stores.s2_source` (in-memory local S2 server, 100-byte records).
- raw SDK: one Python process, one read session over the stream (and over each of 8 streams in turn);
- sluice: spark.read.format("s2") of one stream unsplit, of the same stream cut into ranges, and of 8 streams.
Each figure is the best of --rounds runs; every round runs all contenders one after another, so a slow
moment of the machine hits them alike.
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
from sluice.s2local import LocalS2


def client(url: str) -> s2_sdk.S2:
    return s2_sdk.S2("bench", endpoints=s2_sdk.Endpoints(account=url, basin=url))


async def load(url: str, records: int) -> None:
    async with client(url) as s2:
        await s2.ensure_basin("source-bench")
        basin = s2.basin("source-bench")
        for name, n in [("one", records)] + [(f"multi/{i}", records // 8) for i in range(8)]:
            await basin.ensure_stream(name)
            async with basin.stream(name).append_session() as session:
                tickets = [await session.submit(s2_sdk.AppendInput(
                    records=[s2_sdk.Record(body=f"{j:020d}".encode() + b"x" * 80) for j in range(i, min(i + 1000, n))]))
                    for i in range(0, n, 1000)]
                for ticket in tickets:
                    await ticket


async def raw_read(url: str, streams: list[str]) -> tuple[int, float]:
    start = time.perf_counter()
    n = 0
    async with client(url) as s2:
        for name in streams:
            stream = s2.basin("source-bench").stream(name)
            tail = (await stream.check_tail()).seq_num
            async for batch in stream.read_session(start=s2_sdk.SeqNum(0), limit=s2_sdk.ReadLimit(count=tail)):
                n += len(batch.records)
    return n, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with LocalS2() as server:
        asyncio.run(load(server.url, args.records))
        spark = sluice.session("s2-source-bench")
        opts = {"s2.basin": "source-bench", "s2.endpoints.account": server.url, "s2.endpoints.basin": server.url,
                "s2.auth-token": "bench"}

        def spark_read(extra: dict) -> tuple[int, float]:
            start = time.perf_counter()
            n = spark.read.format("s2").options(**opts).options(**extra).load().count()
            return n, time.perf_counter() - start

        spark_read({"s2.streams": "one", "s2.end": "1000"})  # warm-up: workers, imports
        contenders = {
            "raw_sdk_one_stream": lambda: asyncio.run(raw_read(server.url, ["one"])),
            "sluice_one_stream_unsplit": lambda: spark_read({"s2.streams": "one",
                                                             "s2.max-records-per-partition": "0"}),
            "sluice_one_stream_in_ranges": lambda: spark_read({"s2.streams": "one", "s2.max-records-per-partition":
                                                               str(args.records // 8)}),
            "raw_sdk_8_streams": lambda: asyncio.run(raw_read(server.url, [f"multi/{i}" for i in range(8)])),
            "sluice_8_streams": lambda: spark_read({"s2.discovery-prefix": "multi/"}),
        }
        runs: dict[str, list[tuple[int, float]]] = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, run in contenders.items():
                runs[name].append(run())
        spark.stop()
    for name, results in runs.items():
        for n, _ in results:
            assert n == args.records - (args.records % 8 if "8" in name else 0), (name, n)
    rates = {name: round(results[0][0] / min(s for _, s in results)) for name, results in runs.items()}
    print(json.dumps({
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "records": args.records, "record_bytes": 100, "rounds": args.rounds, "records_per_s (best round)": rates,
        "seconds_per_round": {name: [round(s, 2) for _, s in results] for name, results in runs.items()},
        "one_stream_unsplit_vs_raw": round(rates["sluice_one_stream_unsplit"] / rates["raw_sdk_one_stream"], 3),
        "one_stream_ranges_vs_raw": round(rates["sluice_one_stream_in_ranges"] / rates["raw_sdk_one_stream"], 3),
        "eight_streams_vs_raw": round(rates["sluice_8_streams"] / rates["raw_sdk_8_streams"], 3),
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
