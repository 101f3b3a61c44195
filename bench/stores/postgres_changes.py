"""Change capture benchmark: changes/s of format("postgres_changes") end to end vs the bare fetch of the same changes.

Run: `.venv/bin/python -m bench.stores.postgres_changes [--changes 1000000] [--rounds 3] [--pg-versions 15,18]` (starts
a throwaway PostgreSQL with wal_level=logical). `--pg-versions`, a comma list of major versions, runs the whole
benchmark once per version with the same parameters, each in its own process (a fresh JVM and server), one after
the other, and prints every run's figures with the key ones side by side, each version's over the first's; left
out (or one version), one run's figures, the server being `LocalPostgres`'s default ($SLUICE_TEST_PG_VERSION, else
Debian's). Narrow rows (id bigint primary key, v bigint, s text of 8 characters), inserted in transactions of 1,000
rows, then updated the same way (half the changes are updates). One slot per Spark round, all created before the
changes, so every contender reads exactly the same changes:
- fetch: one Python process, `SELECT data FROM pg_logical_slot_peek_binary_changes(...)` over ADBC into one
  Arrow binary column: the server decoding the WAL and sending pgoutput messages, nothing else (the limit);
- decode: the same fetch plus sluice's decoding into typed Arrow rows, one process, no Spark;
- spark: `spark.readStream.format("postgres_changes")` with Trigger.AvailableNow into `sluice_null` (local[2]),
  wall time from start() to the end of the query (its start included);
- spark in micro-batches: the same run's changes over the sum of its micro-batches' triggerExecution (what Spark
  reports as processedRowsPerSecond; what a long-running query sustains, without the query's one-off start).
- spark floor: the same number of rows of the same schema, ready-made (one 65,536-row Arrow batch built once and
  yielded over and over) by a minimal Python streaming source into `sluice_null`, in micro-batches: what Spark's
  hand-over from a Python source to a Python sink costs with no fetch and no decoding, the bound on any source;
- spark and its floor once more into Spark's own `noop` sink (JVM, no Python writer; `fetch-ranges` 2): the
  source's part apart from the hand-over to a Python sink;
- spark with `max-changes-per-trigger` 100000 (ten micro-batches): what planning each batch's end costs (it
  peeks at the changes to cut between transactions).
decode and spark run once with `fetch-ranges` 1 (one fetch of the whole batch) and once with the default, 2 (the
second half fetched from a copy of the slot while the first is decoded), alternating within each round.
Each figure is the best of --rounds.

Beside each time, the CPU the whole machine spent in it (PostgreSQL's backends, the JVM and the Python workers
alike; busy time from /proc/stat), so the bench also shows what a contender costs in cores, and the least wall time
two cores allow for the fetch, the decoding and Spark's hand-over together: (decode CPU + floor CPU) / 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import threading
import time
from datetime import date, datetime

import psycopg

from bench.checkouts import ROOT, module_command

PUBLICATION = "bench_pub"
PHASES: list = []  # Spark's durationMs of each micro-batch of each round
RANGES = (1, 2)  # fetch-ranges: one fetch of the whole batch; the default
# the Spark contenders: label, fetch-ranges, sink (Spark's own JVM `noop` sink splits the source's part from the
# hand-over to a Python sink), more source options (a budget per micro-batch: planning peeks at the changes too)
SPARK_RUNS = (("r1", 1, "sluice_null", {}), ("r2", 2, "sluice_null", {}), ("noop_r2", 2, "noop", {}),
              ("budget_100k_r2", 2, "sluice_null", {"max-changes-per-trigger": "100000"}))
CPU_SECONDS: dict[str, list[float]] = {}  # contender -> busy core-seconds of the whole machine, every round
# --pg-versions: the figures set side by side (the floor does not touch PostgreSQL: its ratio is the machine's noise)
KEY_FIGURES = ("fetch", "decode_r2", "spark_in_micro_batches_r2", "spark_r2", "spark_floor_in_micro_batches")


def busy_cpu() -> float:
    """Core-seconds the machine has spent busy since boot, every process included (Linux /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:8]]  # user nice system idle iowait irq softirq
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """busy_cpu() every 10 ms in a thread, so the CPU of windows known only afterwards (Spark's micro-batches, from
    their progress) can be read."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = [(time.time(), busy_cpu())]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.samples.append((time.time(), busy_cpu()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> float:
        import numpy as np

        times, busy = zip(*list(self.samples), strict=True)
        first, last = np.interp([start, end], times, busy)
        return float(last - first)

    def in_micro_batches(self, progress: list[dict]) -> float:
        """CPU within the triggerExecution of each micro-batch that read rows."""
        total = 0.0
        for p in progress:
            if p["numInputRows"]:
                start = datetime.fromisoformat(p["timestamp"]).timestamp()
                total += self.between(start, start + p["durationMs"]["triggerExecution"] / 1000)
        return total


def generate(url: str, changes: int) -> None:
    """`changes` changes in transactions of 1,000 rows, with a running-transactions record in the WAL every 100
    transactions (a CHECKPOINT writes one): a busy server writes one every 15 s, and only at those can a slot's
    restart point move, so without them every peek would decode again from the first change."""
    rows = changes // 2
    with psycopg.connect(url, autocommit=True) as conn:
        statements = [("INSERT INTO narrow SELECT g, g * 2, md5(g::text)::char(8) "
                       "FROM generate_series(%s::bigint, %s::bigint) g", (lo, min(lo + 999, rows - 1)))
                      for lo in range(0, rows, 1000)]
        statements += [("UPDATE narrow SET v = v + 1 WHERE id BETWEEN %s::bigint AND %s::bigint",
                        (lo, min(lo + 999, rows - 1))) for lo in range(0, rows, 1000)]
        for i, (statement, params) in enumerate(statements, 1):
            conn.execute(statement, params)
            if i % 100 == 0:
                conn.execute("CHECKPOINT")
        conn.execute("SET synchronous_commit = on")
        conn.execute("CREATE TEMP TABLE flush_marker (x int)")  # a synchronous commit flushes everything before it


def fetch(url: str, slot: str) -> tuple[float, int]:
    import adbc_driver_postgresql.dbapi as adbc

    cpu, start = busy_cpu(), time.perf_counter()
    with adbc.connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT data FROM pg_logical_slot_peek_binary_changes('{slot}', NULL, NULL, 'proto_version', "
                    f"'1', 'publication_names', '{PUBLICATION}')")
        table = cur.fetch_arrow_table()
    CPU_SECONDS.setdefault("fetch", []).append(round(busy_cpu() - cpu, 2))
    return time.perf_counter() - start, table.num_rows


def advance(url: str, slot: str) -> float:
    """The slot moved past every change, as commit() does after each micro-batch (server work off the batch)."""
    with psycopg.connect(url, autocommit=True) as conn:
        cpu, start = busy_cpu(), time.perf_counter()
        conn.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (slot,))
        elapsed = time.perf_counter() - start
    CPU_SECONDS["advance_at_commit"] = [round(busy_cpu() - cpu, 2)]
    return elapsed


def decode(url: str, slot: str, ranges: int) -> tuple[float, int]:
    from sluice.connectors.postgres import PostgresChangesDataSource

    source = PostgresChangesDataSource({"url": url, "table": "narrow", "slot": slot, "publication": PUBLICATION,
                                        "snapshot": "false", "fetch-ranges": str(ranges)})
    reader = source.streamReader(source.schema())
    start_offset = reader.initialOffset()
    cpu, start = busy_cpu(), time.perf_counter()
    end = reader.latestOffset(start_offset, reader.getDefaultReadLimit())
    rows = sum(b.num_rows for p in reader.partitions(start_offset, end) for b in reader.read(p))
    CPU_SECONDS.setdefault(f"decode_r{ranges}", []).append(round(busy_cpu() - cpu, 2))
    reader.stop()  # lets the next contender have the slot
    return time.perf_counter() - start, rows


def spark_run(spark, cpu: CpuSampler, url: str, slot: str, ranges: int, sink: str, label: str,
              extra: dict[str, str]) -> tuple[float, float, int]:
    df = (spark.readStream.format("postgres_changes")
          .options(url=url, table="narrow", slot=slot, publication=PUBLICATION, snapshot="false",
                   **{"fetch-ranges": str(ranges)}, **extra).load())
    with tempfile.TemporaryDirectory() as ck:
        start = time.perf_counter()
        q = df.writeStream.format(sink).option("checkpointLocation", ck).trigger(availableNow=True).start()
        q.awaitTermination()
        elapsed = time.perf_counter() - start
        rows = sum(p["numInputRows"] for p in q.recentProgress)
        PHASES.append([p["durationMs"] for p in q.recentProgress])
        in_batches = sum(p["durationMs"]["triggerExecution"] for p in q.recentProgress if p["numInputRows"]) / 1000
    CPU_SECONDS.setdefault(f"spark_in_micro_batches_{label}", []).append(
        round(cpu.in_micro_batches(q.recentProgress), 2))
    return elapsed, in_batches, rows


FLOOR_SCHEMA = ("id bigint, v bigint, s string, _op string, _lsn bigint, _commit_time timestamp, _xid bigint, "
                "_table string, _unchanged array<string>")


def floor_source(rows: int) -> type:
    """A streaming Python data source of `rows` ready-made change rows (one batch built once, yielded repeatedly)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class ReadyMadeReader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"rows": 0}

        def latestOffset(self, start: dict | None = None, limit: object = None) -> dict:
            return {"rows": rows}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(end["rows"] - start["rows"])] if end["rows"] > start["rows"] else []

        def read(self, partition: InputPartition):
            import numpy as np
            import pyarrow as pa
            import pyarrow.compute as pc

            n = 65_536
            ids = pa.array(np.arange(n, dtype=np.int64))
            batch = pa.RecordBatch.from_arrays([
                ids, pc.multiply(ids, 2), pc.cast(pc.add(ids, 10_000_000), pa.string()),
                pa.array(["insert"] * (n // 2) + ["update"] * (n - n // 2)), pc.divide(ids, 1000),
                pa.array(np.full(n, 1_700_000_000_000_000, np.int64)).cast(pa.timestamp("us", tz="UTC")),
                pc.divide(ids, 1000), pa.array(["public.narrow"] * n),
                pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()))],
                names=["id", "v", "s", "_op", "_lsn", "_commit_time", "_xid", "_table", "_unchanged"])
            for first in range(0, partition.value, n):
                yield batch.slice(0, min(n, partition.value - first))

        def commit(self, end: dict) -> None:
            pass

    class ReadyMade(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_ready_made_changes"

        def schema(self) -> str:
            return FLOOR_SCHEMA

        def streamReader(self, schema: object) -> ReadyMadeReader:
            return ReadyMadeReader()

    return ReadyMade


def floor_run(spark, cpu: CpuSampler, sink: str, label: str) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as ck:
        q = (spark.readStream.format("bench_ready_made_changes").load().writeStream.format(sink)
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
        q.awaitTermination()
    done = [p for p in q.recentProgress if p["numInputRows"]]
    CPU_SECONDS.setdefault(f"{label}_in_micro_batches", []).append(round(cpu.in_micro_batches(done), 2))
    return sum(p["durationMs"]["triggerExecution"] for p in done) / 1000, sum(p["numInputRows"] for p in done)


def side_by_side(args: argparse.Namespace, versions: list[str]) -> dict:
    """The whole benchmark once per PostgreSQL version, each in a child process; its key figures side by side."""
    load_start, start = os.getloadavg(), time.perf_counter()
    runs = {v: json.loads(subprocess.run(module_command(
        "bench.stores.postgres_changes", "--pg-versions", v, "--changes", str(args.changes), "--rounds",
        str(args.rounds)), stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT).stdout) for v in versions}
    figures = {name: {v: runs[v]["changes_per_s"][name] for v in versions} for name in KEY_FIGURES}
    for row in figures.values():
        row.update({f"{v}/{versions[0]}": round(row[v] / row[versions[0]], 2) for v in versions[1:]})
    return {"date": str(date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "load_average_1_5_15_min": {"start": load_start, "end": os.getloadavg()},
            "wall_s": round(time.perf_counter() - start), "changes": args.changes, "rounds": args.rounds,
            "changes_per_s": figures,
            "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pg-versions", default="", help="comma list of PostgreSQL major versions, e.g. 15,18")
    args = ap.parse_args()
    versions = [v.strip() for v in args.pg_versions.split(",") if v.strip()]
    if len(versions) > 1:
        print(json.dumps(side_by_side(args, versions), indent=2))
        return
    import sluice
    from sluice.testing import LocalPostgres

    with LocalPostgres(settings={"wal_level": "logical", "max_replication_slots": "20", "max_wal_size": "4GB"},
                       version=versions[0] if versions else None) as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            server = conn.execute("SHOW server_version").fetchone()[0]
            conn.execute("CREATE TABLE narrow (id bigint PRIMARY KEY, v bigint, s text)")
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE narrow")
            slots = [f"bench_{i}" for i in range(len(SPARK_RUNS) * args.rounds + 1)]
            for slot in slots:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        generate(pg.url, args.changes)
        results: dict[str, list[float]] = {"fetch": []}
        counts: dict[str, int] = {}
        for _ in range(args.rounds):
            seconds, counts["fetch"] = fetch(pg.url, slots[0])
            results["fetch"].append(round(seconds, 3))
            for ranges in RANGES:
                seconds, counts[f"decode_r{ranges}"] = decode(pg.url, slots[0], ranges)
                results.setdefault(f"decode_r{ranges}", []).append(round(seconds, 3))
        spark = sluice.session("bench-postgres-changes")
        spark.dataSource.register(floor_source(args.changes))
        real_schema = (spark.readStream.format("postgres_changes")
                       .options(url=pg.url, table="narrow", slot=slots[0], publication=PUBLICATION).load().schema)
        assert real_schema.simpleString() == f"struct<{FLOOR_SCHEMA.replace(' ', ':').replace(',:', ',')}>", \
            real_schema.simpleString()
        cpu = CpuSampler()
        for i in range(args.rounds):
            for j, (label, ranges, sink, extra) in enumerate(SPARK_RUNS):
                slot = slots[1 + len(SPARK_RUNS) * i + j]
                seconds, in_batches, n = spark_run(spark, cpu, pg.url, slot, ranges, sink, label, extra)
                results.setdefault(f"spark_{label}", []).append(round(seconds, 3))
                results.setdefault(f"spark_in_micro_batches_{label}", []).append(round(in_batches, 3))
                counts[f"spark_{label}"] = n
            for label, sink in (("spark_floor", "sluice_null"), ("spark_floor_noop", "noop")):
                seconds, counts[label] = floor_run(spark, cpu, sink, label)
                results.setdefault(f"{label}_in_micro_batches", []).append(round(seconds, 3))
        cpu.stop()
        spark.stop()
        results["advance_at_commit"] = [round(advance(pg.url, slots[0]), 3)]  # last: it consumes slot 0
    best = {name: min(runs) for name, runs in results.items()}
    # the CPU of each contender's best round; Spark's wall time from start() has no CPU figure of its own
    cpu_best = {name: CPU_SECONDS[name][runs.index(min(runs))] for name, runs in results.items() if name in CPU_SECONDS}
    least_wall = {f"r{r}": round((cpu_best[f"decode_r{r}"] + cpu_best["spark_floor_in_micro_batches"]) / 2, 3)
                  for r in RANGES}
    out = {
        "date": str(date.today()), "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "postgres": server, "changes": args.changes, "rows_read": counts, "seconds_every_round": results,
        "changes_per_s": {name: round(args.changes / s) for name, s in best.items()},
        "vs_fetch": {name: round(best["fetch"] / s, 2) for name, s in best.items() if name != "fetch"},
        "cpu_core_seconds_every_round": CPU_SECONDS, "cpu_core_seconds_of_best_round": cpu_best,
        "two_core_least_wall_s": least_wall,
        "two_core_best_vs_fetch": {r: round(best["fetch"] / s, 2) for r, s in least_wall.items()},
        "spark_phases_ms": PHASES,
    }
    assert all(n == args.changes for name, n in counts.items() if name != "fetch"), counts
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
