"""Fault suite: inject a fault into a running write, let Spark and sluice recover, count lost and duplicated rows.

Run: `.venv/bin/python -m bench.faults` (part of `make bench`; a few minutes on 2 cores). Each scenario writes
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
- driver-kill: a streaming query (one input file per micro-batch, bench/faults/stream_driver.py) has its driver's whole
  process group SIGKILLed after a few micro-batches and is started again on the same checkpoint.
- clickhouse, opensearch, hbase: the worker, rerun and driver-kill faults on each of these stores, and its server
  killed mid-write and started again on its data (HBase: the Thrift2 gateway, and the server); bench/faults/stores.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from datetime import date
from pathlib import Path

import sluice
from bench.faults import stores
from bench.faults.injected import S2Server
from bench.faults.scenarios import Scenarios
from bench.faults.stores import STORE_FAULTS
from sluice.testing import LocalPostgres

FAULTS = ("worker", "rerun", "tablestore", "s2-restart", "pg-terminate", "cassandra", "driver-kill", *STORE_FAULTS)


def run(scenarios: Scenarios, chosen: list[str] | None) -> None:
    """The faults `chosen` (all when None), in FAULTS' order."""
    for fault in FAULTS:
        if chosen and fault not in chosen:
            continue
        if fault in STORE_FAULTS:
            stores.run(scenarios.bench(), fault)
        else:
            getattr(scenarios, fault.replace("-", "_"))()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--only", action="append", choices=FAULTS, help="run only this fault (repeatable)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sluice-faults-"))
    os.environ.setdefault("SLUICE_STATS_DIR", str(work / "stats"))
    s2 = S2Server(work / "s2")
    s2.start()
    with LocalPostgres() as pg:
        spark = sluice.session("sluice-faults", **{"spark.sql.execution.arrow.maxRecordsPerBatch": "500"})
        scenarios = Scenarios(spark, args.rows, work, pg, s2)
        run(scenarios, args.only)
        spark.stop()
    s2.kill()
    print(json.dumps({"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                      "rows": args.rows, "results": scenarios.results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
