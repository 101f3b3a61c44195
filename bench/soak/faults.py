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
from typing import Any

from bench.checkouts import ROOT, module_command
from bench.soak.bank import STORE_BRANCH_FAULTS, Fault, Run

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


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def rss_bytes(pids: list[int]) -> int:
    return _field_bytes(pids, "status", "VmRSS:")


def pss_bytes(pids: list[int]) -> int:
    """Proportional set size: Spark's Python workers are forked from one daemon and share its pages, which a sum of
    their RSS counts once per worker (26 processes summed to 4.5 GB)."""
    return _field_bytes(pids, "smaps_rollup", "Pss:")


def python_memory(driver: Driver) -> dict[int, tuple[str, int, int]]:
    """Each Python process of the driver's tree: its role (the driver, Spark's worker daemon, a worker the daemon
    forked, a runner Spark started on its own), its proportional set size and its RSS, so that a growth of their sum
    is traced to the processes that grew (a PSS also grows when a process sharing its pages exits; its RSS does
    not)."""
    tree = driver.tree()
    memory = {}
    for pid in tree:
        if command(pid) == "java":
            continue
        if pid == tree[0]:
            role = "driver"
        elif "pyspark.daemon" in cmdline(pid):
            role = "worker" if "pyspark.daemon" in cmdline(parent(pid) or 0) else "daemon"
        elif " -m pyspark." in cmdline(pid):
            role = "runner"  # a worker Spark starts on its own, not forked: a streaming source's runner
        else:
            role = command(pid)
        memory[pid] = (role, pss_bytes([pid]), rss_bytes([pid]))
    return memory


def _field_bytes(pids: list[int], file: str, field: str) -> int:
    """The sum over `pids` of a field in kB of /proc/<pid>/<file>; a process gone in between counts 0."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
                if line.startswith(field):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def warehouse_bytes(path: Path) -> dict[str, int]:
    """The warehouse, and what it holds by kind: each table's log (`_delta_log`), its change data (`_change_data`:
    each merge's, kept as long as the log entry naming it), its live files (the current version's add actions) and
    the rest (files removed by a merge and not yet vacuumed). The live files are read before the folder is walked: a
    file live then is still on disk (a vacuum deletes only files removed over an hour ago), so the rest never reads
    negative while the tables are written."""
    from deltalake import DeltaTable

    kinds = ("warehouse_bytes", "warehouse_log_bytes", "warehouse_change_bytes", "warehouse_live_bytes",
             "warehouse_removed_bytes")
    if not path.exists():
        return dict.fromkeys(kinds, 0)
    live = sum(sum(DeltaTable(str(log.parent)).get_add_actions(flatten=True).column("size_bytes").to_pylist())
               for log in path.rglob("_delta_log"))
    sizes = [(f.stat().st_size, f.parts) for f in path.rglob("*") if f.is_file()]
    log = sum(size for size, parts in sizes if "_delta_log" in parts)
    change = sum(size for size, parts in sizes if "_change_data" in parts)
    total = sum(size for size, _ in sizes)
    return dict(zip(kinds, (total, log, change, live, total - log - change - live), strict=True))


def disk_bytes(path: Path) -> int:
    """The disk a folder's files take: Kafka preallocates each segment's index files (10 MB, sparse), so their
    sizes say little."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) if path.exists() else 0


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


def growth(env: dict, work: Path) -> dict[str, float]:
    """What must stay bounded, now."""
    import psycopg

    from bench.soak.stores import stores_growth

    driver: Driver = env["driver"]
    kafka = env["kafka"]
    with psycopg.connect(env["admin_url"].rsplit("/", 1)[0] + "/meta", autocommit=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        meta_rows = sum(conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables)
    tree = driver.tree()
    jvm = [pid for pid in tree if command(pid) == "java"]
    python = [pid for pid in tree if pid not in jvm]
    return {"driver_rss_bytes": rss_bytes(tree), "driver_jvm_rss_bytes": rss_bytes(jvm),
            "driver_processes": len(tree), "python_processes": len(python),
            "python_pss_bytes": pss_bytes(python),
            "python_largest_rss_bytes": max((rss_bytes([pid]) for pid in python), default=0),
            "s2_server_rss_bytes": rss_bytes([env["s2"].process.pid] if env["s2"].process else []),
            "checkpoint_bytes": folder_bytes(work / "checkpoints"), "s2_data_bytes": folder_bytes(work / "s2"),
            "s2_stored_bytes": s2_stored_bytes(env["s2"]), **warehouse_bytes(work / "warehouse"),
            "kafka_broker_rss_bytes": rss_bytes([kafka.pid] if kafka.pid else []),
            "kafka_data_bytes": disk_bytes(kafka.folder / "data") if kafka.folder else 0, "meta_rows": meta_rows,
            **stores_growth(env.get("stores"))}


def s2_stored_bytes(s2: Any) -> int:
    """The stream's `storage` metric (S2's stream_metrics): the metered bytes it holds now. Its folder on disk
    (s2_data_bytes) also counts SQLite's write-ahead log and pages freed by trimming, which it reuses."""
    import asyncio

    import s2_sdk

    async def ask() -> int:
        async with s2_sdk.S2(s2.access_token, endpoints=s2.endpoints) as client:
            metrics = await client.stream_metrics("sluice-soak", "bank", set=s2_sdk.StreamMetricSet.STORAGE)
            points = [point for gauge in metrics for point in getattr(gauge, "values", [])]
            return int(max(points)[1]) if points else 0  # the newest point

    return asyncio.run(ask())
