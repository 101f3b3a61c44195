"""The soak's bank (bench/soak/): its record of the run, the writers' transfers and the latency marker."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

TOTAL_PER_ACCOUNT = 1_000
# Faults that strike the Kafka branch only: their recovery is measured on its copy (`balances_kafka`), not on the
# PostgreSQL copy, which their hop does not feed.
KAFKA_BRANCH_FAULTS = ("kafka-broker",)
# The design-store branch's faults (bench/soak/stores.py, with --stores), by the copy their recovery is measured on.
STORE_BRANCH_FAULTS = {"cassandra": ("cassandra-node",), "opensearch": ("search-node",),
                       "hbase": ("hbase-gateway", "hbase-server")}
# Faults measured on a branch's own copy, not on the PostgreSQL copy.
BRANCH_FAULTS = (*KAFKA_BRANCH_FAULTS, *(kind for kinds in STORE_BRANCH_FAULTS.values() for kind in kinds))


@dataclass
class Fault:
    kind: str
    at: float  # monotonic, when it struck
    done: float = 0.0  # when its action ended (a restart finished, a stall lifted)
    recovered: float | None = None  # when a change committed after `done` reached the PostgreSQL copy (a fault of
    # KAFKA_BRANCH_FAULTS: the Kafka branch's table; of STORE_BRANCH_FAULTS: that store's copy)
    note: str = ""


@dataclass
class Run:
    accounts: int
    total: int
    started: float = field(default_factory=time.monotonic)
    transfers: int = 0
    faults: list[Fault] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    barriers_checked: dict[str, int] = field(default_factory=dict)  # table -> barriers read
    copy_reads: int = 0
    marker_commits: dict[int, float] = field(default_factory=dict)  # marker v -> commit time
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (commit time, seconds to the copy)
    # (account, v) -> its balance, for every transfer whose commit the writer saw succeed (and the marker's v)
    history: dict[tuple[int, int], int] = field(default_factory=dict)
    store_reads: dict[str, dict[str, int]] = field(default_factory=dict)  # copy -> sampled reads, totals off, ...
    store_latencies: dict[str, list[float]] = field(default_factory=dict)  # copy -> marker commit to its arrival (s)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def violate(self, what: str) -> None:
        with self.lock:
            if len(self.violations) < 50:
                self.violations.append(f"{time.monotonic() - self.started:7.1f} s: {what}")
        print(f"VIOLATION: {what}", flush=True)


def recovered(run: Run, committed: float, now: float, measured_here) -> None:
    """A change committed at `committed` arrived `now`: the faults over before it (of the kinds `measured_here`)
    have recovered. Called with run.lock held."""
    for fault in run.faults:
        if fault.recovered is None and fault.done and committed > fault.done and measured_here(fault.kind):
            fault.recovered = now


# ------------------------------------------------------------------------------------------------ the bank
def connect(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=False, connect_timeout=5)


def read_rows(conn: Any, url: str, sql: str, params: tuple = ()) -> tuple[Any, list | None]:
    """One read of a watcher that keeps its connection across reads: (the connection, the rows), or (None, None)
    when the read failed (a fault has PostgreSQL or the path to it down), the connection dropped: read again later."""
    try:
        if conn is None:
            conn = connect(url)
        rows = conn.execute(sql, params).fetchall()
        conn.rollback()
        return conn, rows
    except Exception:
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        return None, None


def transfers(url: str, run: Run, accounts: int, rate: float, seed: int, stop: threading.Event) -> None:
    """Transfers at `rate` a second until `stop`; reconnects after any error (the commit's outcome then unknown:
    the invariant and the v numbering do not depend on knowing it)."""
    rnd = random.Random(seed)
    conn = None
    pause = 1.0 / rate
    while not stop.is_set():
        try:
            if conn is None:
                conn = connect(url)
            a, b = sorted(rnd.sample(range(accounts), 2))  # rows locked in id order: no deadlocks
            amount = rnd.randint(1, 50)
            states = [conn.execute(f"UPDATE accounts SET balance = balance {sign} %s, v = v + 1 WHERE id = %s "
                                   "RETURNING balance, v", (amount, account)).fetchone()
                      for sign, account in (("-", a), ("+", b))]
            conn.commit()
            with run.lock:
                run.transfers += 1
                for account, (balance, v) in zip((a, b), states, strict=True):
                    run.history[(account, v)] = balance
            stop.wait(pause)
        except Exception:
            with contextlib.suppress(Exception):
                conn.close()
            conn = None
            stop.wait(0.2)
    if conn is not None:
        conn.close()


def marker(url: str, run: Run, marker_id: int, stop: threading.Event) -> None:
    """A balance-neutral change of the marker account every 250 ms, its commit time kept by v."""
    conn = None
    while not stop.wait(0.25):
        try:
            if conn is None:
                conn = connect(url)
            v = conn.execute("UPDATE accounts SET v = v + 1 WHERE id = %s RETURNING v", (marker_id,)).fetchone()[0]
            conn.commit()
            with run.lock:
                run.marker_commits[v] = time.monotonic()
                run.history[(marker_id, v)] = 0
        except Exception:
            with contextlib.suppress(Exception):
                conn.close()
            conn = None
    if conn is not None:
        conn.close()
