"""What sluice_null's task costs per Arrow batch when the batches arrive as Spark hands them, without Spark: read one by
one from a socket another process writes Arrow's IPC stream into, against the same batches already in memory.

Run: `.venv/bin/python -m bench.floors.socket_feed [--rounds 12] [--batch 500] [--preload]`. Not part of `make test`.
A forked process writes 200 Arrow batches of 10,000 rows (a bigint and a 100-byte string: a 2M-row task of
bench/engine_throughput.py's shape, in Spark's default batch size) into a socket pair, once per side and round; this
process reads them (`pyarrow.ipc.open_stream`) and, side after side within each round:
- `bare`: counts the rows (the bare Arrow writer);
- `encode`: runs sluice_null's encoder on each batch, nothing kept;
- `sluice_null`: hands the batches to sluice_null's writer (the engine, sink.batch.max-size=--batch).
Figures: the reading thread's CPU per 200 batches (`time.thread_time`, nanoseconds; the engine's manager thread apart),
medians of the rounds after the first, and what each side costs over `bare`. With --preload each side first reads the
whole stream into a list, so its per-batch work runs without a socket read between two batches: the same code then
costs several times less, which is the part of its cost that comes from each read leaving the CPU's caches cold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import time
from datetime import UTC, datetime

BATCHES, ROWS = 200, 10_000
SIDES = ("bare", "encode", "sluice_null")


def _batches():
    import numpy as np
    import pyarrow as pa

    out = []
    for k in range(BATCHES):
        ids = np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)
        body = pa.array([f"{i:020d}" + "x" * 80 for i in ids.tolist()])
        out.append(pa.RecordBatch.from_arrays([pa.array(ids), body], names=["id", "body"]))
    return out


def _feed(sock: socket.socket, streams: int) -> None:
    import pyarrow as pa

    batches = _batches()
    with sock.makefile("wb", buffering=65536) as out:
        for _ in range(streams):
            with pa.ipc.new_stream(out, batches[0].schema) as writer:
                for batch in batches:
                    writer.write_batch(batch)
            out.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--preload", action="store_true", help="read each stream whole before the side runs")
    args = parser.parse_args()

    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from sluice.connectors.null import NullDataSource, _RowNumbers

    started = datetime.now(UTC)
    ours, theirs = socket.socketpair()
    child = os.fork()
    if child == 0:  # the feeder: Spark's JVM side of the socket
        ours.close()
        _feed(theirs, args.rounds * len(SIDES))
        os._exit(0)
    theirs.close()
    schema = StructType([StructField("id", LongType()), StructField("body", StringType())])
    options = {"sink.batch.max-size": str(args.batch), "sink.requests.max-buffered": "20001"}
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    with ours.makefile("rb", buffering=65536) as stream:
        for _ in range(args.rounds):
            for side in SIDES:
                reader = pa.ipc.open_stream(stream)
                batches = list(reader) if args.preload else reader
                writer = NullDataSource(options).writer(schema, False) if side == "sluice_null" else None
                clock = time.thread_time()
                if side == "bare":
                    rows = 0
                    for batch in batches:
                        rows += batch.num_rows
                elif side == "encode":
                    encode = _RowNumbers("body")
                    for batch in batches:
                        encode(batch)
                else:
                    assert writer is not None
                    writer.write(iter(batches))
                cpu[side].append(time.thread_time() - clock)
    os.waitpid(child, 0)
    med = {side: statistics.median(cpu[side][1:]) * 1000 for side in SIDES}
    print(json.dumps({
        "started_utc": started.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "batches": BATCHES, "rows_per_batch": ROWS, "batch": args.batch, "rounds": args.rounds,
        "preload": args.preload,
        "thread_cpu_ms": {side: round(m, 1) for side, m in med.items()},
        "over_bare_ms": {side: round(m - med["bare"], 1) for side, m in med.items()},
        "over_bare_us_per_arrow_batch": {side: round((m - med["bare"]) * 1000 / BATCHES, 1) for side, m in med.items()},
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
