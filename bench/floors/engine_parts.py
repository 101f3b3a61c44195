"""Where sluice_null's worker CPU goes beside the bare Arrow writer's, part by part, in one Spark session.

Run: `.venv/bin/python -m bench.floors.engine_parts [--rows 4000000] [--rounds 5] [--batch 500]`. Not part of `make
test`. 4M rows of a bigint and a 100-byte string (bench/floors/bare_writer.py's), cached, written by 2 tasks through,
alternating, round after round:
- `bare`: the bare Arrow writer (counts the rows);
- `encode`: sluice_null's encoder alone (row numbers, and the running sums of the body's sizes: its offsets),
  nothing kept;
- `floor`: the encoder, then each batch of --batch rows made a `Batch` and handed to `NullStore.submit` in a bare
  loop (its bytes summed per batch, two clock readings around the call): the least any engine that calls a Python
  `submit` per batch can do, without buffering, limiter or statistics;
- `handover`: encoded chunks handed to the engine, cut into one batch per Arrow batch (sink.batch.max-size=10000): the
  hand-over and the per-chunk work without the per-batch work;
- `per_batch`: the whole engine at sink.batch.max-size=--batch, against a NullStore that takes no runs: one `submit`
  per batch, as a store without `Store.submit_run` is handed them;
- `sluice_null`: the whole engine at sink.batch.max-size=--batch (its store takes a run of full batches per call).
Every side is one Python Data Source (`bench_parts`, its `side` option); `handover`, `per_batch` and `sluice_null` run
sluice_null's own writer inside it. Figures, medians: each write's wall time and the Python workers' CPU seconds
(bench/cpu.py), and their ratios to the bare writer's; the task workers' alone (`pyspark.worker`: without the Python
that Spark runs on the driver's side to look up, plan and commit a Python Data Source's write, which moves by
hundredths of a second between writes); and a task's CPU inside write() (`time.process_time`, nanoseconds, not the 10
ms ticks of /proc), with what of it ran on other threads than the task's own (the engine's manager thread).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
from datetime import UTC, datetime

from bench.cpu import _TICK, clocked_tree, processes
from bench.floors.bare_writer import rows_frame


def task_worker_seconds() -> dict[int, float]:
    """CPU seconds of each Python worker that runs tasks (not the driver-side planners: `pyspark.sql.worker.*`)."""
    return {pid: sum(int(x) for x in fields[11:15]) / _TICK for pid, _, fields, cmdline in processes()
            if "pyspark.daemon pyspark.worker" in cmdline}


def register_parts(spark, batch_rows: int, folder: str) -> str:
    """Registers format("bench_parts"): option `side` picks what its tasks do with the rows (the sides above); each
    task appends its CPU seconds inside write() (the process's, and its own thread's) to `folder`/<side>. A local
    folder: this bench runs Spark on this machine (local[2])."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    def bare(iterator):
        n = 0
        for batch in iterator:
            n += batch.num_rows

    def encode(iterator):
        from sluice.connectors.null import _RowNumbers

        encoder = _RowNumbers("body")
        for batch in iterator:
            encoder(batch)

    def floor(iterator):
        import time

        from sluice.connector import Batch, binary_sizes
        from sluice.connectors.null import NullStore

        store, clock, n = NullStore(), time.monotonic, 0
        for batch in iterator:
            sizes = binary_sizes(batch, "body")
            rows = range(n, n + batch.num_rows)
            n = rows.stop
            whole = batch.num_rows // batch_rows
            start = 0
            for size in sizes[:whole * batch_rows].reshape(whole, batch_rows).sum(axis=1).tolist():
                stop = start + batch_rows
                started = clock()
                store.submit(Batch(rows[start:stop], size, batch_rows, None, 0, sizes[start:stop]))
                clock() - started
                start = stop

    class PartsWriter(DataSourceArrowWriter):
        def __init__(self, side, engine):
            self.side, self.engine = side, engine

        def write(self, iterator):
            import time

            process, thread = time.process_time(), time.thread_time()
            if self.engine is not None:
                message = self.engine.write(iterator)
            else:
                {"bare": bare, "encode": encode, "floor": floor}[self.side](iterator)
                message = WriterCommitMessage()
            process, thread = time.process_time() - process, time.thread_time() - thread
            with open(os.path.join(folder, self.side), "a") as out:
                out.write(f"{process} {thread}\n")
            return message

        def commit(self, messages):
            if self.engine is not None:
                self.engine.commit(messages)

    class PartsSource(DataSource):
        @classmethod
        def name(cls):
            return "bench_parts"

        def writer(self, schema, overwrite):
            side = self.options["side"]
            engine = None
            if side in ("handover", "per_batch", "sluice_null"):
                from sluice.connectors.null import NullDataSource

                size = "10000" if side == "handover" else str(batch_rows)
                engine = NullDataSource({"sink.batch.max-size": size, "sink.requests.max-buffered": "20001"}).writer(
                    schema, overwrite)
                if side == "per_batch":
                    engine.plan = per_batch_plan(engine.plan)
            return PartsWriter(side, engine)

    def per_batch_plan(plan):
        """sluice_null's plan, its store without submit_run (defined here: pickled with the source, by value)."""
        import dataclasses

        from sluice.connector import Store, TaskWriter
        from sluice.connectors.null import NullStore, NullWritePlan, _RowNumbers

        class PerBatchNullStore(NullStore):
            submit_run = Store.submit_run

        @dataclasses.dataclass(frozen=True)
        class PerBatchPlan(NullWritePlan):
            def open_task(self, context):
                return TaskWriter(_RowNumbers(self.body_column), PerBatchNullStore())

        return PerBatchPlan(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.init})

    spark.dataSource.register(PartsSource)
    return "bench_parts"


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
    folder = tempfile.mkdtemp(prefix="sluice-engine-parts-")
    parts = register_parts(spark, args.batch, folder)
    sides = {side: (parts, {"side": side}) for side in ("bare", "encode", "floor", "handover", "per_batch",
                                                            "sluice_null")}
    df = rows_frame(spark, args.rows, with_id=True)
    wall: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    task_cpu: dict[str, list[float]] = {side: [] for side in sides}

    def write(side: str) -> tuple[float, float, float]:
        fmt, options = sides[side]
        before = task_worker_seconds()
        took, used = clocked_tree(lambda: df.write.format(fmt).options(**options).mode("append").save(), {})
        after = task_worker_seconds()
        tasks = sum(max(0.0, seconds - before.get(pid, 0.0)) for pid, seconds in after.items())
        return took, used.get("python_workers", 0.0), tasks

    for side in sides:
        write(side)  # warm-up: Python workers, imports
    for side in sides:
        os.remove(os.path.join(folder, side))
    for _ in range(args.rounds):
        for side in sides:
            took, used, tasks = write(side)
            wall[side].append(took)
            cpu[side].append(used)
            task_cpu[side].append(tasks)
        load.append(os.getloadavg()[0])
    summary = sluice.last_write_summary("sluice_null")
    assert summary and summary["records"] == args.rows, summary
    spark.stop()
    in_task: dict[str, tuple[float, float]] = {}  # medians of a task's (process, own thread) CPU seconds in write()
    for side in sides:
        with open(os.path.join(folder, side)) as f:
            pairs = [tuple(float(x) for x in line.split()) for line in f]
        in_task[side] = (statistics.median(p for p, _ in pairs), statistics.median(t for _, t in pairs))
    shutil.rmtree(folder)
    med = {side: (statistics.median(wall[side]), statistics.median(cpu[side]), statistics.median(task_cpu[side]))
           for side in sides}
    print(json.dumps({
        "started_utc": started.strftime("%Y-%m-%d %H:%M"), "ended_utc": datetime.now(UTC).strftime("%H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "load_1min": [round(x, 1) for x in load],
        "rows": args.rows, "rounds": args.rounds, "batch": args.batch,
        "wall_s": {side: round(m[0], 3) for side, m in med.items()},
        "worker_cpu_s": {side: round(m[1], 3) for side, m in med.items()},
        "bare_wall_over_side_wall": {side: round(med["bare"][0] / m[0], 3) for side, m in med.items()},
        "cpu_over_bare": {side: round(m[1] / med["bare"][1], 3) for side, m in med.items()},
        "task_worker_cpu_s": {side: round(m[2], 3) for side, m in med.items()},
        "task_cpu_over_bare": {side: round(m[2] / med["bare"][2], 3) for side, m in med.items()},
        "task_write_cpu_ms": {side: round(m[0] * 1000, 1) for side, m in in_task.items()},
        "task_write_cpu_over_bare": {side: round(m[0] / in_task["bare"][0], 3) for side, m in in_task.items()},
        "task_write_other_threads_ms": {side: round((m[0] - m[1]) * 1000, 1) for side, m in in_task.items()},
        "worker_cpu_per_write": {side: [round(x, 3) for x in cpu[side]] for side in sides},
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
