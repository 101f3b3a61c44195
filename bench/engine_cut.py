"""The engine alone, in one process: CPU per 2M rows handed over as Spark does (chunks of 10,000 row numbers with a
numpy array of sizes, what sluice_null's encoder makes) and cut into batches of N, against a store that acknowledges
every batch at once. Batches of 10,000 (one per chunk) leave the hand-over and the per-chunk work; the difference to
smaller batches is the per-batch work.

Run: `flock /tmp/sluice-cpu.lock .venv/bin/python -m bench.engine_cut [N] [--runs]` (default 500); `--runs`: the store
takes a run of full batches in one call (Store.submit_run, as sluice_null's does), else one submit per batch; another
checkout's engine: `PYTHONPATH=<its tree>/src` before it. Prints min and median of 7 runs (time.process_time: both
threads).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from sluice.engine import AsyncSinkWriter, SinkConfig, Store, completed_future


class _AtOnce(Store):
    name = "at-once"

    def submit(self, batch):
        return completed_future()


class _AtOnceRuns(_AtOnce):
    def submit_run(self, run):
        return completed_future()


def run(rows: int = 2_000_000, chunk: int = 10_000, batch: int = 500, runs: bool = False) -> tuple[float, int]:
    config = SinkConfig(batch_max_size=batch, requests_max_buffered=max(2000, batch + 1))
    sizes = np.full(chunk, 100, dtype=np.int64)
    started = time.process_time()
    with AsyncSinkWriter(_AtOnceRuns() if runs else _AtOnce(), config) as writer:
        for start in range(0, rows, chunk):
            writer.write_chunk(range(start, start + chunk), sizes)
        writer.finish()
    assert writer.stats.records == rows, writer.stats.records
    return time.process_time() - started, writer.stats.batches


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--runs"]
    takes_runs = "--runs" in sys.argv[1:]
    batch = int(args[0]) if args else 500
    runs = [run(batch=batch, runs=takes_runs) for _ in range(7)]
    cpu = sorted(r[0] for r in runs)
    print(f"batch {batch}{' (runs)' if takes_runs else ''}: {runs[0][1]} batches; CPU per 2M rows min "
          f"{cpu[0] * 1e3:.1f} ms, "
          f"median {cpu[3] * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
