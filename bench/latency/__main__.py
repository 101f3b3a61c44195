"""Freshness benchmark: how long a committed change takes to reach its target, measured as a new user would.

Run: `.venv/bin/python -m bench.latency [--hops pg-pg,chain,kafka] [--rates 1000,10000,50000] [--chain-rates
1000,10000] [--kafka-rates 1000,10000] [--seconds 30] [--warmup 10]` (starts a throwaway PostgreSQL with
wal_level=logical and a local S2 server, and for `kafka` a LocalKafka broker; nothing else should run). The kafka hop
needs Spark's Kafka connector, served for the 4.0-4.2 lines: `.venv-spark-4.2/bin/python -m bench.latency --hops kafka`.

The hop: a writer thread commits transactions of 10, 100 or 500 rows, 100 a second (1k, 10k, 50k changes/s), into
`src`; `spark.readStream.format("postgres_changes")` with the default trigger copies them into `dst`
(`format("postgres")`, append) whose `arrived_at` column defaults to `clock_timestamp()`. A change's latency is
its arrival minus its transaction's commit time (`_commit_time`, from pgoutput's Begin message): one server, one
clock. Changes committed during the warm-up are left out. Per rate: p50/p95/p99/max, the p99 of each whole minute
measured (steady or growing), the rate sustained (changes that arrived over the measured seconds), and where the
time went:
- wait: from the commit to the start of the micro-batch that read it (Spark starts a batch when the previous one
  ends: with the default trigger this is the previous batch's length, on average half of it);
- in batch: from the batch's start to the row's arrival;
- Spark's phases of the batches (durationMs of the query's progress, medians): latestOffset (the source planning
  the batch end), queryPlanning, addBatch (the fetch and the write), walCommit and commitOffsets (checkpoint files).
The chained hops (`--hops chain`), as a user chains them, all running at once: PostgreSQL `src` ->
`postgres_changes` -> an S2 stream (local S2 server) -> `format("s2")` -> a table-store table -> its change feed ->
PostgreSQL `dst_chain`. Each row carries the times it was stamped on the way (microseconds since the epoch, one
clock): the source commit (`_commit_time`), its S2 record's arrival (the server's timestamp), the Delta commit of its
table-store version (from the table's history), and its arrival in `dst_chain`; each hop's latency is the difference
of two consecutive stamps.
The anchor (unless --no-debezium): Debezium's embedded engine (bench/latency/debezium.py, from Maven Central) on the
same table and load through a slot of its own, from commit to its consumer callback, measured in the same run.
The Kafka hop (`--hops kafka`, bench/latency/kafka_hop.py): Kafka -> PostgreSQL freshness, from a message's send time
to the commit that made its row visible, through sluice's and Spark's Kafka sources in micro-batches, Spark's real-time
mode into a Python `foreach`, and a plain confluent-kafka consumer loop; then what real-time mode does with sluice's
Python data sources (Spark's error text).
Spark's own floor on this machine, the same query shape with nothing to do: the median micro-batch cycle
(triggerExecution) of a minimal Python streaming source into a Python sink, and of the JVM's `rate` source into
`noop`. Spark's own figures come from `query.recentProgress`.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from datetime import date, datetime

import psycopg

from bench.floors.spark_cycle import spark_floor
from bench.latency import kafka_hop
from bench.latency.debezium import DEBEZIUM_VERSION, Debezium
from bench.measures import percentile

BATCHES_PER_SECOND = 100  # the writer's transactions per second
PUBLICATION = "latency_pub"
# The server as users run it where latency is measured: synchronous_commit on (PostgreSQL's default; the test servers
# turn it off for speed). Off, a commit's WAL is flushed by the WAL writer up to wal_writer_delay (200 ms) later, and
# logical decoding (sluice's peek, Debezium's walsender alike) reads only flushed WAL.
SERVER_SETTINGS = {"wal_level": "logical", "max_replication_slots": "10", "synchronous_commit": "on"}
# The Kafka hop's arrival is the commit time of a row's transaction (pg_xact_commit_timestamp).
KAFKA_SERVER_SETTINGS = {"track_commit_timestamp": "on"}


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


def drop_slot(conn, slot: str) -> None:
    """Drop a query's slot once no session uses it: a task the query's stop cancelled may still be peeking."""
    deadline = time.monotonic() + 60
    while conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0]:
        assert time.monotonic() < deadline, f"slot {slot} still in use 60 s after its query stopped"
        time.sleep(0.1)  # the server offers no event for a slot's release
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def phase_medians(progress: list[dict]) -> dict[str, float]:
    phases: dict[str, list[float]] = {}
    for p in progress:
        if p.get("numInputRows", 0) == 0:
            continue
        for name, ms in p.get("durationMs", {}).items():
            phases.setdefault(name, []).append(ms)
    return {name: statistics.median(ms) for name, ms in sorted(phases.items())}


def spread(ms: list[float]) -> dict[str, int]:
    return {"p50_ms": round(percentile(ms, .5)), "p95_ms": round(percentile(ms, .95)),
            "p99_ms": round(percentile(ms, .99)), "max_ms": round(max(ms))}


def measure_rate(spark, pg_url: str, rate: int, seconds: float, warmup: float, workdir: str,
                 anchor: bool = True, changes_options: dict[str, str] | None = None) -> dict:
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
              .options(url=pg_url, table="src", publication=PUBLICATION, slot=f"latency_{tag}")
              .options(**(changes_options or {})).load())
    query = (source.selectExpr("id", "n", "payload", "_commit_time AS commit_time").writeStream
             .format("postgres").options(url=pg_url, table=f"dst_{tag}")
             .option("checkpointLocation", os.path.join(workdir, f"checkpoint-{tag}")).start())
    writer = Writer(pg_url, rows)
    # The anchor: Debezium's embedded engine on the same table and load, through a slot of its own.
    debezium = Debezium(pg_url, f"latency_dbz_{tag}", PUBLICATION, "public.src") if anchor else None
    pairs: list[tuple[int, int]] = []
    try:
        # Wait for the query's first (empty snapshot) batch before offering load: its start is not freshness.
        deadline = time.monotonic() + 120
        while not query.recentProgress and time.monotonic() < deadline:
            query.awaitTermination(0.2)
        assert query.recentProgress, f"the query made no progress in 120 s: {query.exception()}"
        if debezium is not None:
            debezium.wait_ready()
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
        if debezium is not None:
            pairs = debezium.stop()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        lat = conn.execute(
            f"SELECT extract(epoch FROM arrived_at - commit_time) * 1000, extract(epoch FROM commit_time), "
            f"extract(epoch FROM arrived_at) FROM dst_{tag} WHERE commit_time >= %s AND commit_time < %s",
            (measure_from, measure_to)).fetchall()
        arrived = conn.execute(f"SELECT count(*) FROM dst_{tag} WHERE arrived_at >= %s AND arrived_at < %s",
                               (measure_from, measure_to)).fetchone()[0]
        delivered = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM dst_{tag}").fetchone()
        drop_slot(conn, f"latency_{tag}")
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
    # Steady or growing: the p99 of the changes committed in each whole minute of the measurement.
    by_minute: dict[int, list[float]] = {}
    for ms, committed, _ in lat:
        by_minute.setdefault(int((float(committed) - measure_from.timestamp()) // 60), []).append(float(ms))
    return {
        "rate_offered": rate, "rows_per_transaction": rows, "changes_measured": len(latencies),
        "sustained_per_s": round(arrived / seconds), "writer_behind_max_s": round(writer.behind_max_s, 3),
        **spread(latencies),
        "p99_ms_by_minute": [round(percentile(by_minute[m], .99)) for m in sorted(by_minute)
                             if (m + 1) * 60 <= seconds],
        "wait_p50_ms": round(percentile(waits, 0.5)) if waits else None,
        "in_batch_p50_ms": round(percentile(in_batch, 0.5)) if in_batch else None,
        "batches": len(batches), "rows_per_batch_median": statistics.median(p["numInputRows"] for p in batches),
        "phases_median_ms": phase_medians(progress),
        **({"debezium": debezium_figures(pairs, measure_from.timestamp() * 1e6, measure_to.timestamp() * 1e6)}
           if anchor else {}),
    }


def debezium_figures(pairs: list[tuple[int, int]], low_us: float, high_us: float) -> dict:
    """Commit to Debezium's consumer callback, for the changes committed in [low, high)."""
    ms = [(arrival - commit) / 1000 for commit, arrival in pairs if low_us <= commit < high_us]
    assert ms, f"Debezium delivered none of the measured changes ({len(pairs)} in all)"
    return {"version": DEBEZIUM_VERSION, "changes_measured": len(ms), **spread(ms)}


