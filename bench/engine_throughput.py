"""Engine benchmark (issue: foundation). Run: `make bench` or `.venv/bin/python bench/engine_throughput.py`.

1. The engine alone with a no-op store, per mode: entries/s for 100-byte entries (no Spark).
2. Spark: the same cached DataFrame written through the engine (format sluice_null, unordered) vs a bare
   DataSourceArrowWriter that only counts rows. Runs alternate; the ratio of medians is reported.
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


def engine_rate(mode: str, entries: int, chunk: int = 10_000) -> float:
    body = [b"x" * 100] * chunk
    sizes = [100] * chunk
    config = SinkConfig(mode=mode)
    keys = [i % config.parallelism for i in range(chunk)]
    start = time.perf_counter()
    with AsyncSinkWriter(NoopStore(), config) as writer:
        for _ in range(entries // chunk):
            if mode == "partition-ordered":
                writer.write_keyed(body, sizes, keys)
            else:
                writer.write_chunk(body, sizes)
        writer.finish()
    return entries / (time.perf_counter() - start)


def spark_ratio(rows: int, rounds: int) -> dict:
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    import sluice

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

    timed("bench_count")
    timed("sluice_null")  # warm-up: Python workers, imports
    bare, engine = [], []
    for _ in range(rounds):
        bare.append(timed("bench_count"))
        engine.append(timed("sluice_null"))
    summary = sluice.last_write_summary("sluice_null")
    assert summary and summary["records"] == rows, summary
    spark.stop()
    bare_rate = rows / statistics.median(bare)
    engine_rate_ = rows / statistics.median(engine)
    return {
        "rows": rows, "rounds": rounds,
        "bare_arrow_writer_rows_per_s": round(bare_rate),
        "sluice_engine_rows_per_s": round(engine_rate_),
        "ratio_engine_to_bare": round(engine_rate_ / bare_rate, 3),
        "bare_seconds": [round(t, 3) for t in bare], "engine_seconds": [round(t, 3) for t in engine],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-spark", action="store_true")
    args = parser.parse_args()
    result = {
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "python": platform.python_version(),
        "engine_entries_per_s": {m: round(engine_rate(m, args.entries))
                                 for m in ("unordered", "partition-ordered", "global-ordered")},
    }
    if not args.skip_spark:
        result["spark"] = spark_ratio(args.rows, args.rounds)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
