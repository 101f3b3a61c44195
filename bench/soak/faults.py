"""The soak's faults (bench/soak/): the Spark driver process it kills and restarts, each fault kind, and the
sizes that must stay bounded."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

from bench.checkouts import ROOT, module_command
from bench.soak.bank import STORE_BRANCH_FAULTS, Fault, Run
from bench.soak.sizes import cmdline, parent

FAULT_KINDS = ("s2-kill", "pg-backends", "pg-replication", "pg-restart", "ch-restart", "worker-kill", "driver-kill",
               "net-stall", "net-cut", "meta-down", "kafka-broker")
# With --stores (bench/soak/stores.py): a Cassandra node, the OpenSearch node, HBase's Thrift2 gateway, HBase's
# master and region server (with the gateway), each SIGKILLed and started again 1-3 s later on its data.
STORE_FAULT_KINDS = tuple(kind for kinds in STORE_BRANCH_FAULTS.values() for kind in kinds)


class Driver:
    """The Spark driver process (bench/soak/driver.py), in a process group of its own so a kill takes its JVM."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(module_command("bench.soak.driver", str(self.config)),
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        out.close()
        self.starts += 1

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def tree(self) -> list[int]:
        """The driver's process and every descendant (its JVM, the JVM's Python workers)."""
        if self.proc is None:
            return []
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (ppid := parent(int(entry.name))) is not None:
                children.setdefault(ppid, []).append(int(entry.name))
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found


class Faults:
    def __init__(self, env: dict, run: Run, rnd: random.Random) -> None:
        self.env, self.run, self.rnd = env, run, rnd
        # Faults of different kinds overlap; two of one kind (two restarts of one server) strike one after the other.
        self._kinds = {kind: threading.Lock() for kind in FAULT_KINDS + STORE_FAULT_KINDS}
        # HBase's two kinds one after the other: the gateway cannot start while the server restarts.
        self._kinds["hbase-gateway"] = self._kinds["hbase-server"]

    def strike(self, kind: str) -> None:
        with self._kinds[kind]:
            self._strike(kind)

    def _strike(self, kind: str) -> None:
        fault = Fault(kind, time.monotonic())
        with self.run.lock:
            self.run.faults.append(fault)
        print(f"{fault.at - self.run.started:7.1f} s: fault {kind}", flush=True)
        try:
            if kind in STORE_FAULT_KINDS:
                fault.note = self.env["stores"].strike(kind, self.rnd)
            else:
                fault.note = getattr(self, "_" + kind.replace("-", "_"))() or ""
        except Exception as e:  # a fault that could not be struck is reported, never hidden
            fault.note = f"could not strike: {type(e).__name__}: {e}"
            print(f"fault {kind}: {fault.note}", flush=True)
        fault.done = time.monotonic()
        print(f"{fault.done - self.run.started:7.1f} s: fault {kind} done ({fault.done - fault.at:.1f} s"
              f"{', ' + fault.note if fault.note else ''})", flush=True)

    def _sql(self, statement: str, params: tuple = ()) -> list:
        import psycopg

        with psycopg.connect(self.env["admin_url"], autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def _s2_kill(self) -> str:
        self.env["s2"].kill()
        time.sleep(self.rnd.uniform(1, 3))
        self.env["s2"].restart()
        return ""

    def _pg_backends(self) -> str:
        rows = self._sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                         "AND pid <> pg_backend_pid() AND application_name NOT LIKE 'soak-%%'")
        return f"{len(rows)} backends"

    def _pg_replication(self) -> str:
        # The connection reading the slot: a walsender, or the backend holding the slot (active_pid).
        rows = self._sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'walsender' "
                         "OR pid IN (SELECT active_pid FROM pg_replication_slots WHERE active_pid IS NOT NULL)")
        return f"{len(rows)} connections"

    def _pg_restart(self) -> str:
        self.env["pg"].restart(crash=True)
        return ""

    def _ch_restart(self) -> str:
        self.env["ch"].restart()
        return ""

    def _worker_kill(self) -> str:
        """The driver's Python workers: the children of its pyspark daemons (forked, so named as the daemon)."""
        tree = self.env["driver"].tree()
        daemons = {pid for pid in tree if "pyspark.daemon" in cmdline(pid) or "pyspark/daemon" in cmdline(pid)}
        workers = [pid for pid in daemons if parent(pid) in daemons]
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return f"{len(workers)} workers"

    def _driver_kill(self) -> str:
        self.env["driver"].kill()
        time.sleep(self.rnd.uniform(0.5, 2))
        self.env["driver"].start()
        return ""

    def _net_stall(self) -> str:
        seconds = self.rnd.uniform(2, 5)
        self.env["proxy"].stall(seconds)
        return f"{seconds:.1f} s"

    def _net_cut(self) -> str:
        return f"{self.env['proxy'].cut()} connections"

    def _kafka_broker(self) -> str:
        """SIGKILL of the Kafka broker mid-transaction (the S2 -> Kafka hop writes one per micro-batch), restarted
        1-3 s later on its data and port."""
        self.env["kafka"].kill()
        time.sleep(self.rnd.uniform(1, 3))
        self.env["kafka"].start()
        return f"back in {self.env['kafka'].start_seconds:.1f} s"

    def _meta_down(self) -> str:
        seconds = self.rnd.uniform(2, 5)
        self._sql("ALTER DATABASE meta ALLOW_CONNECTIONS false")
        try:
            self._sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'meta'")
            time.sleep(seconds)
        finally:
            self._sql("ALTER DATABASE meta ALLOW_CONNECTIONS true")
        return f"{seconds:.1f} s"
