"""Ways of handing an Arrow batch to the engine thread, side by side in one Spark session (issue 67 item 5).

Run: `.venv/bin/python -m bench.floors.handover_variants [--rows 4000000] [--rounds 5] [--batch 500]`. Not part of
`make test`. The rows and the bare writer of bench/floors/engine_parts.py; each side writes through sluice_null's plan
with `AsyncSinkWriter.handover` (and the interpreter's switch interval) set in the task before its writer starts:
- `wake`: the engine as it is (the caller appends to the ring and wakes the manager thread every time);
- `inline`: while the manager thread waits with nothing buffered or in flight and the store has acknowledged every
  batch at once, the caller admits its chunk and runs the pump itself, under the lock;
- `sync`: the caller waits until the manager thread has taken its chunk and gone back to waiting;
- `every2`: the caller wakes the manager thread only when a second chunk waits (or for a checkpoint);
- `switch`: `wake` with `sys.setswitchinterval(0.05)` (10x the default) in the worker.
Sides `h-*` cut one batch per Arrow batch (sink.batch.max-size=10000), `n-*` batches of --batch. Figures: the medians
of each write's wall time and of the Python workers' CPU seconds (bench/cpu.py), and their ratios to the bare writer's.
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
from bench.floors.engine_parts import register_encoder_only


def register_variant(spark, variant: str, switch: float) -> str:
    from dataclasses import dataclass

    from sluice.connectors.null import NullDataSource, NullWritePlan

    name = f"bench_null_{variant}_{int(switch * 1e4)}"

    @dataclass(frozen=True)
    class VariantPlan(NullWritePlan):
        def open_task(self, context):
            import sys

            from sluice.engine import AsyncSinkWriter

            AsyncSinkWriter.handover = variant
            sys.setswitchinterval(switch)
            return NullWritePlan.open_task(self, context)

    class VariantSource(NullDataSource):
        format_name = name

        def plan_write(self, opts, schema, config, overwrite):
            plan = super().plan_write(opts, schema, config, overwrite)
            return VariantPlan(name, opts, schema, config, plan.body_column)

    spark.dataSource.register(VariantSource)
    return name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--sides", default="bare,encode,h-wake,h-inline,h-sync,h-every2,h-switch,n-wake,n-inline")
    args = parser.parse_args()

    import sluice

    started = datetime.now(UTC)
    load = [os.getloadavg()[0]]
    spark = sluice.session("sluice-handover-variants",
                           **{"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"})
    sides: dict[str, tuple[str, dict[str, str]]] = {}
    for side in args.sides.split(","):
        if side == "bare":
            sides[side] = (register_bare_writer(spark), {})
        elif side == "encode":
            sides[side] = (register_encoder_only(spark), {})
        else:
            shape, variant = side.split("-")
            switch = 0.05 if variant == "switch" else 0.005
            fmt = register_variant(spark, "wake" if variant == "switch" else variant, switch)
            options = {"sink.batch.max-size": "10000", "sink.requests.max-buffered": "20001"} if shape == "h" else \
                {"sink.batch.max-size": str(args.batch)}
            sides[side] = (fmt, options)
    df = rows_frame(spark, args.rows, with_id=True)
    wall: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}

    def write(side: str) -> tuple[float, float]:
        fmt, options = sides[side]
        took, used = clocked_tree(lambda: df.write.format(fmt).options(**options).mode("append").save(), {})
        if fmt.startswith("bench_null"):
            summary = sluice.last_write_summary(fmt)
            assert summary and summary["records"] == args.rows, summary
        return took, used.get("python_workers", 0.0)

    for side in sides:
        write(side)  # warm-up: Python workers, imports
    for _ in range(args.rounds):
        for side in sides:
            took, used = write(side)
            wall[side].append(took)
            cpu[side].append(used)
        load.append(os.getloadavg()[0])
    spark.stop()
    med = {side: (statistics.median(wall[side]), statistics.median(cpu[side])) for side in sides}
    bare = med.get("bare", next(iter(med.values())))
    print(json.dumps({
        "started_utc": started.strftime("%Y-%m-%d %H:%M"), "ended_utc": datetime.now(UTC).strftime("%H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "load_1min": [round(x, 1) for x in load],
        "rows": args.rows, "rounds": args.rounds, "batch": args.batch,
        "wall_s": {side: round(m[0], 3) for side, m in med.items()},
        "worker_cpu_s": {side: round(m[1], 3) for side, m in med.items()},
        "bare_wall_over_side_wall": {side: round(bare[0] / m[0], 3) for side, m in med.items()},
        "cpu_over_bare": {side: round(m[1] / bare[1], 3) for side, m in med.items()},
        "worker_cpu_per_write": {side: [round(x, 3) for x in cpu[side]] for side in sides},
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