def _start_when(ready, what: str, timeout: float = 180) -> None:
    """Wait until `ready()` (the chain's next hop needs what the previous one made); fail naming `what`."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s"
        time.sleep(0.2)  # polling stores that offer no event to wait on


def measure_chain(spark, pg_url: str, s2_url: str, rate: int, seconds: float, warmup: float, workdir: str) -> dict:
    """PostgreSQL -> S2 -> table store -> PostgreSQL, three streaming queries at once; each hop's latency."""
    from deltalake import DeltaTable

    from sluice.tablestore import StoreTable

    tag = f"c{rate}"
    s2 = {"s2.basin": f"latency-{tag}", "s2.endpoints.account": s2_url, "s2.endpoints.basin": s2_url,
          "s2.auth-token": "local"}
    store = {"table": f"chain_{tag}", "warehouse": os.path.join(workdir, "warehouse"),
             "meta": os.path.join(workdir, "meta.db")}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS src, dst_{tag}")
        conn.execute("CREATE TABLE src (id bigserial PRIMARY KEY, n int, payload text)")
        conn.execute("INSERT INTO src (n, payload) VALUES (0, 'seed')")  # makes the S2 stream and the table
        conn.execute(f"CREATE TABLE dst_{tag} (id bigint, n int, commit_us bigint, s2_us bigint, version bigint, "
                     "arrived_at timestamptz DEFAULT clock_timestamp())")
        conn.execute(f"DROP PUBLICATION IF EXISTS {PUBLICATION}")
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE src")

    def checkpoint(name: str) -> str:
        return os.path.join(workdir, f"checkpoint-{tag}-{name}")

    to_s2 = (spark.readStream.format("postgres_changes")
             .options(url=pg_url, table="src", publication=PUBLICATION, slot=f"latency_{tag}").load()
             .selectExpr("id", "n", "payload", "unix_micros(_commit_time) AS commit_us").writeStream.format("s2")
             .options(**s2, **{"s2.stream": "changes", "s2.create-basin": "true", "s2.create-streams": "true"})
             .option("checkpointLocation", checkpoint("s2")).start())
    queries = [to_s2]
    writer = Writer(pg_url, rate // BATCHES_PER_SECOND)
    try:
        _start_when(lambda: any(p.numInputRows for p in to_s2.recentProgress), "change in S2")
        to_store = (spark.readStream.format("s2").options(**s2, **{"s2.streams": "changes", "format": "json"})
                    .schema("id long, n int, payload string, commit_us long, timestamp timestamp").load()
                    .selectExpr("id", "n", "payload", "commit_us", "unix_micros(timestamp) AS s2_us").writeStream
                    .format("tablestore").options(**store).option("checkpointLocation", checkpoint("store"))
                    .option("log-retention-versions", "1000000").start())  # every version's commit time stays
        queries.append(to_store)
        table = StoreTable(store["table"], store["warehouse"])
        _start_when(table.exists, "table-store table")
        to_pg = (spark.readStream.format("tablestore").options(**store).option("changes", "true").load()
                 .selectExpr("id", "n", "commit_us", "s2_us", "_commit_version AS version").writeStream
                 .format("postgres").options(url=pg_url, table=f"dst_{tag}")
                 .option("checkpointLocation", checkpoint("pg")).start())
        queries.append(to_pg)

        def arrived() -> int:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                return conn.execute(f"SELECT count(*) FROM dst_{tag}").fetchone()[0]

        _start_when(lambda: arrived() > 0, "row through the whole chain")
        writer.start()
        time.sleep(warmup)  # the load's pace, not an event to wait for
        measure_from = time.time() * 1e6
        time.sleep(seconds)
        measure_to = time.time() * 1e6
        writer.stop()
        total = writer.committed + 1  # and the seed row
        _start_when(lambda: arrived() >= total, "catch-up of every committed change", 300)
        progress = {name: [json.loads(p.json) for p in q.recentProgress]
                    for name, q in zip(("to_s2", "to_store", "to_pg"), queries, strict=True)}
    finally:
        if writer.is_alive():
            writer.stop()
        for q in queries:
            q.stop()
    committed_at = {h["version"]: h["timestamp"] * 1000 for h in DeltaTable(table.uri).history()}  # ms -> us
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(f"SELECT commit_us, s2_us, version, extract(epoch FROM arrived_at) * 1e6 FROM dst_{tag} "
                            "WHERE commit_us >= %s AND commit_us < %s", (measure_from, measure_to)).fetchall()
        delivered = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM dst_{tag}").fetchone()
        drop_slot(conn, f"latency_{tag}")
    assert delivered[0] == delivered[1] == total, f"delivered {delivered} of {total} changes"
    hops = {"postgres_to_s2": [(s2_us - commit) / 1000 for commit, s2_us, _, _ in rows],
            "s2_to_tablestore": [(committed_at[v] - s2_us) / 1000 for _, s2_us, v, _ in rows],
            "tablestore_to_postgres": [(float(at) - committed_at[v]) / 1000 for _, _, v, at in rows],
            "end_to_end": [(float(at) - commit) / 1000 for commit, _, _, at in rows]}
    return {"rate_offered": rate, "changes_measured": len(rows),
            "sustained_per_s": round(len(rows) / seconds), "writer_behind_max_s": round(writer.behind_max_s, 3),
            **{hop: spread(ms) for hop, ms in hops.items()},
            "phases_median_ms": {name: phase_medians(p) for name, p in progress.items()}}


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", default="pg-pg,chain", help="pg-pg (PostgreSQL -> PostgreSQL), chain "
                        "(PostgreSQL -> S2 -> table store -> PostgreSQL) and/or kafka (Kafka -> PostgreSQL)")
    parser.add_argument("--rates", default="1000,10000,50000", help="changes/s of the pg-pg hop, comma-separated")
    parser.add_argument("--chain-rates", default="1000,10000", help="changes/s of the chain, comma-separated")
    parser.add_argument("--kafka-rates", default="1000,10000", help="messages/s of the kafka hop, comma-separated")
    parser.add_argument("--kafka-paths", default=",".join(kafka_hop.PATHS), help="the kafka hop's paths")
    parser.add_argument("--no-debezium", action="store_true", help="leave out the anchor: Debezium's embedded "
                        f"engine {DEBEZIUM_VERSION} beside the pg-pg hop (fetched from Maven Central once)")
    parser.add_argument("--changes-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the pg-pg hop's postgres_changes source, e.g. slot.log-restart-point=false")
    parser.add_argument("--seconds", type=float, default=30, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=10, help="seconds of load before measuring")
    args = parser.parse_args()

    import pyspark

    import sluice
    from sluice.s2local import LocalS2
    from sluice.testing import LocalKafka, LocalPostgres

    hops = set(args.hops.split(","))
    if hops - {"pg-pg", "chain", "kafka"}:
        parser.error(f"--hops: unknown {sorted(hops - {'pg-pg', 'chain', 'kafka'})}; choose pg-pg, chain, kafka")
    kafka_paths = args.kafka_paths.split(",") if "kafka" in hops else []
    if set(kafka_paths) - set(kafka_hop.PATHS):
        parser.error(f"--kafka-paths: unknown {sorted(set(kafka_paths) - set(kafka_hop.PATHS))}; choose from "
                     f"{', '.join(kafka_hop.PATHS)}")
    kafka_conf = kafka_hop.spark_kafka_conf(pyspark.__version__) if "kafka" in hops else {}
    results: dict = {"date": date.today().isoformat(), "machine": f"{os.cpu_count()} cores, {platform.machine()}",
                     "pyspark": pyspark.__version__, "load_average_start": os.getloadavg(), "rates": [], "chain": [],
                     "kafka": [], "spark_kafka": kafka_conf.get("spark.jars.packages")}
    with tempfile.TemporaryDirectory(prefix="sluice-latency-") as workdir, \
            LocalPostgres(settings={**SERVER_SETTINGS, **(KAFKA_SERVER_SETTINGS if kafka_paths else {})}) as pg, \
            LocalS2() as s2, \
            (LocalKafka() if "kafka" in hops else contextlib.nullcontext()) as kafka:
        results["postgres"] = pg.version or "default"
        results["changes_options"] = args.changes_option
        spark = sluice.session("bench-latency", **kafka_conf)
        try:
            results["spark_floor"] = spark_floor(spark, workdir)
            print(json.dumps(results["spark_floor"]), file=sys.stderr, flush=True)
            for rate in (int(r) for r in args.rates.split(",")) if "pg-pg" in hops else ():
                figures = measure_rate(spark, pg.url, rate, args.seconds, args.warmup, workdir, not args.no_debezium,
                                       dict(o.split("=", 1) for o in args.changes_option))
                print(json.dumps(figures), file=sys.stderr, flush=True)
                results["rates"].append(figures)
            for rate in (int(r) for r in args.chain_rates.split(",")) if "chain" in hops else ():
                figures = measure_chain(spark, pg.url, s2.url, rate, args.seconds, args.warmup, workdir)
                print(json.dumps(figures), file=sys.stderr, flush=True)
                results["chain"].append(figures)
            for rate in (int(r) for r in args.kafka_rates.split(",")) if kafka_paths else ():
                for path in kafka_paths:
                    figures = kafka_hop.measure(spark, kafka, pg.url, path, rate, args.seconds, args.warmup,
                                                     workdir)
                    print(json.dumps(figures), file=sys.stderr, flush=True)
                    results["kafka"].append(figures)
            if kafka_paths:
                results["realtime_refusals"] = kafka_hop.refusals(spark, kafka, pg.url, workdir)
                print(json.dumps(results["realtime_refusals"]), file=sys.stderr, flush=True)
        finally:
            spark.stop()
    results["load_average_end"] = os.getloadavg()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
