"""Freshness benchmark: how long a committed change takes to reach its target, measured as a new user would.

Run: `.venv/bin/python bench/latency.py [--rates 1000,10000,50000] [--seconds 30] [--warmup 10]` (starts a
throwaway PostgreSQL with wal_level=logical; nothing else should run).

The hop: a writer thread commits transactions of 10, 100 or 500 rows, 100 a second (1k, 10k, 50k changes/s), into
`src`; `spark.readStream.format("postgres_changes")` with the default trigger copies them into `dst`
(`format("postgres")`, append) whose `arrived_at` column defaults to `clock_timestamp()`. A change's latency is
its arrival minus its transaction's commit time (`_commit_time`, from pgoutput's Begin message): one server, one
clock. Changes committed during the warm-up are left out. Per rate: p50/p95/p99/max and the rate sustained (changes
that arrived over the measured seconds), and where the time went:
- wait: from the commit to the start of the micro-batch that read it (Spark starts a batch when the previous one
  ends: with the default trigger this is the previous batch's length, on average half of it);
- in batch: from the batch's start to the row's arrival;
- Spark's phases of the batches (durationMs of the query's progress, medians): latestOffset (the source planning
  the batch end), queryPlanning, addBatch (the fetch and the write), walCommit and commitOffsets (checkpoint files).
Spark's own floor on this machine, the same query shape with nothing to do: the median micro-batch cycle
(triggerExecution) of a minimal Python streaming source into a Python sink, and of the JVM's `rate` source into
`noop`. Spark's own figures come from `query.recentProgress`.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from datetime import date, datetime
from pathlib import Path

import psycopg
import pyarrow as pa

# This script's own folder comes first on sys.path, where bench/cassandra.py would shadow the driver's package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

BATCHES_PER_SECOND = 100  # the writer's transactions per second
PUBLICATION = "latency_pub"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Writer(threading.Thread):
    """Commits `rows` rows per transaction, BATCHES_PER_SECOND transactions a second, on a fixed schedule (a late
    transaction does not push the later ones back), until stop()."""

    def __init__(self, url: str, rows: int) -> None:
        super().__init__(daemon=True)
        self.url, self.rows = url, rows
        self.committed = 0
        self.behind_max_s = 0.0  # the most the writer fell behind its schedule: the load was not offered if large
        self._halt = threading.Event()

    def run(self) -> None:
        payload = "x" * 40
        with psycopg.connect(self.url, autocommit=True) as conn:
            began = time.monotonic()
            n = 0
            while not self._halt.is_set():
                due = began + n / BATCHES_PER_SECOND
                now = time.monotonic()
                if due > now:
                    self._halt.wait(due - now)
                else:
                    self.behind_max_s = max(self.behind_max_s, now - due)
                with conn.transaction():
                    conn.execute("INSERT INTO src (n, payload) SELECT g, %s FROM generate_series(1, %s) g",
                                 (payload, self.rows))
                self.committed += self.rows
                n += 1

    def stop(self) -> None:
        self._halt.set()
        self.join()


def phase_medians(progress: list[dict]) -> dict[str, float]:
    phases: dict[str, list[float]] = {}
    for p in progress:
        if p.get("numInputRows", 0) == 0:
            continue
        for name, ms in p.get("durationMs", {}).items():
            phases.setdefault(name, []).append(ms)
    return {name: statistics.median(ms) for name, ms in sorted(phases.items())}


def measure_rate(spark, pg_url: str, rate: int, seconds: float, warmup: float, workdir: str) -> dict:
    rows = rate // BATCHES_PER_SECOND
    tag = f"r{rate}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS src, dst_{tag}")
        conn.execute("CREATE TABLE src (id bigserial PRIMARY KEY, n int, payload text)")
        conn.execute(f"CREATE TABLE dst_{tag} (id bigint, n int, payload text, commit_time timestamptz, "
                     "arrived_at timestamptz DEFAULT clock_timestamp())")
        conn.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}")
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE src")
    source = (spark.readStream.format("postgres_changes")
              .options(url=pg_url, table="src", publication=PUBLICATION, slot=f"latency_{tag}").load())
    query = (source.selectExpr("id", "n", "payload", "_commit_time AS commit_time").writeStream
             .format("postgres").options(url=pg_url, table=f"dst_{tag}")
             .option("checkpointLocation", os.path.join(workdir, f"checkpoint-{tag}")).start())
    writer = Writer(pg_url, rows)
    try:
        # Wait for the query's first (empty snapshot) batch before offering load: its start is not freshness.
        deadline = time.monotonic() + 120
        while not query.recentProgress and time.monotonic() < deadline:
            query.awaitTermination(0.2)
        assert query.recentProgress, f"the query made no progress in 120 s: {query.exception()}"
        writer.start()
        time.sleep(warmup)  # the load's pace, not an event to wait for
        with psycopg.connect(pg_url, autocommit=True) as conn:
            measure_from = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        time.sleep(seconds)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            measure_to = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        writer.stop()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            total = conn.execute("SELECT count(*) FROM src").fetchone()[0]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # every committed change delivered: the query caught up
            with psycopg.connect(pg_url, autocommit=True) as conn:
                if conn.execute(f"SELECT count(*) FROM dst_{tag}").fetchone()[0] >= total:
                    break
            query.awaitTermination(0.5)
        progress = [json.loads(p.json) for p in query.recentProgress]
    finally:
        if writer.is_alive():
            writer.stop()
        query.stop()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        lat = conn.execute(
            f"SELECT extract(epoch FROM arrived_at - commit_time) * 1000, extract(epoch FROM commit_time), "
            f"extract(epoch FROM arrived_at) FROM dst_{tag} WHERE commit_time >= %s AND commit_time < %s",
            (measure_from, measure_to)).fetchall()
        arrived = conn.execute(f"SELECT count(*) FROM dst_{tag} WHERE arrived_at >= %s AND arrived_at < %s",
                               (measure_from, measure_to)).fetchone()[0]
        delivered = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM dst_{tag}").fetchone()
        conn.execute(f"SELECT pg_drop_replication_slot('latency_{tag}')")
    assert delivered[0] == delivered[1] == total, f"delivered {delivered} of {total} changes"
    latencies = [float(r[0]) for r in lat]
    # Split each change's latency at the start of the batch that delivered it (batch starts from the progress).
    starts = sorted(_epoch(p["timestamp"]) for p in progress if p.get("numInputRows", 0))
    waits, in_batch = [], []
    for _, committed, arrived_at in lat:
        i = bisect.bisect_left(starts, float(committed))
        started = starts[i] if i < len(starts) else None
        if started is not None and started <= float(arrived_at):
            waits.append((started - float(committed)) * 1000)
            in_batch.append((float(arrived_at) - started) * 1000)
    batches = [p for p in progress if p.get("numInputRows", 0)]
    return {
        "rate_offered": rate, "rows_per_transaction": rows, "changes_measured": len(latencies),
        "sustained_per_s": round(arrived / seconds), "writer_behind_max_s": round(writer.behind_max_s, 3),
        "p50_ms": round(percentile(latencies, 0.50)), "p95_ms": round(percentile(latencies, 0.95)),
        "p99_ms": round(percentile(latencies, 0.99)), "max_ms": round(max(latencies)),
        "wait_p50_ms": round(percentile(waits, 0.5)) if waits else None,
        "in_batch_p50_ms": round(percentile(in_batch, 0.5)) if in_batch else None,
        "batches": len(batches), "rows_per_batch_median": statistics.median(p["numInputRows"] for p in batches),
        "phases_median_ms": phase_medians(progress),
    }


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def spark_floor(spark, workdir: str, batches: int = 20) -> dict[str, float]:
    """Median micro-batch cycle with nothing to do: a minimal Python source into a Python sink, and the JVM's rate
    source into noop, both with the default trigger."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        InputPartition,
        WriterCommitMessage,
    )

    class TickReader(DataSourceStreamReader):
        def __init__(self) -> None:
            self.tick = 0

        def initialOffset(self) -> dict:
            return {"tick": 0}

        def latestOffset(self) -> dict:
            self.tick += 1  # one new row per batch: every batch has input
            return {"tick": self.tick}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            return [InputPartition(end["tick"])]

        def read(self, partition):
            yield pa.RecordBatch.from_pydict({"tick": [partition.value]})

    class TickWriter(DataSourceStreamWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batch_id) -> None:
            pass

        def abort(self, messages, batch_id) -> None:
            pass

    class Tick(DataSource):
        @classmethod
        def name(cls) -> str:
            return "latency_tick"

        def schema(self) -> str:
            return "tick long"

        def streamReader(self, schema):
            return TickReader()

        def streamWriter(self, schema, overwrite):
            return TickWriter()

    spark.dataSource.register(Tick)
    out = {}
    for label, reader, sink in (("python_source_into_python_sink", spark.readStream.format("latency_tick"),
                                 "latency_tick"),
                                ("jvm_rate_into_noop", spark.readStream.format("rate").option("rowsPerSecond", 1000),
                                 "noop")):
        query = (reader.load().writeStream.format(sink)
                 .option("checkpointLocation", os.path.join(workdir, f"floor-{label}")).start())
        try:
            while len([p for p in query.recentProgress if p.numInputRows]) < batches + 5:
                query.awaitTermination(0.5)
            cycles = [p.durationMs["triggerExecution"] for p in query.recentProgress if p.numInputRows][5:]
        finally:
            query.stop()
        out[f"{label}_cycle_p50_ms"] = statistics.median(cycles)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,10000,50000", help="changes/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=30, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=10, help="seconds of load before measuring")
    args = parser.parse_args()

    import pyspark

    import sluice
    from sluice.testing import LocalPostgres

    results: dict = {"date": date.today().isoformat(), "machine": f"{os.cpu_count()} cores, {platform.machine()}",
                     "pyspark": pyspark.__version__, "rates": []}
    with tempfile.TemporaryDirectory(prefix="sluice-latency-") as workdir, \
            LocalPostgres(settings={"wal_level": "logical", "max_replication_slots": "10"}) as pg:
        results["postgres"] = pg.version or "default"
        spark = sluice.session("bench-latency")
        try:
            results["spark_floor"] = spark_floor(spark, workdir)
            print(json.dumps(results["spark_floor"]), file=sys.stderr, flush=True)
            for rate in (int(r) for r in args.rates.split(",")):
                figures = measure_rate(spark, pg.url, rate, args.seconds, args.warmup, workdir)
                print(json.dumps(figures), file=sys.stderr, flush=True)
                results["rates"].append(figures)
        finally:
            spark.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
