"""Fault suite: inject a fault into a running write, let Spark and sluice recover, count lost and duplicated rows.

Run: `.venv/bin/python bench/faults.py` (part of `make bench`; a few minutes on 2 cores). Each scenario writes
ids 0..N-1 (rows padded to ~200 bytes, small Arrow batches so the fault lands mid-write) and then counts the
target: lost = ids missing, duplicated = rows beyond one per id. Faults (those not covered yet are listed at
the end of the output, and in docs/reliability.md):
- worker: the Python worker writing ids >= N/2 dies (os._exit) once; Spark retries the task (local[2,4]).
- rerun: the write fails part-way (a row raises); it is run again, with the same write id where the format
  has one (transactional modes), as a user re-runs a failed job.
- s2-restart: the local S2 server (durable) is SIGKILLed mid-write and restarted on the same port.
- pg-terminate: every PostgreSQL backend of the write is terminated (pg_terminate_backend) mid-write.
- cassandra: format("cassandra") (batches of one partition) under a worker death, a re-run after a failure, and
  its node SIGKILLed mid-write and started again on its data (a LocalCassandra; about a minute to start).
- driver-kill: a streaming query (one input file per micro-batch, bench/stream_driver.py) has its driver's whole
  process group SIGKILLed after a few micro-batches and is started again on the same checkpoint.
- clickhouse, opensearch, hbase: the worker, rerun and driver-kill faults on each of these stores, and its server
  killed mid-write and started again on its data (HBase: the Thrift2 gateway, and the server); bench/_faults_stores.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import date
from pathlib import Path

# This script's folder comes first on sys.path, where bench/cassandra.py would shadow the driver's `cassandra`
# package (which LocalCassandra and format("cassandra") import).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the stores' helpers and the chdb stand-in
sys.path.append(str(Path(__file__).resolve().parent))  # last: bench/_faults_stores.py, behind the installed packages

import _faults_stores as stores  # noqa: E402
import psycopg  # noqa: E402
import s2_sdk  # noqa: E402
from _faults_stores import STORE_FAULTS, Bench  # noqa: E402

import sluice  # noqa: E402
from sluice.testing import LocalCassandra, LocalPostgres  # noqa: E402


def write(base, fmt: str, opts: dict, fault) -> None:
    """Rows laid out as sluice.write() lays them out, the fault injected in the writing stage itself (a fault
    before a shuffle would fail the job before any row is written), then written."""
    laid_out = base if fmt == "tablestore" else sluice.partitioned(base, fmt, opts)
    laid_out.mapInArrow(fault, base.schema).write.format(fmt).options(**opts).mode("append").save()


def expect_failure(write) -> None:
    """Run a write that the scenario makes fail; it must fail."""
    try:
        write()
    except Exception:
        return
    raise AssertionError("the injected failure did not fail the write")


def strike_at(row: int, marker: str, *, die: bool):
    """Pass-through mapInArrow that strikes on reaching id `row` while the file `marker` exists: `die` removes the
    marker and kills the worker (os._exit; Spark retries the task), else it raises (the write fails)."""

    def fn(batches):
        import os as _os

        for batch in batches:
            for start in range(0, batch.num_rows, 100):
                part = batch.slice(start, 100)
                if part.column(0)[0].as_py() >= row and _os.path.exists(marker):
                    if die:
                        _os.remove(marker)
                        _os._exit(1)
                    raise RuntimeError(f"injected failure at id {row}")
                yield part

    return fn


def paced(pause: float):
    def fn(batches):
        import time as _time

        for batch in batches:
            for start in range(0, batch.num_rows, 100):
                _time.sleep(pause)
                yield batch.slice(start, 100)

    return fn


class S2Server:
    """The local S2 server on a fixed port and data dir, so it can be killed and started again in place."""

    def __init__(self, data: Path) -> None:
        self.data = data
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        ready = self.data.with_suffix(".ready")
        ready.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "sluice.s2local", "--port", str(self.port),
                                      "--data-dir", str(self.data), "--ready-file", str(ready)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError("the S2 server did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def records(self, basin: str, stream: str) -> list[dict]:
        async def go():
            endpoints = s2_sdk.Endpoints(account=self.url, basin=self.url)
            async with s2_sdk.S2("bench", endpoints=endpoints) as s2:
                handle = s2.basin(basin).stream(stream)
                tail = (await handle.check_tail()).seq_num
                out = []
                if tail:
                    async for batch in handle.read_session(start=s2_sdk.SeqNum(0), limit=s2_sdk.ReadLimit(count=tail)):
                        out.extend(batch.records)
                return [{**json.loads(r.body or b"{}"), **json.loads(dict(r.headers).get(b"@key", b"{}"))}
                        for r in out if not r.is_command_record()]

        return asyncio.run(go())


PAUSE = 0.03  # per 100 rows: a 20,000-row write runs a few seconds, so a strike at 1 s lands mid-write


def landed(struck: list[float], ended: float) -> str:
    if not struck or struck[0] == float("inf"):
        return "strike found nothing to strike"
    return "struck mid-write" if struck[0] < ended else "strike came after the write (not a valid run)"


FAULTS = ("worker", "rerun", "tablestore", "s2-restart", "pg-terminate", "cassandra", "driver-kill", *STORE_FAULTS)
STREAM_FILES = 10  # micro-batches of the streaming scenario
KILL_AFTER_BATCHES = 3
DRIVER = Path(__file__).with_name("stream_driver.py")


def restarted_mid_write(server, write_it: Callable[[], None]) -> str:
    """Run `write_it` while, a second in, `server` (kill() and start(): the S2 server, a LocalCassandra) is killed
    and started again on its data; says whether the strike landed mid-write."""
    struck: list[float] = []

    def strike() -> None:
        time.sleep(1.0)  # a bench, not a test: strike once the write is under way
        server.kill()
        struck.append(time.monotonic())
        server.start()

    striker = threading.Thread(target=strike)
    striker.start()
    write_it()
    ended = time.monotonic()
    striker.join()
    return landed(struck, ended)


def run_driver(fmt: str, opts: dict, inputs: Path, checkpoint: Path, **popen) -> subprocess.Popen:
    args = [sys.executable, str(DRIVER), fmt, json.dumps(opts), str(inputs), str(checkpoint)]
    if popen:
        return subprocess.Popen(args, **popen)
    return subprocess.run(args, capture_output=True)


def kill_driver_after(fmt: str, opts: dict, inputs: Path, checkpoint: Path, batches: int) -> int:
    """Start the streaming driver; once `batches` micro-batches are committed and the next one is under way (its
    offsets logged, its commit not), let it write for a moment, then SIGKILL the process group (driver, JVM,
    Python workers). Returns how many micro-batches were committed when it died."""
    log = checkpoint.with_suffix(".log")
    with log.open("wb") as out:
        proc = run_driver(fmt, opts, inputs, checkpoint, start_new_session=True, stdout=out, stderr=out)

    def count(folder: str) -> int:
        path = checkpoint / folder
        return len(list(path.glob("[0-9]*"))) if path.exists() else 0

    while not (count("commits") >= batches and count("offsets") > count("commits")):
        if proc.poll() is not None:
            raise RuntimeError(f"the streaming driver for {fmt} exited ({proc.returncode}) before the kill; its "
                               f"log: {log}")
        time.sleep(0.05)
    time.sleep(0.5)  # a bench, not a test: the micro-batch's tasks are writing now (each takes ~1 s, paced)
    committed = count("commits")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return committed


def counts(ids: list[int], n: int) -> dict[str, int]:
    seen = Counter(ids)
    return {"lost": sum(1 for i in range(n) if i not in seen), "duplicated": sum(c - 1 for c in seen.values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--only", action="append", choices=FAULTS, help="run only this fault (repeatable)")
    args = parser.parse_args()

    def want(fault: str) -> bool:
        return not args.only or fault in args.only

    n = args.rows
    work = Path(tempfile.mkdtemp(prefix="sluice-faults-"))
    os.environ.setdefault("SLUICE_STATS_DIR", str(work / "stats"))
    results: list[dict] = []
    s2 = S2Server(work / "s2")
    s2.start()
    with LocalPostgres() as pg:
        spark = sluice.session("sluice-faults", **{"spark.sql.execution.arrow.maxRecordsPerBatch": "500"})
        base = spark.range(0, n, 1, 2).selectExpr("id", "id % 50 AS k", "repeat('x', 200) AS pad").cache()
        base.count()
        s2_common = {"s2.endpoints.account": s2.url, "s2.endpoints.basin": s2.url, "s2.auth-token": "bench",
                     "s2.create-basin": "true", "s2.create-streams": "true", "sink.retry-delay-ms": "200",
                     "sink.max-retries": "20", "s2.max-retries": "10"}
        s2_modes = {
            "s2 unordered": ("s2", {}),
            "s2 partition-ordered": ("s2", {"sink.mode": "partition-ordered", "sink.partition-key": "k"}),
            "s2 exactly-once": ("s2", {"sink.mode": "global-ordered", "sink.transactional": "true"}),
            "s2_upsert": ("s2_upsert", {"primary-key": "id"}),
        }
        pg_modes = {
            "postgres append": {},
            "postgres upsert": {"primary-key": "id"},
            "postgres transactional": {"sink.mode": "global-ordered", "sink.transactional": "true"},
        }

        store = {"warehouse": str(work / "warehouse"), "meta": str(work / "meta.db")}

        def pg_ids(table: str) -> list[int]:
            with psycopg.connect(pg.url) as conn:
                return [r[0] for r in conn.execute(f'SELECT id FROM "{table}"')]

        def s2_ids(basin: str, fmt: str) -> list[int]:
            return [r["id"] for r in s2.records(basin, "s")]  # upserts: the id comes from the @key header

        def record(fault: str, target: str, ids: list[int], note: str = "") -> None:
            entry = {"fault": fault, "target": target, **counts(ids, n), "note": note}
            results.append(entry)
            print(json.dumps(entry), flush=True)

        if want("worker"):
            # ---- worker: a Python worker dies once, mid-task; Spark retries the task
            for name, (fmt, extra) in s2_modes.items():
                basin, marker = f"faults-{uuid.uuid4().hex[:10]}", work / f"die-{uuid.uuid4().hex[:6]}"
                marker.touch()
                write(base, fmt, {**s2_common, **extra, "s2.basin": basin, "s2.stream": "s"},
                      strike_at(n * 3 // 4, str(marker), die=True))
                record("worker", name, s2_ids(basin, fmt))
            for name, extra in pg_modes.items():
                table, marker = f"f_{uuid.uuid4().hex[:10]}", work / f"die-{uuid.uuid4().hex[:6]}"
                marker.touch()
                write(base, "postgres", {"url": pg.url, "table": table, "create-table": "true", **extra},
                      strike_at(n * 3 // 4, str(marker), die=True))
                record("worker", name, pg_ids(table))

        if want("rerun"):
            # ---- rerun: a write fails part-way and is run again (with its write id where the mode has one)
            for name, (fmt, extra) in s2_modes.items():
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
            for name, extra in pg_modes.items():
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

        if want("tablestore"):
            # ---- the table store under the same worker death and re-run
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

        if want("s2-restart"):
            # ---- s2-restart: the S2 server is killed mid-write and started again on the same port and data
            for name, (fmt, extra) in s2_modes.items():
                basin = f"faults-{uuid.uuid4().hex[:10]}"
                note = restarted_mid_write(s2, lambda fmt=fmt, extra=extra, basin=basin: write(
                    base, fmt, {**s2_common, **extra, "s2.basin": basin, "s2.stream": "s"}, paced(PAUSE)))
                record("s2-restart", name, s2_ids(basin, fmt), note)

        if want("pg-terminate"):
            # ---- pg-terminate: every backend of the write is terminated mid-write
            for name, extra in pg_modes.items():
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
        if want("cassandra"):
            # ---- cassandra: upserts by primary key, so a replay rewrites rows in place (never duplicates them)
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

        inputs = work / "stream-input"

        def stream_input() -> Path:
            if not inputs.exists():
                base.repartition(STREAM_FILES).write.parquet(str(inputs))
            return inputs

        if want("driver-kill"):
            # ---- driver-kill: a streaming driver is SIGKILLed mid-stream and restarted from its checkpoint
            stream_input()
            targets: dict[str, tuple[str, dict, Callable[[], list[int]]]] = {}
            for name, (fmt, extra) in s2_modes.items():
                basin = f"faults-{uuid.uuid4().hex[:10]}"
                targets[name] = (fmt, {**s2_common, **extra, "s2.basin": basin, "s2.stream": "s"},
                                 lambda basin=basin, fmt=fmt: s2_ids(basin, fmt))
            for name, extra in pg_modes.items():
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
        bench = Bench(base, n, work, stream_input, write, strike_at, paced(PAUSE), expect_failure,
                      kill_driver_after, run_driver, record)
        for store in STORE_FAULTS:
            if want(store):
                stores.run(bench, store)
        spark.stop()
    s2.kill()
    print(json.dumps({"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                      "rows": n, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
