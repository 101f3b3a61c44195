"""Cost as the work grows: time per row and a Python worker's peak memory for 1M -> 10M -> 50M
rows through `sluice_null` and `postgres`, beside the bare Arrow writer (bench/floors/bare_writer.py) on the same rows.

Run: `.venv/bin/python -m bench.scale` (defaults: sizes 1,000,000 10,000,000 50,000,000; formats bench_count,
sluice_null, postgres; a throwaway PostgreSQL from LocalPostgres). The rows (a 100-byte string,
bench/floors/bare_writer.py's BODY) are made in place in 2 partitions, not cached: 50M rows would not fit the default
driver memory, and making them costs the same per row at every size. Each write's Python workers are sampled every 0.2 s
from /proc (VmRSS of this process's pyspark.daemon children); `peak_worker_mib` is the largest seen during that write.

What to read: ns/row at each size against the smallest (flat means within 10%), and the peak worker memory (flat
means it does not grow with the rows). The streams side of the same question (1 -> 1,000 target streams) is
bench/stores/s2_many_streams.py; the hour-long streaming write is the soak's (bench/soak/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from datetime import date

from bench.cpu import processes
from bench.floors.bare_writer import BODY, register_bare_writer


def worker_rss_mib(root: int) -> float:
    """The largest VmRSS among the pyspark.daemon descendants of process `root`, MiB."""
    children: dict[int, list[int]] = {}
    daemons: set[int] = set()
    for pid, _, fields, cmdline in processes():
        children.setdefault(int(fields[1]), []).append(pid)  # fields[1]: the parent's pid
        if "pyspark.daemon" in cmdline or "pyspark/daemon" in cmdline:
            daemons.add(pid)
    mine, todo = set(), [root]
    while todo:
        pid = todo.pop()
        mine.add(pid)
        todo.extend(children.get(pid, []))
    peak = 0.0
    for pid in mine & daemons:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        peak = max(peak, int(line.split()[1]) / 1024)
        except OSError:
            continue
    return peak


class PeakWorkerMemory:
    """Samples the Python workers' VmRSS from a thread while a write runs; `.peak` after the `with`."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s, self.peak = every_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, worker_rss_mib(os.getpid()))
            self._stop.wait(self.every_s)

    def __enter__(self) -> PeakWorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, worker_rss_mib(os.getpid()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,10000000,50000000")
    parser.add_argument("--formats", default="bench_count,sluice_null,postgres")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    formats = args.formats.split(",")

    import psycopg

    import sluice
    from sluice.testing import LocalPostgres

    started_load = os.getloadavg()
    spark = sluice.session("bench-scale", master="local[2]", **{"spark.sql.shuffle.partitions": "2"})
    bare = register_bare_writer(spark)
    pg = LocalPostgres().start() if "postgres" in formats else None
    figures: list[dict] = []
    try:
        # A warm-up write of 10,000 rows per format, not counted: a worker's first task imports pyspark, pyarrow
        # and the format's client; the first write of a format plans it for the first time.
        for n in [10_000, *sizes]:
            for fmt in formats:
                df = spark.range(0, n, 1, 2).selectExpr(BODY)
                writer = df.write.mode("append")
                if fmt == "postgres":
                    with psycopg.connect(pg.url, autocommit=True) as c:
                        c.execute("DROP TABLE IF EXISTS scale; CREATE UNLOGGED TABLE scale (body text)")
                    writer = writer.format("postgres").option("url", pg.url).option("table", "scale")
                else:
                    writer = writer.format(bare if fmt == "bench_count" else fmt)
                with PeakWorkerMemory() as memory:
                    t0 = time.perf_counter()
                    writer.save()
                    seconds = time.perf_counter() - t0
                if fmt == "postgres":
                    with psycopg.connect(pg.url) as c:
                        stored = c.execute("SELECT count(*) FROM scale").fetchone()[0]
                    if stored != n:
                        raise SystemExit(f"postgres stored {stored} rows of {n}")
                if n == 10_000:
                    continue
                figures.append({"format": fmt, "rows": n, "seconds": round(seconds, 2),
                                "ns_per_row": round(seconds / n * 1e9, 1), "peak_worker_mib": round(memory.peak, 1)})
                print(f"  {fmt} {n:,} rows: {seconds:.2f} s, peak worker {memory.peak:.0f} MiB", flush=True)
    finally:
        spark.stop()
        if pg is not None:
            pg.stop()
    ended_load = os.getloadavg()
    if args.json:
        print(json.dumps({"figures": figures, "load": [started_load, ended_load]}))
        return 0
    print(f"\n{date.today()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load {started_load[0]:.2f} -> {ended_load[0]:.2f}")
    print("| format | rows | seconds | ns/row | vs smallest | peak worker MiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for fmt in formats:
        mine = [f for f in figures if f["format"] == fmt]
        first = mine[0]["ns_per_row"]
        for f in mine:
            print(f"| {fmt} | {f['rows']:,} | {f['seconds']} | {f['ns_per_row']} | {f['ns_per_row'] / first:.2f} | "
                  f"{f['peak_worker_mib']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
