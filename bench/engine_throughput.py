"""Engine benchmark. Run: `make bench` or `.venv/bin/python -m bench.engine_throughput`.

1. The engine alone with a no-op store, per mode: entries/s for 100-byte entries (no Spark).
2. Spark: the same cached DataFrame written through the engine (format sluice_null, unordered) vs a bare
   DataSourceArrowWriter that only counts rows, and the engine again with live metrics on (sluice.metrics.serve():
   every task reports to the collector each second). Runs alternate; ratios of medians are reported.
3. With --metrics: the engine alone (unordered) with and without a task's metrics pusher reporting to a live
   collector each second, alternating, medians.
4. With --read-metrics: a Spark batch read of a table-store table (`format("tablestore")`, summed so every row
   crosses into the JVM) with and without a collector its read tasks report to, alternating, medians.
5. With --before REV: part 2 for this checkout and for commit REV (from a git worktree), each in its own process and
   Spark session, alternating (checkout, REV, checkout, ...) --sessions times; medians of every session's figures.

Part 2 also gives the CPU seconds of the bench's own Python workers and JVM per write (bench/cpu.py), medians: on a
shared machine they move less than wall times.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import tempfile
import time
from datetime import date
from pathlib import Path

from bench.checkouts import ROOT, child_env, module_command, remove_worktree, worktree
from bench.cpu import clocked_tree
from bench.floors.bare_writer import register_bare_writer, rows_frame
from sluice.engine import AsyncSinkWriter, SinkConfig, Store, completed_future


class NoopStore(Store):
    name = "noop"

    def submit(self, batch):
        return completed_future()


def engine_rate(mode: str, entries: int, chunk: int = 10_000, observer=None) -> float:
    body = [b"x" * 100] * chunk
    sizes = [100] * chunk
    config = SinkConfig(mode=mode)
    keys = [i % config.parallelism for i in range(chunk)]
    start = time.perf_counter()
    with AsyncSinkWriter(NoopStore(), config, observer=observer) as writer:
        for _ in range(entries // chunk):
            if mode == "partition-ordered":
                writer.write_keyed(body, sizes, keys)
            else:
                writer.write_chunk(body, sizes)
        writer.finish()
    return entries / (time.perf_counter() - start)


def metrics_overhead(entries: int, rounds: int) -> dict:
    """The engine alone, unordered, with and without a metrics pusher reporting to a live collector."""
    import sluice.metrics
    from sluice.metrics import TaskIdentity
    from sluice.metrics._push import MetricsPusher

    plain, observed, reports = [], [], 0
    with sluice.metrics.serve() as server:
        for i in range(rounds):
            plain.append(engine_rate("unordered", entries))
            pusher, seen = MetricsPusher(server.target, TaskIdentity("bench", "w", i, 0, i, None)), []

            def observe(stats, pusher=pusher, seen=seen) -> None:
                seen.append(stats)
                pusher.offer(stats)

            observed.append(engine_rate("unordered", entries, observer=observe))
            if seen:
                pusher.close(seen[-1])
            reports += len(seen)
    return {"entries": entries, "rounds": rounds, "without_metrics_per_s": round(statistics.median(plain)),
            "with_metrics_per_s": round(statistics.median(observed)),
            "ratio_with_to_without": round(statistics.median(observed) / statistics.median(plain), 3),
            "reports_sent": reports}


def spark_ratio(rows: int, rounds: int, batch: int | None = None, with_id: bool = False,
                metered: bool = True) -> dict:
    import sluice
    import sluice.metrics

    # 2g: 4M rows with an id column stay cached (as in bench/floors/flink_async_sink.py)
    spark = sluice.session("sluice-bench", **{"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"})
    register_bare_writer(spark)
    df = rows_frame(spark, rows, with_id)
    options = {} if batch is None else {"sink.batch.max-size": str(batch)}

    cpu: dict[str, list[dict[str, float]]] = {}

    def timed(fmt: str, label: str | None = None) -> float:
        opts = options if fmt == "sluice_null" else {}
        took, used = clocked_tree(lambda: df.write.format(fmt).options(**opts).mode("append").save(), {})
        cpu.setdefault(label or fmt, []).append(used)
        return took

    def timed_with_metrics() -> float:
        with sluice.metrics.serve() as server:
            took = timed("sluice_null", "sluice_null with metrics")
            reported = server.metrics.snapshot()["sluice_null"]["records"]
        assert reported == rows, f"the collector heard of {reported} records of {rows}"
        return took

    timed("bench_count")
    timed("sluice_null")  # warm-up: Python workers, imports
    cpu.clear()
    bare, engine, metered = [], [], []
    for _ in range(rounds):
        bare.append(timed("bench_count"))
        engine.append(timed("sluice_null"))
        if metered:
            metered.append(timed_with_metrics())
    summary = sluice.last_write_summary("sluice_null")
    assert summary and summary["records"] == rows, summary
    spark.stop()
    bare_rate = rows / statistics.median(bare)
    engine_rate_ = rows / statistics.median(engine)
    metered_rate = rows / statistics.median(metered) if metered else None
    def cpu_median(fmt: str, component: str) -> float:
        return round(statistics.median(used.get(component, 0.0) for used in cpu[fmt]), 2)

    return {
        "rows": rows, "rounds": rounds, "batch": batch, "with_id": with_id,
        "cpu_s_per_write": {fmt: {part: cpu_median(fmt, part) for part in ("python_workers", "spark_jvm")}
                            for fmt in cpu},
        "bare_arrow_writer_rows_per_s": round(bare_rate),
        "sluice_engine_rows_per_s": round(engine_rate_),
        "sluice_engine_with_metrics_rows_per_s": metered_rate and round(metered_rate),
        "ratio_engine_to_bare": round(engine_rate_ / bare_rate, 3),
        "ratio_metrics_on_to_off": metered_rate and round(metered_rate / engine_rate_, 3),
        "bare_seconds": [round(t, 3) for t in bare], "engine_seconds": [round(t, 3) for t in engine],
        "engine_with_metrics_seconds": [round(t, 3) for t in metered],
    }


def read_ratio(rows: int, rounds: int) -> dict:

    import sluice
    import sluice.metrics

    spark = sluice.session("sluice-bench-read", **{"spark.sql.shuffle.partitions": "2"})
    with tempfile.TemporaryDirectory() as folder:
        store = {"table": "bench", "warehouse": f"{folder}/wh", "meta": f"{folder}/meta.db"}
        spark.range(0, rows, 1, 4).selectExpr("id", "repeat('x', 80) AS body").write.format("tablestore") \
            .options(**store).mode("append").save()

        def timed() -> float:
            start = time.perf_counter()
            total = spark.read.format("tablestore").options(**store).option("max-partition-bytes", 16 * 1024 * 1024) \
                .load().selectExpr("sum(length(body))").first()[0]
            assert total == rows * 80
            return time.perf_counter() - start

        def timed_with_metrics() -> float:
            with sluice.metrics.serve() as server:
                took = timed()
                heard = server.reads.snapshot()["tablestore"]["records"]
            assert heard == rows, f"the collector heard of {heard} records read of {rows}"
            return took

        timed()  # warm-up: Python workers, imports
        plain, observed = [], []
        for _ in range(rounds):
            plain.append(timed())
            observed.append(timed_with_metrics())
    spark.stop()
    return {"rows": rows, "rounds": rounds, "without_metrics_rows_per_s": round(rows / statistics.median(plain)),
            "with_metrics_rows_per_s": round(rows / statistics.median(observed)),
            "ratio_with_to_without": round(statistics.median(plain) / statistics.median(observed), 3),
            "without_seconds": [round(t, 3) for t in plain], "with_seconds": [round(t, 3) for t in observed]}


def session_run(tree: Path | None, rows: int, rounds: int, extra: list[str]) -> dict:
    """Part 2 in a child process: this checkout's sluice (tree None), or the one in folder `tree` (a worktree's)."""
    env = child_env(tree)  # the child and its Spark workers import that sluice
    out = subprocess.run(module_command("bench.engine_throughput", "--child", "--rows", str(rows), "--rounds",
                                        str(rounds), *extra), env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the bench in {tree or ROOT} exited with {out.returncode}:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def before_after(rev: str, rows: int, rounds: int, sessions: int, extra: list[str]) -> dict:
    """Part 2 alternating between this checkout and commit `rev`, one Spark session each time."""
    tree, importable = worktree(rev)
    runs: dict[str, list[dict]] = {"after": [], "before": []}
    try:
        for _ in range(sessions):
            runs["after"].append(session_run(None, rows, rounds, extra))
            runs["before"].append(session_run(importable, rows, rounds, extra))
    finally:
        remove_worktree(tree)

    def median(side: str, *path: str) -> float:
        values = []
        for run in runs[side]:
            for key in path:
                run = run[key]
            values.append(run)
        return statistics.median(values)

    out: dict = {"rev": rev, "rows": rows, "rounds_per_session": rounds, "sessions_each": sessions, "options": extra}
    for side in ("after", "before"):
        out[side] = {
            "bare_arrow_writer_rows_per_s": round(median(side, "bare_arrow_writer_rows_per_s")),
            "sluice_engine_rows_per_s": round(median(side, "sluice_engine_rows_per_s")),
            "ratio_engine_to_bare": round(median(side, "ratio_engine_to_bare"), 3),
            "ratio_metrics_on_to_off": None if "--no-metered" in extra else
            round(median(side, "ratio_metrics_on_to_off"), 3),
            "python_worker_cpu_s": {fmt: median(side, "cpu_s_per_write", fmt, "python_workers")
                                    for fmt in runs[side][0]["cpu_s_per_write"]},
            "ratios_per_session": [run["ratio_engine_to_bare"] for run in runs[side]],
        }
    out["engine_after_vs_before"] = round(out["after"]["sluice_engine_rows_per_s"]
                                          / out["before"]["sluice_engine_rows_per_s"], 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--metrics", action="store_true", help="also the engine alone with and without metrics")
    parser.add_argument("--read-metrics", action="store_true", help="also a Spark read with and without metrics")
    parser.add_argument("--before", metavar="REV", help="part 2 alternating with commit REV's sluice (see above)")
    parser.add_argument("--sessions", type=int, default=3, help="with --before: Spark sessions of each side")
    parser.add_argument("--batch", type=int, help="part 2: sluice_null's sink.batch.max-size (default: its own)")
    parser.add_argument("--id", action="store_true", help="part 2: a bigint id column beside the 100-byte string")
    parser.add_argument("--no-metered", action="store_true", help="part 2: skip the writes with live metrics on")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one side of --before: part 2 alone, its JSON on the last line
        print(json.dumps(spark_ratio(args.rows, args.rounds, args.batch, args.id, not args.no_metered)))
        return 0
    if args.before:
        extra = [*(["--batch", str(args.batch)] if args.batch else []), *(["--id"] if args.id else []),
                 *(["--no-metered"] if args.no_metered else [])]
        print(json.dumps(before_after(args.before, args.rows, args.rounds, args.sessions, extra), indent=2))
        return 0
    result = {
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "python": platform.python_version(),
        "engine_entries_per_s": {m: round(engine_rate(m, args.entries))
                                 for m in ("unordered", "partition-ordered", "global-ordered")},
    }
    if args.metrics:
        result["metrics_engine_alone"] = metrics_overhead(args.entries, args.rounds)
    if not args.skip_spark:
        result["spark"] = spark_ratio(args.rows, args.rounds, args.batch, args.id, not args.no_metered)
    if args.read_metrics:
        result["read_metrics_spark"] = read_ratio(args.rows, args.rounds)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
