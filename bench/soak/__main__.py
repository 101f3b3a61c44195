"""The whole pipeline under fire: a bank in PostgreSQL, streamed through S2 and the table store into
PostgreSQL and ClickHouse copies, and from S2 through Kafka into a second table-store table (the Kafka
branch), while faults strike at random times; the bank's invariant is checked all along.

    .venv/bin/python -m bench.soak --minutes 30 --seed 7 --stores # make soak MINUTES=30
    .venv/bin/python -m bench.soak --minutes 2 --fault-every 8    # the short run make test makes

With --stores, the design-store branch too (bench/soak/stores.py): from the S2 stream into Cassandra
(three nodes on 127.0.0.1-3, replication factor 3, QUORUM writes and reads), OpenSearch and HBase, each with its
ordered upserts (micro-batch versions and the replay guard).

The bank: `accounts` (id, balance, v) in PostgreSQL; writer threads commit transfers, each moving money between two
accounts and adding 1 to both accounts' `v`, so the sum of balances never changes and every account's changes
are numbered 1, 2, 3, ... A marker account, outside the transfers, gets a new `v` every 250 ms: the time from its
commit to its arrival in the PostgreSQL copy is the end-to-end latency. The pipeline is bench/soak/driver.py (its
docstring says each hop's mode), a Spark driver process this script starts, kills and restarts.

Faults (seeded: the same seed strikes the same faults at the same times), at exponentially distributed intervals of
mean --fault-every seconds, each in a thread of its own, so they sometimes overlap:
s2-kill (SIGKILL of the local S2 server, restarted 1-3 s later on its data), pg-backends (every client backend of
the pipeline terminated), pg-replication (the walsender terminated), pg-restart (immediate shutdown, as a crash,
and start), ch-restart (the ClickHouse server), worker-kill (the driver's Python workers SIGKILLed mid-task),
driver-kill (the Spark driver SIGKILLed and started again on its checkpoints), net-stall (2-5 s of silence
between Spark and PostgreSQL, through a TCP proxy), net-cut (every connection through the proxy reset), meta-down
(the MetaService's database refuses connections for 2-5 s, its sessions terminated), kafka-broker (SIGKILL of the
Kafka broker, mid-transaction of the S2 -> Kafka hop, restarted 1-3 s later on its data); with --stores also
cassandra-node (SIGKILL of one of the three nodes, started again 1-3 s later; the next one only once every node sees
it back in the ring), search-node (the OpenSearch node), hbase-gateway (HBase's Thrift2 gateway) and hbase-server
(HBase's master and region server, one JVM in standalone mode, with the gateway), each restarted 1-3 s later on its
data. --first strikes the kinds it names first, in that order (the short run of make test strikes the broker once
whatever the seed draws).

Checked all along and at the end (the verdict is the exit code: 0 holds, 1 violated):
- at every barrier the table store completes, `balances` and the Kafka branch's `balances_kafka` read at that
  barrier hold every account and the constant total (no transaction torn or half-applied);
- whenever the PostgreSQL copy is read, it holds every account and the constant total (it is written in one
  transaction per micro-batch);
- the S2 stream, and the Kafka topic as a read_committed consumer reads it, hold every account's changes exactly
  once and in order (v = 1, 2, ... with no gap and no repeat from the snapshot on): no lost and no duplicated
  transfer;
- with --stores, each design store's copy read every second, then `accounts`: every account at a state the source
  had (its balance at that v), never at a v ahead of the source's, never going back from an earlier read. None of
  the three writes a micro-batch in one transaction, so none promises the total: reads whose total differs are
  counted (design_store_reads), not violations;
- at the end, after the writers stop, both table-store tables, the PostgreSQL copy and the ClickHouse copy (and the
  Cassandra, OpenSearch and HBase copies) equal `accounts` row for row, and the replication slot's lag returns to
  near zero.
Reported: transfers committed, faults by kind, recovery time per fault (from the fault to the first change
committed after it arriving in the PostgreSQL copy; for kafka-broker, in a barrier of `balances_kafka`, read every
second; for a design store's kinds, in that store's copy, read every second), latency p50/p99 outside fault
windows, and the growth per hour over the run's second half (sampled every minute) of memory (the S2 server; the
driver over its longest life, as a killed driver starts small again), checkpoints, S2's data (its folder, and the
stream's storage metric; the stream keeps 10 minutes, S2_RETENTION_S), the Kafka broker's memory and data (the topic
keeps 10 minutes too), the warehouse (and its log, change data, live and removed files) and the MetaService's rows (with
--stores, each design store's memory and disk), with the samples at a quarter, half, three quarters and the end.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.measures import p50_p99
from bench.soak.bank import TOTAL_PER_ACCOUNT, Fault, Run, marker, transfers
from bench.soak.checks import check_kafka_topic, check_s2_stream, wait_equal, watch_barriers, watch_copy
from bench.soak.faults import FAULT_KINDS, STORE_FAULT_KINDS, Driver, Faults
from bench.soak.growth import growth, python_memory
from bench.soak.stores import Stores, watch_store

FAULTS = FAULT_KINDS + STORE_FAULT_KINDS


@contextlib.contextmanager
def started_beside(server: Any) -> Iterator[concurrent.futures.Future]:
    """A JVM server starting in a thread while the other servers start (the broker takes ~10 s); stopped at the
    end whatever happened."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        starting = pool.submit(server.start)
        try:
            yield starting
        finally:
            concurrent.futures.wait([starting])
            server.stop()


