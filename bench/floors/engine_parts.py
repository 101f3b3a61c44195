"""Where sluice_null's worker CPU goes beside the bare Arrow writer's, part by part, in one Spark session.

Run: `.venv/bin/python -m bench.floors.engine_parts [--rows 4000000] [--rounds 5] [--batch 500]`. Not part of `make
test`. 4M rows of a bigint and a 100-byte string (bench/floors/bare_writer.py's), cached, written by 2 tasks through,
alternating, round after round:
- `bare`: the bare Arrow writer (counts the rows);
- `encode`: sluice_null's encoder alone (row numbers and the body's sizes from its offsets), nothing kept;
- `handover`: encoded chunks handed to the engine, cut into one batch per Arrow batch (sink.batch.max-size=10000): the
  hand-over and the per-chunk work without the per-batch work;
- `sluice_null`: the whole engine at sink.batch.max-size=--batch.
Figures: the medians of each write's wall time and of the Python workers' CPU seconds (bench/cpu.py), and their ratios
to the bare writer's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from datetime import UTC, datetime

from bench.cpu import clocked_tree
from bench.floors.bare_writer import register_bare_writer, rows_frame


def register_encoder_only(spark) -> str:
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class EncodingWriter(DataSourceArrowWriter):
        def write(self, iterator):
            from sluice.connector import binary_sizes

            n = 0
            for batch in iterator:
                rows = range(n, n + batch.num_rows)
                binary_sizes(batch, "body")
                n = rows.stop
            return WriterCommitMessage()

    class EncodingSource(DataSource):
        @classmethod
        def name(cls):
            return "bench_encode"

        def writer(self, schema, overwrite):
            return EncodingWriter()

    spark.dataSource.register(EncodingSource)
    return "bench_encode"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()

    import sluice

    started = datetime.now(UTC)
    load = [os.getloadavg()[0]]
    spark = sluice.session("sluice-engine-parts", **{"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"})
    sides = {
        "bare": (register_bare_writer(spark), {}),
        "encode": (register_encoder_only(spark), {}),
        "handover": ("sluice_null", {"sink.batch.max-size": "10000", "sink.requests.max-buffered": "20001"}),
        "sluice_null": ("sluice_null", {"sink.batch.max-size": str(args.batch)}),
    }
    df = rows_frame(spark, args.rows, with_id=True)
    wall: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}

    def write(side: str) -> tuple[float, float]:
        fmt, options = sides[side]
        took, used = clocked_tree(lambda: df.write.format(fmt).options(**options).mode("append").save(), {})
        return took, used.get("python_workers", 0.0)

    for side in sides:
        write(side)  # warm-up: Python workers, imports
    for _ in range(args.rounds):
        for side in sides:
            took, used = write(side)
            wall[side].append(took)
            cpu[side].append(used)
        load.append(os.getloadavg()[0])
    summary = sluice.last_write_summary("sluice_null")
    assert summary and summary["records"] == args.rows, summary
    spark.stop()
    med = {side: (statistics.median(wall[side]), statistics.median(cpu[side])) for side in sides}
    print(json.dumps({
        "started_utc": started.strftime("%Y-%m-%d %H:%M"), "ended_utc": datetime.now(UTC).strftime("%H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "load_1min": [round(x, 1) for x in load],
        "rows": args.rows, "rounds": args.rounds, "batch": args.batch,
        "wall_s": {side: round(m[0], 3) for side, m in med.items()},
        "worker_cpu_s": {side: round(m[1], 3) for side, m in med.items()},
        "bare_wall_over_side_wall": {side: round(med["bare"][0] / m[0], 3) for side, m in med.items()},
        "cpu_over_bare": {side: round(m[1] / med["bare"][1], 3) for side, m in med.items()},
        "worker_cpu_per_write": {side: [round(x, 3) for x in cpu[side]] for side in sides},
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
