"""The MetaService with many tables and jobs: --jobs streaming jobs (a process each, as real jobs are separate
drivers) writing --tables-per-job tables each through one MetaService, SQLite (a file, the default) and PostgreSQL
(LocalPostgres) in one run. No Spark: each job drives the MetaService as the table store's source and sink do per
micro-batch (tablestore/_source.py, _sink.py, _table.py), a new MetaService per step as they make one:

- jobs form pipelines of --stages jobs: a pipeline's first job ingests (its sink asks batch_barrier for a new
  barrier), each next job reads table 0 of the one before (last_barrier, aligned_barrier, barrier_version, then its
  read task's record_batch_barrier) and commits its tables at that barrier, so a pipeline's tables share barriers;
- per table and micro-batch the sink's commit: claim_writer, batch_barrier (the hand-over), complete_barrier, and
  every CHECKPOINT_INTERVAL versions the pruning the sink runs (oldest_needed_version, prune_barriers) of the
  versions older than LOG_RETENTION;
- one reader asks consistent_version across 10 tables (2 of each stage of pipeline 0, linked by lineage) 10 times
  a second while the jobs commit.

Two phases per backend: `max` (every job commits micro-batches as fast as it can; a downstream job polls its
input every 10 ms, Spark's spark.streaming.pollingDelay) and `cadence` (one micro-batch per --period seconds per
job, started at an offset per job). It prints barrier commits/s, the latency p50/p99 of a table's commit (and of
its steps), of a consistent read, and the MetaService's rows per table before and after each phase (the growth
per hour at the cadence, extrapolated from the phase).

    flock /tmp/sluice-cpu.lock .venv/bin/python -m bench.meta_scale [--jobs 50] [--tables-per-job 4] [--stages 5]
        [--seconds 40] [--period 1.0] [--backends sqlite,postgres] [--table-wide-lock]

--table-wide-lock measures what PostgreSQL's locks per table buy: the transactions that lock a table's writer, a
query's micro-batches, an aligned group or registrations take `LOCK TABLE sluice_jobs IN EXCLUSIVE MODE` instead,
as they did before (the connections are still kept).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

POLL_S = 0.010  # Spark's spark.streaming.pollingDelay: a trigger that found no new data waits this long
STEPS = ("open", "claim_writer", "batch_barrier", "complete_barrier", "prune")
META_TABLES = ("sluice_barriers", "sluice_batch_barriers", "sluice_aligned_barriers", "sluice_jobs",
               "sluice_job_tables", "sluice_lineage")


@dataclass
class Phase:
    name: str
    start: float  # time.time()
    end: float
    period: float  # 0: as fast as it can


@dataclass
class JobResult:
    commits: dict[str, int] = field(default_factory=dict)  # phase -> barriers completed
    latency: dict[str, list[float]] = field(default_factory=dict)  # phase -> a table's whole commit, s
    steps: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # phase -> step -> s


def table_name(pipeline: int, stage: int, k: int) -> str:
    return f"p{pipeline}s{stage}t{k}"


def run_job(url: str, job: int, stages: int, per_job: int, phases: list[Phase], out: Any) -> None:
    from sluice.meta import MetaService
    from sluice.tablestore._commit import CHECKPOINT_INTERVAL, LOG_RETENTION
    from sluice.tablestore._retention import oldest_needed_version

    pipeline, stage = divmod(job, stages)
    sinks = [table_name(pipeline, stage, k) for k in range(per_job)]
    source = table_name(pipeline, stage - 1, 0) if stage else None
    query = f"q-{job}"
    registered = MetaService(url).register_job(f"job-{job}", [source] if source else [], sinks, query_id=query)
    versions = dict.fromkeys(sinks, 0)
    result = JobResult()
    batch, start_barrier = 0, 0
    for phase in phases:
        done, lat = 0, []
        steps: dict[str, list[float]] = defaultdict(list)
        offset = phase.period * job / max(1, stages * 10)  # spread the jobs' triggers over the period
        n = 0
        while time.time() < phase.start:
            time.sleep(0.01)
        while True:
            if phase.period:
                due = phase.start + offset + n * phase.period
                if due >= phase.end:
                    break
                time.sleep(max(0.0, due - time.time()))
                n += 1
            elif time.time() >= phase.end:
                break
            barrier = None
            if source is not None:  # the table-store source plans the micro-batch (its driver), then its task offers
                meta = MetaService(url)
                last = meta.last_barrier(source)
                if last is None or last[0] <= start_barrier:
                    if not phase.period:
                        time.sleep(POLL_S)
                    continue
                barrier = meta.aligned_barrier([source], start_barrier)
                meta.barrier_version(source, barrier)
                MetaService(url).record_batch_barrier(query, batch, barrier)
                start_barrier = barrier
            for table in sinks:  # the sink's commit, one per table
                t0 = time.perf_counter()
                meta = MetaService(url)
                t1 = time.perf_counter()
                meta.claim_writer(table, name=registered.name, query_id=query)
                t2 = time.perf_counter()
                b = MetaService(url).batch_barrier(query, batch, [table])
                t3 = time.perf_counter()
                versions[table] += 1
                version = versions[table]
                done += meta.complete_barrier(table, b, version, registered.job_id)
                t4 = time.perf_counter()
                if version % CHECKPOINT_INTERVAL == 0:  # Table.forget_barriers
                    keep = oldest_needed_version(table, meta)
                    if keep is not None:
                        meta.prune_barriers(table, min(keep, version - LOG_RETENTION))
                t5 = time.perf_counter()
                for step, s in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                    steps[step].append(s)
                lat.append(t5 - t0)
            batch += 1
        result.commits[phase.name], result.latency[phase.name], result.steps[phase.name] = done, lat, dict(steps)
    out.put(("job", job, result))


def run_reader(url: str, tables: list[str], phases: list[Phase], out: Any) -> None:
    from sluice.meta import MetaService, NoConsistentVersionError

    found: dict[str, list[float]] = {}
    missing: dict[str, int] = {}
    for phase in phases:
        lat, miss = [], 0
        while time.time() < phase.start:
            time.sleep(0.01)
        while time.time() < phase.end:
            t0 = time.perf_counter()
            try:
                MetaService(url).consistent_version(tables)  # as read_consistent does
            except NoConsistentVersionError:
                miss += 1
            lat.append(time.perf_counter() - t0)
            time.sleep(0.1)
        found[phase.name], missing[phase.name] = lat, miss
    out.put(("reader", found, missing))


def row_counts(url: str) -> dict[str, int]:
    from sluice.meta import MetaService

    meta = MetaService(url)
    counts = {}
    with meta._tx() as cur:
        for table in META_TABLES:
            cur.execute(f"SELECT count(*) FROM {table}")
            counts[table] = int(cur.fetchone()[0])
    return counts


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def run_backend(label: str, url: str, args: argparse.Namespace) -> None:
    from sluice.meta import MetaService

    MetaService(url)  # the schema, before the jobs race for it
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    startup = 3.0 + args.jobs * 0.1
    t0 = time.time() + startup
    gap = 3.0  # jobs idle: the rows are counted between the phases
    phases = [Phase("max", t0, t0 + args.seconds, 0.0),
              Phase("cadence", t0 + args.seconds + gap, t0 + 2 * args.seconds + gap, args.period)]
    procs = [ctx.Process(target=run_job, args=(url, j, args.stages, args.tables_per_job, phases, out))
             for j in range(args.jobs)]
    reads = [table_name(0, s, k) for s in range(args.stages) for k in range(2)][:10]
    procs.append(ctx.Process(target=run_reader, args=(url, reads, phases, out)))
    for p in procs:
        p.start()
    before = row_counts(url)
    time.sleep(max(0.0, phases[0].end + 1.0 - time.time()))
    middle = row_counts(url)
    results: list[JobResult] = []
    reader: Any = None
    for _ in procs:
        item = out.get(timeout=args.seconds * 2 + startup + 120)
        if item[0] == "job":
            results.append(item[2])
        else:
            reader = item
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"{label}: a job process failed (exit {p.exitcode}); see its traceback above")
    after = row_counts(url)
    tables = args.jobs * args.tables_per_job
    print(f"\n## {label}: {args.jobs} jobs, {tables} tables, {args.seconds:.0f} s per phase")
    print("| phase | barrier commits/s | table commit p50 ms | p99 ms | consistent read (10 tables) p50 ms | p99 ms "
          "| reads without a common barrier |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for phase in phases:
        commits = sum(r.commits[phase.name] for r in results)
        lat = [v for r in results for v in r.latency[phase.name]]
        rl = reader[1][phase.name]
        print(f"| {phase.name} | {commits / args.seconds:,.0f} | {pct(lat, .5):.1f} | {pct(lat, .99):.1f} | "
              f"{pct(rl, .5):.1f} | {pct(rl, .99):.1f} | {reader[2][phase.name]} of {len(rl)} |")
    print("\nA table's commit by step (p50 / p99 ms):")
    print("| phase | " + " | ".join(STEPS) + " |")
    print("| --- |" + " ---: |" * len(STEPS))
    for phase in phases:
        cells = []
        for step in STEPS:
            vals = [v for r in results for v in r.steps[phase.name].get(step, [])]
            cells.append(f"{pct(vals, .5):.1f} / {pct(vals, .99):.1f}")
        print(f"| {phase.name} | " + " | ".join(cells) + " |")
    print("\nThe MetaService's rows (start / after max / after cadence; growth per hour at the cadence):")
    print("| table | start | after max | after cadence | per hour at the cadence |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for t in META_TABLES:
        hourly = (after[t] - middle[t]) * 3600 / args.seconds
        print(f"| {t} | {before[t]:,} | {middle[t]:,} | {after[t]:,} | {hourly:+,.0f} |")


def table_wide_lock() -> None:
    """The lock discipline before locks per table (see the docstring), in this process and its forked jobs."""
    from sluice.meta import _backend

    per_name = _backend.Backend.begin_sql

    def begin_sql(self: Any, locks: Any) -> str:
        if any(name.split(":")[0] in ("registry", "table", "query", "aligned") for name in locks):
            return "BEGIN; LOCK TABLE sluice_jobs IN EXCLUSIVE MODE"
        return per_name(self, locks)

    _backend.Backend.begin_sql = begin_sql  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--tables-per-job", type=int, default=4)
    parser.add_argument("--stages", type=int, default=5, help="jobs per pipeline")
    parser.add_argument("--seconds", type=float, default=40.0, help="length of each phase")
    parser.add_argument("--period", type=float, default=1.0, help="seconds between a job's micro-batches (cadence)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--table-wide-lock", action="store_true", help="PostgreSQL: the old LOCK TABLE (docstring)")
    args = parser.parse_args()
    if args.table_wide_lock:
        table_wide_lock()
    print(f"# bench.meta_scale {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, "
          f"{'LOCK TABLE sluice_jobs (--table-wide-lock), ' if args.table_wide_lock else ''}"
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for backend in args.backends.split(","):
        if backend == "sqlite":
            with tempfile.TemporaryDirectory(prefix="sluice-meta-scale-") as tmp:
                run_backend("SQLite", os.path.join(tmp, "meta.db"), args)
        elif backend == "postgres":
            from sluice.testing import LocalPostgres

            with LocalPostgres() as server:
                run_backend("PostgreSQL", server.url, args)
        else:
            raise SystemExit(f"--backends: sqlite or postgres, not {backend!r}")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