def sample_growth(env: dict, work: Path) -> dict[str, float]:
    """`growth`, retried while a fault has the MetaService's database down."""
    for _ in range(30):
        try:
            return growth(env, work)
        except Exception:
            time.sleep(1)
    return growth(env, work)


SAMPLE_EVERY_S = 60.0
S2_RETENTION_S = 600  # the stream's retention age: a careful user bounds a stream that is a buffer between hops
KAFKA_TOPIC = "bank"
# The topic, a buffer between hops like the S2 stream, keeps as long; segments roll every minute so retention can
# delete them (it deletes whole segments only). One partition: see bench/soak/driver.py's hop 4.
KAFKA_TOPIC_CONFIG = {"retention.ms": str(S2_RETENTION_S * 1000), "segment.ms": "60000"}


@dataclass(frozen=True)
class Sample:
    at_s: float  # since the pipeline was through
    driver_starts: int
    values: dict[str, float]
    python: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # pid: role, PSS, RSS (python_memory)


def create_basin(s2: Any, basin: str) -> None:
    """The basin, its streams kept S2_RETENTION_S seconds, and its stream `bank`."""
    import asyncio

    import s2_sdk

    async def create() -> None:
        async with s2_sdk.S2(s2.access_token, endpoints=s2.endpoints) as client:
            await client.create_basin(basin, config=s2_sdk.BasinConfig(
                default_stream_config=s2_sdk.StreamConfig(retention_policy=S2_RETENTION_S)))
            # Before the first write would: the queries reading it start at once, and would fail until it exists.
            await client.basin(basin).create_stream("bank")

    asyncio.run(create())


def growth_report(samples: list[Sample]) -> dict:
    """Growth per hour over the second half of the run; the driver's memory over its longest life in that half (a
    killed driver starts small again); and the samples at a quarter, half, three quarters and the end."""
    end = samples[-1]
    half = [x for x in samples if x.at_s >= end.at_s / 2] or [end]

    def per_hour(first: Sample, last: Sample, key: str) -> float | None:
        hours = (last.at_s - first.at_s) / 3600
        return round((last.values[key] - first.values[key]) / hours) if hours > 0 else None

    driver_keys = ("driver_rss_bytes", "driver_jvm_rss_bytes", "driver_processes", "python_processes",
                   "python_pss_bytes", "python_largest_rss_bytes")
    out = {key: per_hour(half[0], end, key) for key in end.values if key not in driver_keys}
    lives: dict[int, list[Sample]] = {}
    for x in half:
        lives.setdefault(x.driver_starts, []).append(x)
    longest = max(lives.values(), key=lambda life: life[-1].at_s - life[0].at_s)
    for key in driver_keys:
        out[key] = per_hour(longest[0], longest[-1], key)
    marks = [samples[min(len(samples) - 1, round(f * (len(samples) - 1)))] for f in (0.25, 0.5, 0.75, 1.0)]
    return {"growth_per_hour": out,
            "growth_window": {"from_min": round(half[0].at_s / 60, 1), "to_min": round(end.at_s / 60, 1),
                              "driver_life_min": round((longest[-1].at_s - longest[0].at_s) / 60, 1)},
            "samples": [{"at_min": round(x.at_s / 60, 1), **x.values} for x in marks], "at_end": end.values}


