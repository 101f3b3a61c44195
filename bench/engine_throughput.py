"""Engine benchmark (issue: foundation). Run: `make bench` or `.venv/bin/python bench/engine_throughput.py`.

1. The engine alone with a no-op store, per mode: entries/s for 100-byte entries (no Spark).
2. Spark: the same cached DataFrame written through the engine (format sluice_null, unordered) vs a bare
   DataSourceArrowWriter that only counts rows, and the engine again with live metrics on (sluice.metrics.serve():
   every task reports to the collector each second). Runs alternate; ratios of medians are reported.
3. With --metrics: the engine alone (unordered) with and without a task's metrics pusher reporting to a live
   collector each second, alternating, medians.
4. With --read-metrics: a Spark batch read of a table-store table (`format("tablestore")`, summed so every row
   crosses into the JVM) with and without a collector its read tasks report to, alternating, medians.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import date

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


def spark_ratio(rows: int, rounds: int) -> dict:
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    import sluice
    import sluice.metrics

    class CountingWriter(DataSourceArrowWriter):
        def write(self, iterator):
            n = 0
            for batch in iterator:
                n += batch.num_rows
            return WriterCommitMessage()

    class CountingSource(DataSource):
        @classmethod
        def name(cls):
            return "bench_count"

        def writer(self, schema, overwrite):
            return CountingWriter()

    spark = sluice.session("sluice-bench", **{"spark.sql.shuffle.partitions": "2"})
    spark.dataSource.register(CountingSource)
    df = spark.range(0, rows, 1, 2).selectExpr("concat(lpad(cast(id AS string), 20, '0'), repeat('x', 80)) AS body")
    df = df.cache()
    df.count()

    def timed(fmt: str) -> float:
        start = time.perf_counter()
        df.write.format(fmt).mode("append").save()
        return time.perf_counter() - start

    def timed_with_metrics() -> float:
        with sluice.metrics.serve() as server:
            took = timed("sluice_null")
            reported = server.metrics.snapshot()["sluice_null"]["records"]
        assert reported == rows, f"the collector heard of {reported} records of {rows}"
        return took

    timed("bench_count")
    timed("sluice_null")  # warm-up: Python workers, imports
    bare, engine, metered = [], [], []
    for _ in range(rounds):
        bare.append(timed("bench_count"))
        engine.append(timed("sluice_null"))
        metered.append(timed_with_metrics())
    summary = sluice.last_write_summary("sluice_null")
    assert summary and summary["records"] == rows, summary
    spark.stop()
    bare_rate = rows / statistics.median(bare)
    engine_rate_ = rows / statistics.median(engine)
    metered_rate = rows / statistics.median(metered)
    return {
        "rows": rows, "rounds": rounds,
        "bare_arrow_writer_rows_per_s": round(bare_rate),
        "sluice_engine_rows_per_s": round(engine_rate_),
        "sluice_engine_with_metrics_rows_per_s": round(metered_rate),
        "ratio_engine_to_bare": round(engine_rate_ / bare_rate, 3),
        "ratio_metrics_on_to_off": round(metered_rate / engine_rate_, 3),
        "bare_seconds": [round(t, 3) for t in bare], "engine_seconds": [round(t, 3) for t in engine],
        "engine_with_metrics_seconds": [round(t, 3) for t in metered],
    }


def read_ratio(rows: int, rounds: int) -> dict:
    import tempfile

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--metrics", action="store_true", help="also the engine alone with and without metrics")
    parser.add_argument("--read-metrics", action="store_true", help="also a Spark read with and without metrics")
    args = parser.parse_args()
    result = {
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "python": platform.python_version(),
        "engine_entries_per_s": {m: round(engine_rate(m, args.entries))
                                 for m in ("unordered", "partition-ordered", "global-ordered")},
    }
    if args.metrics:
        result["metrics_engine_alone"] = metrics_overhead(args.entries, args.rounds)
    if not args.skip_spark:
        result["spark"] = spark_ratio(args.rows, args.rounds)
    if args.read_metrics:
        result["read_metrics_spark"] = read_ratio(args.rows, args.rounds)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
