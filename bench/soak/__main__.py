"""The whole pipeline under fire: a bank in PostgreSQL, streamed through S2 and the table store into
PostgreSQL and ClickHouse copies, and from S2 through Kafka into a second table-store table (the Kafka
branch), while faults strike at random times; the bank's invariant is checked all along.

    .venv/bin/python -m bench.soak --minutes 30 --seed 7 --stores # make soak MINUTES=30
    .venv/bin/python -m bench.soak --minutes 1 --fault-every 8 --seed 11 --first kafka-broker  # make test's

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
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.measures import p50_p99
from bench.soak.bank import TOTAL_PER_ACCOUNT, Fault, Run, marker, transfers
from bench.soak.checks import check_kafka_topic, check_s2_stream, wait_equal, watch_barriers, watch_copy
from bench.soak.faults import FAULT_KINDS, STORE_FAULT_KINDS, Driver, Faults
from bench.soak.growth import growth, python_memory
from bench.soak.report import SAMPLE_EVERY_S, Sample, growth_report, python_report, windows_report
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


S2_RETENTION_S = 600  # the stream's retention age: a careful user bounds a stream that is a buffer between hops
KAFKA_TOPIC = "bank"
# The topic, a buffer between hops like the S2 stream, keeps as long; segments roll every minute so retention can
# delete them (it deletes whole segments only). One partition: see bench/soak/driver.py's hop 4.
KAFKA_TOPIC_CONFIG = {"retention.ms": str(S2_RETENTION_S * 1000), "segment.ms": "60000"}


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


def arguments() -> tuple[argparse.Namespace, list[str], list[str]]:
    """The options, the fault kinds to strike at random and those to strike first."""
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
    return args, kinds, first


class Soak:
    """One run: its servers, the pipeline on them, the load, the watchers and the faults; then its report."""

    def __init__(self, args: argparse.Namespace, kinds: list[str], first: list[str]) -> None:
        self.args, self.kinds, self.first = args, kinds, first
        self.rnd = random.Random(args.seed)
        self.accounts = args.accounts + 1  # and the marker
        self.marker_id = args.accounts
        self.run = Run(accounts=self.accounts, total=args.accounts * TOTAL_PER_ACCOUNT)
        self.work = Path(tempfile.mkdtemp(prefix="sluice-soak-"))
        self.stores = Stores() if args.stores else None
        self.stop_load, self.stop_watch = threading.Event(), threading.Event()

    @contextlib.contextmanager
    def servers(self) -> Iterator[tuple[Any, Any, Any, Any, Any]]:
        """The broker, the design stores (with --stores), PostgreSQL, S2, ClickHouse and the proxy in front of
        PostgreSQL, all started; stopped at the end whatever happened."""
        from sluice.s2local import LocalS2
        from sluice.testing import LocalKafka, LocalPostgres, TcpProxy
        from tests.clickhouse_chdb import ChdbClickHouse

        settings = {"wal_level": "logical", "max_wal_senders": "20", "max_replication_slots": "20",
                    "fsync": "on", "synchronous_commit": "on"}
        stores = self.stores
        with started_beside(LocalKafka(heap_mb=384)) as kafka_starting, \
                (stores.started() if stores else contextlib.nullcontext()) as stores_starting, \
                LocalPostgres(settings=settings) as pg, LocalS2(data_dir=self.work / "s2") as s2, \
                ChdbClickHouse() as ch, TcpProxy(pg.port) as proxy:
            kafka = kafka_starting.result()
            if stores_starting is not None:
                stores_starting.result()
                print(f"{time.monotonic() - self.run.started:7.1f} s: the design stores are up", flush=True)
            yield kafka, pg, s2, ch, proxy

    def prepare(self, kafka: Any, pg: Any, s2: Any, ch: Any, proxy: Any) -> None:
        """The bank and the copies' tables, the topic, the basin, and the driver's configuration."""
        import psycopg

        work = self.work
        self.direct = pg.url
        via_proxy = self.direct.replace(f":{pg.port}/", f":{proxy.port}/")
        with psycopg.connect(self.direct, autocommit=True) as conn:
            conn.execute("CREATE DATABASE meta")
            conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, v bigint NOT NULL)")
            conn.execute("INSERT INTO accounts SELECT g, %s, 0 FROM generate_series(0, %s) g",
                         (TOTAL_PER_ACCOUNT, self.args.accounts - 1))
            conn.execute("INSERT INTO accounts VALUES (%s, 0, 0)", (self.marker_id,))
            conn.execute("CREATE TABLE balances_copy (id int PRIMARY KEY, balance bigint, v bigint)")
        kafka.create_topic(KAFKA_TOPIC, 1, KAFKA_TOPIC_CONFIG)
        ch.sql("CREATE TABLE balances_copy (id Int32, balance Int64, v Int64) ENGINE = ReplacingMergeTree(v) "
               "ORDER BY id")
        self.meta_url = via_proxy.rsplit("/", 1)[0] + "/meta"
        config = {"pg_url": via_proxy, "meta": self.meta_url, "warehouse": str(work / "warehouse"),
                  "checkpoints": str(work / "checkpoints"), "ch_url": ch.url, "ch_password": ch.password,
                  "kafka": {"bootstrap": kafka.bootstrap_servers, "topic": KAFKA_TOPIC},
                  "s2": {"s2.basin": "sluice-soak", "s2.endpoints.account": s2.url,
                         "s2.endpoints.basin": s2.url, "s2.auth-token": s2.access_token},
                  "stores": self.stores.driver_config() if self.stores else {}}
        (work / "config.json").write_text(json.dumps(config))
        create_basin(s2, config["s2"]["s2.basin"])
        self.driver = Driver(work / "config.json", work / "driver.log")
        self.env = {"pg": pg, "s2": s2, "ch": ch, "kafka": kafka, "proxy": proxy, "driver": self.driver,
                    "warehouse": str(work / "warehouse"),
                    "admin_url": self.direct + "?application_name=soak-admin", "pipeline_url": self.direct,
                    "stores": self.stores}

    def threads(self) -> tuple[list[threading.Thread], list[threading.Thread]]:
        """The load (two writers of transfers, the marker) and the watchers (the copy, both tables' barriers, each
        design store's copy)."""
        args, run, stores, marker_id = self.args, self.run, self.stores, self.marker_id
        writer_url = self.direct + "?application_name=soak-writer"
        load = [threading.Thread(target=transfers, args=(writer_url, run, args.accounts, args.rate / 2, seed,
                                                         self.stop_load), daemon=True) for seed in (1, 2)]
        load.append(threading.Thread(target=marker, args=(writer_url, run, marker_id, self.stop_load), daemon=True))
        watchers = [
            threading.Thread(target=watch_copy, args=(writer_url, run, marker_id, self.stop_watch), daemon=True),
            *(threading.Thread(target=watch_barriers, args=(self.meta_url, str(self.work / "warehouse"), table, run,
                                                            self.stop_watch, mark), daemon=True)
              for table, mark in (("balances", None), ("balances_kafka", marker_id))),
            *(threading.Thread(target=watch_store, args=(stores, copy, writer_url, run, marker_id, self.stop_watch),
                               daemon=True) for copy in (stores.driver_config() if stores else {}))]
        return load, watchers

    def sample(self, warm: float) -> Sample:
        return Sample(time.monotonic() - warm, self.driver.starts,
                      {**sample_growth(self.env, self.work), "transfers": self.run.transfers},
                      python_memory(self.driver))

    def under_fire(self, warm: float) -> list[Sample]:
        """Faults at random (those of --first first) until the run's minutes are over, sampled every
        SAMPLE_EVERY_S; growth is reported over the second half of the run, once retention (S2's age, the
        MetaService's pruning) has reached its steady state."""
        args, run, rnd, kinds, first = self.args, self.run, self.rnd, self.kinds, self.first
        samples: list[Sample] = []
        sample_at = warm
        strikes: list[threading.Thread] = []
        faults = Faults(self.env, run, rnd)
        end = warm + args.minutes * 60
        next_at = warm + rnd.expovariate(1 / args.fault_every)
        while time.monotonic() < end and run.latencies:
            now = time.monotonic()
            if now >= sample_at:
                samples.append(self.sample(warm))
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
        return samples

    def pipeline(self) -> tuple[list[Sample], float, Any]:
        """The driver started, the load and watchers running; faults once the pipeline carries changes end to end
        (the snapshot is through); then the writers stopped and the copies caught up. (The samples, when the
        pipeline was through, the replication slot's lag at the end.)"""
        import psycopg

        args, run = self.args, self.run
        load, watchers = self.threads()
        try:
            self.driver.start()
            for t in load + watchers:
                t.start()
            warm_deadline = time.monotonic() + args.warm_up_s
            while not run.latencies and time.monotonic() < warm_deadline:
                time.sleep(0.5)
            if not run.latencies:
                run.violate(f"the pipeline carried nothing end to end within {args.warm_up_s:.0f} s of its start")
            warm = time.monotonic()
            print(f"{warm - run.started:7.1f} s: the pipeline is through; "
                  f"{'faults begin' if self.kinds or self.first else 'a steady write, no faults'}", flush=True)
            samples = self.under_fire(warm)
            self.stop_load.set()
            for t in load:
                t.join()
            print(f"{time.monotonic() - run.started:7.1f} s: writers stopped after {run.transfers:,} transfers; "
                  "waiting for the copies", flush=True)
            equal, why = wait_equal(self.env, self.accounts, args.catch_up_s)
            if not equal:
                run.violate(why)
            self.stop_watch.set()
            for t in watchers:
                t.join()
            samples.append(self.sample(warm))
            with psycopg.connect(self.direct, autocommit=True) as conn:
                slot_lag = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) "
                                        "FROM pg_replication_slots WHERE slot_name = 'soak_to_s2'").fetchone()
        finally:  # never leave the driver running against servers that are going away
            self.stop_load.set()
            self.stop_watch.set()
            self.driver.stop()
        return samples, warm, slot_lag

    def report(self, samples: list[Sample], warm: float, slot_lag: Any) -> dict:
        args, run = self.args, self.run
        quiet_at = [(committed - warm, lat) for committed, lat in run.latencies if committed > warm and not any(
            f.at - 1 <= committed <= (f.recovered or time.monotonic()) for f in run.faults)]
        quiet = [lat for _, lat in quiet_at]
        by_kind: dict[str, list[Fault]] = {}
        for fault in run.faults:
            by_kind.setdefault(fault.kind, []).append(fault)
        slot_lag_bytes = int(slot_lag[0]) if slot_lag and slot_lag[0] is not None else None
        if slot_lag_bytes is None or slot_lag_bytes > 16 * 1024 * 1024:
            run.violate(f"the replication slot's lag at the end is {slot_lag_bytes} bytes (over 16 MiB, or no slot)")
        return {
            "seed": args.seed, "minutes": args.minutes, "accounts": args.accounts, "transfers": run.transfers,
            "faults": len(run.faults),
            "faults_by_kind": {k: {"count": len(v),
                                   "recovery_s": [round(f.recovered - f.at, 1) if f.recovered else None for f in v],
                                   "notes": [f.note for f in v]} for k, v in sorted(by_kind.items())},
            "not_recovered": [f"{f.kind} at {f.at - run.started:.0f} s" for f in run.faults if f.recovered is None],
            "driver_starts": self.driver.starts, "barriers_checked": run.barriers_checked,
            "copy_reads": run.copy_reads,
            **({"design_store_reads": run.store_reads,
                "design_store_latency_s": {copy: p50_p99(lat) for copy, lat in sorted(run.store_latencies.items())},
                "design_store_promises": "per account: a state the source had, never ahead, never back; not the "
                                         "total (no transaction per micro-batch); equal to the source at the end"}
               if self.stores else {}),
            "latency_outside_faults_s": p50_p99(quiet),
            **growth_report(samples), "slot_lag_bytes": slot_lag_bytes,
            "windows": windows_report(samples, quiet_at, args.window_min * 60, args.minutes * 60),
            "python_processes": python_report(samples, args.window_min * 60),
            "invariant": "holds" if not run.violations else "VIOLATED", "violations": run.violations,
        }


def main() -> int:
    args, kinds, first = arguments()
    # A SIGTERM (timeout, Ctrl-C's cousin) ends the run through its finally blocks: every server and the driver stop.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))

    soak = Soak(args, kinds, first)
    run, work = soak.run, soak.work
    print(f"soak: seed {args.seed}, {args.minutes} min, {args.accounts} accounts, {args.rate}/s transfers, a fault "
          f"every {args.fault_every} s on average ({', '.join(kinds)}){', the design stores' if args.stores else ''}; "
          f"work in {work}", flush=True)
    with soak.servers() as (kafka, pg, s2, ch, proxy):
        soak.prepare(kafka, pg, s2, ch, proxy)
        samples, warm, slot_lag = soak.pipeline()
        for problem in check_s2_stream(s2, soak.accounts) + check_kafka_topic(kafka, KAFKA_TOPIC, soak.accounts):
            run.violate(problem)
    report = soak.report(samples, warm, slot_lag)
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