def windows_report(samples: list[Sample], latencies: list[tuple[float, float]], window_s: float,
                   end_s: float) -> list[dict]:
    """Per window of `window_s` from the pipeline's first change through to `end_s` (the writers stop; the last
    sample, after the copies caught up, is not in any): the latency (commit to the PostgreSQL copy, outside fault
    windows; `latencies` as (seconds since through, seconds)) and the transfers committed in it, and at its last
    sample the memory of the driver's JVM and of its Python processes (the driver's and Spark's workers: their
    proportional set size, as they share the daemon's pages, and the largest one's RSS), the S2 server's and the
    broker's, the MetaService's rows, the checkpoints' bytes and the warehouse's by kind (its Delta logs, change
    data, live and removed data files). A steady write shows them flat from window to window."""
    out = []
    mib = 1024 * 1024
    before = samples[0].values
    for k in range(max(1, math.ceil(end_s / window_s))):
        lo, hi = k * window_s, min((k + 1) * window_s, end_s + 1)
        # A sample is taken a little after its minute: the one nearest a window's end closes it.
        inside = [x for x in samples if lo + SAMPLE_EVERY_S / 2 < x.at_s <= hi + SAMPLE_EVERY_S / 2]
        if not inside:
            continue
        last = inside[-1].values
        out.append({"from_min": round(lo / 60, 1), "to_min": round(min(hi, end_s) / 60, 1),
                    **{f"latency_{key}_s": value for key, value in p50_p99(
                        [lat for at, lat in latencies if lo <= at < hi]).items()},
                    "transfers": int(last["transfers"] - before["transfers"]),
                    "driver_jvm_mib": round(last["driver_jvm_rss_bytes"] / mib, 1),
                    "python_pss_mib": round(last["python_pss_bytes"] / mib, 1),
                    "python_largest_mib": round(last["python_largest_rss_bytes"] / mib, 1),
                    "python_processes": last["python_processes"],
                    "s2_server_mib": round(last["s2_server_rss_bytes"] / mib, 1),
                    "kafka_broker_mib": round(last["kafka_broker_rss_bytes"] / mib, 1),
                    "meta_rows": last["meta_rows"], "checkpoint_mib": round(last["checkpoint_bytes"] / mib, 2),
                    **{f"warehouse_{kind}_mib": round(last[f"warehouse_{kind}_bytes"] / mib, 3)
                       for kind in ("log", "change", "live", "removed")}})
        before = last
    return out


