"""bench/faults/'s scenarios on S2, PostgreSQL, the table store and Cassandra: each fault struck into every mode of
each store, its lost and duplicated rows recorded (ClickHouse's, OpenSearch's and HBase's are in
bench/faults/stores.py)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.faults.injected import (
    KILL_AFTER_BATCHES,
    PAUSE,
    STREAM_FILES,
    S2Server,
    counts,
    expect_failure,
    kill_driver_after,
    landed,
    paced,
    restarted_mid_write,
    run_driver,
    strike_at,
    write,
)
from bench.faults.stores import Bench
from sluice.testing import LocalCassandra, LocalPostgres

S2_MODES = {
    "s2 unordered": ("s2", {}),
    "s2 partition-ordered": ("s2", {"sink.mode": "partition-ordered", "sink.partition-key": "k"}),
    "s2 exactly-once": ("s2", {"sink.mode": "global-ordered", "sink.transactional": "true"}),
    "s2_upsert": ("s2_upsert", {"primary-key": "id"}),
}
PG_MODES = {
    "postgres append": {},
    "postgres upsert": {"primary-key": "id"},
    "postgres transactional": {"sink.mode": "global-ordered", "sink.transactional": "true"},
}


class Scenarios:
    """The rows (ids 0..n-1, cached), the servers they are written to, and the results so far."""

    def __init__(self, spark: Any, n: int, work: Path, pg: LocalPostgres, s2: S2Server) -> None:
        self.spark, self.n, self.work, self.pg, self.s2 = spark, n, work, pg, s2
        self.base = spark.range(0, n, 1, 2).selectExpr("id", "id % 50 AS k", "repeat('x', 200) AS pad").cache()
        self.base.count()
        self.s2_common = {"s2.endpoints.account": s2.url, "s2.endpoints.basin": s2.url, "s2.auth-token": "bench",
                          "s2.create-basin": "true", "s2.create-streams": "true", "sink.retry-delay-ms": "200",
                          "sink.max-retries": "20", "s2.max-retries": "10"}
        self.store = {"warehouse": str(work / "warehouse"), "meta": str(work / "meta.db")}
        self.inputs = work / "stream-input"
        self.results: list[dict] = []

    def pg_ids(self, table: str) -> list[int]:
        with psycopg.connect(self.pg.url) as conn:
            return [r[0] for r in conn.execute(f'SELECT id FROM "{table}"')]

    def s2_ids(self, basin: str, fmt: str) -> list[int]:
        return [r["id"] for r in self.s2.records(basin, "s")]  # upserts: the id comes from the @key header

    def record(self, fault: str, target: str, ids: list[int], note: str = "") -> None:
        entry = {"fault": fault, "target": target, **counts(ids, self.n), "note": note}
        self.results.append(entry)
        print(json.dumps(entry), flush=True)

    def stream_input(self) -> Path:
        """The streaming scenarios' parquet input, STREAM_FILES files, written once."""
        if not self.inputs.exists():
            self.base.repartition(STREAM_FILES).write.parquet(str(self.inputs))
        return self.inputs

    def bench(self) -> Bench:
        """What bench/faults/stores.py's scenarios use."""
        return Bench(self.base, self.n, self.work, self.stream_input, write, strike_at, paced(PAUSE), expect_failure,
                     kill_driver_after, run_driver, self.record)

    def worker(self) -> None:
        """A Python worker dies once, mid-task; Spark retries the task."""
        base, n, work, pg, s2_common, record, pg_ids, s2_ids = (
            self.base, self.n, self.work, self.pg, self.s2_common, self.record, self.pg_ids, self.s2_ids)
        for name, (fmt, extra) in S2_MODES.items():
            basin, marker = f"faults-{uuid.uuid4().hex[:10]}", work / f"die-{uuid.uuid4().hex[:6]}"
            marker.touch()
            write(base, fmt, {**s2_common, **extra, "s2.basin": basin, "s2.stream": "s"},
                  strike_at(n * 3 // 4, str(marker), die=True))
            record("worker", name, s2_ids(basin, fmt))
        for name, extra in PG_MODES.items():
            table, marker = f"f_{uuid.uuid4().hex[:10]}", work / f"die-{uuid.uuid4().hex[:6]}"
            marker.touch()
            write(base, "postgres", {"url": pg.url, "table": table, "create-table": "true", **extra},
                  strike_at(n * 3 // 4, str(marker), die=True))
            record("worker", name, pg_ids(table))

    def rerun(self) -> None:
        """A write fails part-way and is run again (with its write id where the mode has one)."""
        base, n, work, pg, s2_common, record, pg_ids, s2_ids = (
            self.base, self.n, self.work, self.pg, self.s2_common, self.record, self.pg_ids, self.s2_ids)
        for name, (fmt, extra) in S2_MODES.items():
            basin, marker = f"faults-{uuid.uuid4().hex[:10]}", work / f"fail-{uuid.uuid4().hex[:6]}"
            marker.touch()
            opts = {**s2_common, **extra, "s2.basin": basin, "s2.stream": "s", "sink.max-retries": "0"}
            if extra.get("sink.transactional"):
                opts["sink.write-id"] = f"rerun-{basin}"
            fault = strike_at(n * 3 // 4, str(marker), die=False)
            expect_failure(lambda fmt=fmt, opts=opts, fault=fault: write(base, fmt, opts, fault))
            marker.unlink()
            write(base, fmt, opts, fault)
            record("rerun", name, s2_ids(basin, fmt),
                   "same write id" if "sink.write-id" in opts else "no write id: a re-run is a new write")
        for name, extra in PG_MODES.items():
            table, marker = f"f_{uuid.uuid4().hex[:10]}", work / f"fail-{uuid.uuid4().hex[:6]}"
            marker.touch()
            opts = {"url": pg.url, "table": table, "create-table": "true", **extra}
            if extra.get("sink.transactional"):
                opts["sink.write-id"] = f"rerun-{table}"
            fault = strike_at(n * 3 // 4, str(marker), die=False)
            expect_failure(lambda opts=opts, fault=fault: write(base, "postgres", opts, fault))
            marker.unlink()
            write(base, "postgres", opts, fault)
            record("rerun", name, pg_ids(table),
                   "same write id" if "sink.write-id" in opts else "no write id: a re-run is a new write")

    def tablestore(self) -> None:
        """The table store under the same worker death and re-run."""
        base, n, work, spark, store, record = self.base, self.n, self.work, self.spark, self.store, self.record
        for name, extra in {"tablestore append": {}, "tablestore upsert": {"primary-key": "id"}}.items():
            table, marker = f"f_{uuid.uuid4().hex[:10]}", work / f"die-{uuid.uuid4().hex[:6]}"
            marker.touch()
            write(base, "tablestore", {**store, "table": table, **extra},
                  strike_at(n * 3 // 4, str(marker), die=True))
            ids = [r.id for r in spark.read.format("tablestore").options(**store, table=table).load().collect()]
            record("worker", name, ids)
            table, marker = f"f_{uuid.uuid4().hex[:10]}", work / f"fail-{uuid.uuid4().hex[:6]}"
            marker.touch()
            opts = {**store, "table": table, "write-id": f"rerun-{table}", **extra}
            fault = strike_at(n * 3 // 4, str(marker), die=False)
            expect_failure(lambda opts=opts, fault=fault: write(base, "tablestore", opts, fault))
            marker.unlink()
            write(base, "tablestore", opts, fault)
            ids = [r.id for r in spark.read.format("tablestore").options(**store, table=table).load().collect()]
            record("rerun", name, ids, "same write id")

    def s2_restart(self) -> None:
        """The S2 server is killed mid-write and started again on the same port and data."""
        base, s2, s2_common, record, s2_ids = self.base, self.s2, self.s2_common, self.record, self.s2_ids
        for name, (fmt, extra) in S2_MODES.items():
            basin = f"faults-{uuid.uuid4().hex[:10]}"
            note = restarted_mid_write(s2, lambda fmt=fmt, extra=extra, basin=basin: write(
                base, fmt, {**s2_common, **extra, "s2.basin": basin, "s2.stream": "s"}, paced(PAUSE)))
            record("s2-restart", name, s2_ids(basin, fmt), note)

    def pg_terminate(self) -> None:
        """Every backend of the write is terminated mid-write."""
        base, pg, record, pg_ids = self.base, self.pg, self.record, self.pg_ids
        for name, extra in PG_MODES.items():
            table = f"f_{uuid.uuid4().hex[:10]}"
            struck = []

            def terminate(struck: list[float] = struck) -> None:
                # Strike as soon as the write's COPY connections are there (planning takes a while).
                with psycopg.connect(pg.url, autocommit=True) as conn:
                    deadline = time.monotonic() + 20
                    while time.monotonic() < deadline:
                        killed = conn.execute(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid <> "
                            "pg_backend_pid() AND datname = current_database() AND backend_type = 'client backend' "
                            "AND query ILIKE 'COPY%'").fetchone()[0]
                        if killed:
                            struck.append(time.monotonic())
                            return
                        time.sleep(0.02)
                struck.append(float("inf"))

            striker = threading.Thread(target=terminate)
            striker.start()
            write(base, "postgres", {"url": pg.url, "table": table, "create-table": "true", "connect.retries": "5",
                                     "sink.max-retries": "10", "sink.retry-delay-ms": "200", **extra},
                  paced(PAUSE))
            ended = time.monotonic()
            striker.join()
            record("pg-terminate", name, pg_ids(table),
                   landed(struck, ended))

    def cassandra(self) -> None:
        """Upserts by primary key, so a replay rewrites rows in place (never duplicates them)."""
        base, n, work, record = self.base, self.n, self.work, self.record
        with LocalCassandra(commitlog_sync="batch") as node, node.cluster() as cluster:
            session = cluster.connect()
            session.execute("CREATE KEYSPACE faults WITH replication = {'class': 'SimpleStrategy', "
                            "'replication_factor': 1}")
            cass = {"host": node.host, "port": str(node.port), "keyspace": "faults", "sink.max-retries": "30",
                    "sink.retry-delay-ms": "200", "request.timeout-ms": "2000"}

            def cass_table() -> str:
                table = f"f_{uuid.uuid4().hex[:10]}"
                session.execute(f"CREATE TABLE faults.{table} (id bigint PRIMARY KEY, k bigint, pad text)")
                return table

            def cass_ids(table: str) -> list[int]:
                return [r[0] for r in session.execute(f"SELECT id FROM faults.{table}")]

            table, marker = cass_table(), work / f"die-{uuid.uuid4().hex[:6]}"
            marker.touch()
            write(base, "cassandra", {**cass, "table": table}, strike_at(n * 3 // 4, str(marker), die=True))
            record("worker", "cassandra", cass_ids(table))
            table, marker = cass_table(), work / f"fail-{uuid.uuid4().hex[:6]}"
            marker.touch()
            opts = {**cass, "table": table, "sink.max-retries": "0"}
            fault = strike_at(n * 3 // 4, str(marker), die=False)
            expect_failure(lambda opts=opts, fault=fault: write(base, "cassandra", opts, fault))
            marker.unlink()
            write(base, "cassandra", opts, fault)
            record("rerun", "cassandra", cass_ids(table), "upserts: the re-run rewrites the rows it repeats")
            table = cass_table()
            note = restarted_mid_write(node, lambda table=table: write(
                base, "cassandra", {**cass, "table": table}, paced(PAUSE)))
            record("cassandra-restart", "cassandra", cass_ids(table), note)

    def driver_kill(self) -> None:
        """A streaming driver is SIGKILLed mid-stream and restarted from its checkpoint."""
        work, pg, spark, s2_common, store, record, pg_ids, s2_ids, stream_input, inputs = (
            self.work, self.pg, self.spark, self.s2_common, self.store, self.record, self.pg_ids, self.s2_ids,
            self.stream_input, self.inputs)
        stream_input()
        targets: dict[str, tuple[str, dict, Callable[[], list[int]]]] = {}
        for name, (fmt, extra) in S2_MODES.items():
            basin = f"faults-{uuid.uuid4().hex[:10]}"
            targets[name] = (fmt, {**s2_common, **extra, "s2.basin": basin, "s2.stream": "s"},
                             lambda basin=basin, fmt=fmt: s2_ids(basin, fmt))
        for name, extra in PG_MODES.items():
            table = f"f_{uuid.uuid4().hex[:10]}"
            targets[name] = ("postgres", {"url": pg.url, "table": table, "create-table": "true", **extra},
                             lambda table=table: pg_ids(table))
        for name, extra in {"tablestore append": {}, "tablestore upsert": {"primary-key": "id"}}.items():
            table = f"f_{uuid.uuid4().hex[:10]}"
            targets[name] = ("tablestore", {**store, "table": table, **extra},
                             lambda table=table: [r.id for r in spark.read.format("tablestore")
                                                  .options(**store, table=table).load().collect()])
        for name, (fmt, opts, read_ids) in targets.items():
            checkpoint = work / f"ckpt-{uuid.uuid4().hex[:8]}"
            committed = kill_driver_after(fmt, opts, inputs, checkpoint, KILL_AFTER_BATCHES)
            restarted = run_driver(fmt, opts, inputs, checkpoint)
            if restarted.returncode:
                raise RuntimeError(f"the restarted driver for {name} failed: {restarted.stderr.decode()[-3000:]}")
            record("driver-kill", name, read_ids(), f"killed while micro-batch {committed} of {STREAM_FILES} was "
                                                    "being written")