def python_report(samples: list[Sample], window_s: float, top: int = 8) -> dict:
    """Where the Python processes' memory went: each process sampled at least twice, from its first sample to its
    last (role, minutes, PSS and RSS, and its PSS at each `window_s` so that a step is told from a slope), the `top`
    whose PSS grew most; and how many lived through the whole run. A sum that grows while every process that lives on
    stays flat is workers coming and going, not a leak."""
    mib = 1024 * 1024
    seen: dict[int, list[tuple[float, str, int, int]]] = {}
    for x in samples:
        for pid, (role, pss, rss) in x.python.items():
            seen.setdefault(pid, []).append((x.at_s, role, pss, rss))

    def trace(life: list[tuple[float, str, int, int]]) -> list[float]:
        marks: dict[int, int] = {}
        for at_s, _, pss, _ in life:
            marks.setdefault(int(at_s // window_s), pss)  # the first sample in each window
        return [round(pss / mib, 1) for pss in [*marks.values(), life[-1][2]]]

    lives = [{"pid": pid, "role": life[-1][1], "from_min": round(life[0][0] / 60, 1),
              "to_min": round(life[-1][0] / 60, 1), "pss_first_mib": round(life[0][2] / mib, 1),
              "pss_last_mib": round(life[-1][2] / mib, 1), "grew_mib": round((life[-1][2] - life[0][2]) / mib, 1),
              "rss_first_mib": round(life[0][3] / mib, 1), "rss_last_mib": round(life[-1][3] / mib, 1),
              "pss_per_window_mib": trace(life)}
             for pid, life in seen.items() if len(life) > 1]
    lives.sort(key=lambda life: -life["grew_mib"])
    whole = [life for life in lives if samples and life["from_min"] <= round(samples[0].at_s / 60, 1)
             and life["to_min"] >= round(samples[-1].at_s / 60, 1)]
    return {"processes_seen": len(seen), "lived_whole_run": len(whole),
            "whole_run_grew_mib": round(sum(life["grew_mib"] for life in whole), 1),
            "whole_run_rss_grew_mib": round(sum(life["rss_last_mib"] - life["rss_first_mib"] for life in whole), 1),
            "grew_most": lives[:top]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--accounts", type=int, default=100)
    ap.add_argument("--rate", type=float, default=40.0, help="transfers a second, over two writers")
    ap.add_argument("--fault-every", type=float, default=20.0, help="mean seconds between faults")
    ap.add_argument("--stores", action="store_true",
                    help="the design-store branch too (S2 -> Cassandra, OpenSearch, HBase) and its fault kinds")
    ap.add_argument("--faults", help=f"kinds to strike, of {', '.join(FAULTS)} (default: all, those of the design "
                                     "stores with --stores)")
    ap.add_argument("--first", default="", help="kinds to strike first, in this order, before the random ones")
    ap.add_argument("--warm-up-s", type=float, default=300.0,
                    help="how long the pipeline may take to carry its first change end to end")
    ap.add_argument("--catch-up-s", type=float, default=240.0, help="how long the copies may take at the end")
    ap.add_argument("--window-min", type=float, default=10.0,
                    help="the report's windows: latency, transfers and memory per this many minutes")
    ap.add_argument("--report", type=Path, help="also write the report here, as JSON")
    args = ap.parse_args()
    if args.window_min * 60 < SAMPLE_EVERY_S:
        ap.error(f"--window-min {args.window_min}: at least {SAMPLE_EVERY_S / 60:g} (the soak samples once a minute)")
    available = FAULTS if args.stores else FAULT_KINDS
    kinds = [k for k in (args.faults if args.faults is not None else ",".join(available)).split(",") if k]
    first = [k for k in args.first.split(",") if k]
    unknown = sorted(set(kinds + first) - set(FAULTS))
    if unknown:
        ap.error(f"unknown fault kind(s) {unknown}; choose from {', '.join(FAULTS)}")
    if not args.stores and set(kinds + first) & set(STORE_FAULT_KINDS):
        ap.error(f"fault kind(s) {sorted(set(kinds + first) & set(STORE_FAULT_KINDS))} strike the design stores: "
                 "add --stores")

    # A SIGTERM (timeout, Ctrl-C's cousin) ends the run through its finally blocks: every server and the driver stop.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))

    import psycopg

    from sluice.s2local import LocalS2
    from sluice.testing import LocalKafka, LocalPostgres, TcpProxy
    from tests.clickhouse_chdb import ChdbClickHouse

    rnd = random.Random(args.seed)
    accounts = args.accounts + 1  # and the marker
    marker_id = args.accounts
    run = Run(accounts=accounts, total=args.accounts * TOTAL_PER_ACCOUNT)
    work = Path(tempfile.mkdtemp(prefix="sluice-soak-"))
    print(f"soak: seed {args.seed}, {args.minutes} min, {args.accounts} accounts, {args.rate}/s transfers, a fault "
          f"every {args.fault_every} s on average ({', '.join(kinds)}){', the design stores' if args.stores else ''}; "
          f"work in {work}", flush=True)
    settings = {"wal_level": "logical", "max_wal_senders": "20", "max_replication_slots": "20",
                "fsync": "on", "synchronous_commit": "on"}
    stop_load, stop_watch = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    stores = Stores() if args.stores else None
    with started_beside(LocalKafka(heap_mb=384)) as kafka_starting, \
            (stores.started() if stores else contextlib.nullcontext()) as stores_starting, \
            LocalPostgres(settings=settings) as pg, LocalS2(data_dir=work / "s2") as s2, ChdbClickHouse() as ch, \
            TcpProxy(pg.port) as proxy:
        kafka = kafka_starting.result()
        if stores_starting is not None:
            stores_starting.result()
            print(f"{time.monotonic() - run.started:7.1f} s: the design stores are up", flush=True)
        direct = pg.url
        via_proxy = direct.replace(f":{pg.port}/", f":{proxy.port}/")
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute("CREATE DATABASE meta")
            conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, v bigint NOT NULL)")
            conn.execute("INSERT INTO accounts SELECT g, %s, 0 FROM generate_series(0, %s) g",
                         (TOTAL_PER_ACCOUNT, args.accounts - 1))
            conn.execute("INSERT INTO accounts VALUES (%s, 0, 0)", (marker_id,))
            conn.execute("CREATE TABLE balances_copy (id int PRIMARY KEY, balance bigint, v bigint)")
        kafka.create_topic(KAFKA_TOPIC, 1, KAFKA_TOPIC_CONFIG)
        ch.sql("CREATE TABLE balances_copy (id Int32, balance Int64, v Int64) ENGINE = ReplacingMergeTree(v) "
               "ORDER BY id")
        meta_url = via_proxy.rsplit("/", 1)[0] + "/meta"
        config = {"pg_url": via_proxy, "meta": meta_url, "warehouse": str(work / "warehouse"),
                  "checkpoints": str(work / "checkpoints"), "ch_url": ch.url, "ch_password": ch.password,
                  "kafka": {"bootstrap": kafka.bootstrap_servers, "topic": KAFKA_TOPIC},
                  "s2": {"s2.basin": "sluice-soak", "s2.endpoints.account": s2.url,
                         "s2.endpoints.basin": s2.url, "s2.auth-token": s2.access_token},
                  "stores": stores.driver_config() if stores else {}}
        (work / "config.json").write_text(json.dumps(config))
        create_basin(s2, config["s2"]["s2.basin"])
        driver = Driver(work / "config.json", work / "driver.log")
        env = {"pg": pg, "s2": s2, "ch": ch, "kafka": kafka, "proxy": proxy, "driver": driver,
               "warehouse": str(work / "warehouse"),
               "admin_url": direct + "?application_name=soak-admin", "pipeline_url": direct, "stores": stores}
        writer_url = direct + "?application_name=soak-writer"
        threads += [threading.Thread(target=transfers, args=(writer_url, run, args.accounts, args.rate / 2, seed,
                                                             stop_load), daemon=True) for seed in (1, 2)]
        threads.append(threading.Thread(target=marker, args=(writer_url, run, marker_id, stop_load), daemon=True))
        watchers = [threading.Thread(target=watch_copy, args=(writer_url, run, marker_id, stop_watch), daemon=True),
                    *(threading.Thread(target=watch_barriers, args=(meta_url, str(work / "warehouse"), table, run,
                                                                    stop_watch, mark), daemon=True)
                      for table, mark in (("balances", None), ("balances_kafka", marker_id))),
                    *(threading.Thread(target=watch_store, args=(stores, copy, writer_url, run, marker_id, stop_watch),
                                       daemon=True) for copy in (stores.driver_config() if stores else {}))]
        try:
            driver.start()
            for t in threads + watchers:
                t.start()
            # Faults start once the pipeline carries changes end to end (the snapshot is through).
            warm_deadline = time.monotonic() + args.warm_up_s
            while not run.latencies and time.monotonic() < warm_deadline:
                time.sleep(0.5)
            if not run.latencies:
                run.violate(f"the pipeline carried nothing end to end within {args.warm_up_s:.0f} s of its start")
            warm = time.monotonic()
            # Sampled every SAMPLE_EVERY_S; growth is reported over the second half of the run, once retention (S2's
            # age, the MetaService's pruning) has reached its steady state.
            samples: list[Sample] = []
            sample_at = warm
            print(f"{warm - run.started:7.1f} s: the pipeline is through; "
                  f"{'faults begin' if kinds or first else 'a steady write, no faults'}", flush=True)
            strikes: list[threading.Thread] = []
            faults = Faults(env, run, rnd)
            end = warm + args.minutes * 60
            next_at = warm + rnd.expovariate(1 / args.fault_every)
            while time.monotonic() < end and run.latencies:
                now = time.monotonic()
                if now >= sample_at:
                    samples.append(Sample(now - warm, driver.starts,
                                          {**sample_growth(env, work), "transfers": run.transfers},
                                          python_memory(driver)))
                    sample_at = now + SAMPLE_EVERY_S
                if (kinds or first) and now >= next_at:
                    kind = first.pop(0) if first else rnd.choice(kinds)
                    strike = threading.Thread(target=faults.strike, args=(kind,), daemon=True)
                    strike.start()
                    strikes.append(strike)
                    next_at = now + rnd.expovariate(1 / args.fault_every)
                time.sleep(min(0.2, max(0.0, next_at - now)))
            for strike in strikes:
                strike.join()
            stop_load.set()
            for t in threads:
                t.join()
            print(f"{time.monotonic() - run.started:7.1f} s: writers stopped after {run.transfers:,} transfers; "
                  "waiting for the copies", flush=True)
            equal, why = wait_equal(env, accounts, args.catch_up_s)
            if not equal:
                run.violate(why)
            stop_watch.set()
            for t in watchers:
                t.join()
            samples.append(Sample(time.monotonic() - warm, driver.starts,
                                  {**sample_growth(env, work), "transfers": run.transfers}, python_memory(driver)))
            with psycopg.connect(direct, autocommit=True) as conn:
                slot_lag = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) "
                                        "FROM pg_replication_slots WHERE slot_name = 'soak_to_s2'").fetchone()
        finally:  # never leave the driver running against servers that are going away
            stop_load.set()
            stop_watch.set()
            driver.stop()
        for problem in check_s2_stream(s2, accounts) + check_kafka_topic(kafka, KAFKA_TOPIC, accounts):
            run.violate(problem)
    quiet_at = [(committed - warm, lat) for committed, lat in run.latencies if committed > warm and not any(
        f.at - 1 <= committed <= (f.recovered or time.monotonic()) for f in run.faults)]
    quiet = [lat for _, lat in quiet_at]
    by_kind: dict[str, list[Fault]] = {}
    for fault in run.faults:
        by_kind.setdefault(fault.kind, []).append(fault)
    slot_lag_bytes = int(slot_lag[0]) if slot_lag and slot_lag[0] is not None else None
    if slot_lag_bytes is None or slot_lag_bytes > 16 * 1024 * 1024:
        run.violate(f"the replication slot's lag at the end is {slot_lag_bytes} bytes (over 16 MiB, or no slot)")
    report = {
        "seed": args.seed, "minutes": args.minutes, "accounts": args.accounts, "transfers": run.transfers,
        "faults": len(run.faults),
        "faults_by_kind": {k: {"count": len(v), "recovery_s": [round(f.recovered - f.at, 1) if f.recovered else None
                                                                for f in v],
                               "notes": [f.note for f in v]} for k, v in sorted(by_kind.items())},
        "not_recovered": [f"{f.kind} at {f.at - run.started:.0f} s" for f in run.faults if f.recovered is None],
        "driver_starts": driver.starts, "barriers_checked": run.barriers_checked, "copy_reads": run.copy_reads,
        **({"design_store_reads": run.store_reads,
            "design_store_latency_s": {copy: p50_p99(lat) for copy, lat in sorted(run.store_latencies.items())},
            "design_store_promises": "per account: a state the source had, never ahead, never back; not the total "
                                     "(no transaction per micro-batch); equal to the source at the end"}
           if stores else {}),
        "latency_outside_faults_s": p50_p99(quiet),
        **growth_report(samples), "slot_lag_bytes": slot_lag_bytes,
        "windows": windows_report(samples, quiet_at, args.window_min * 60, args.minutes * 60),
        "python_processes": python_report(samples, args.window_min * 60),
        "invariant": "holds" if not run.violations else "VIOLATED", "violations": run.violations,
    }
    text = json.dumps(report, indent=2)
    print(text, flush=True)
    if args.report:
        args.report.write_text(text)
    if run.violations:
        print(f"the driver's log: {work / 'driver.log'}", flush=True)
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 1 if run.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
