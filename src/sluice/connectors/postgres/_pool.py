"""Connections kept open between the micro-batches of a streaming query, in each Python process that serves them.

Spark runs a micro-batch's planning, its tasks and its commit in Python worker processes it reuses
(`spark.python.worker.reuse`, on by default), every trigger again. Connecting costs about 40 ms with ADBC (the
driver loads the server's type catalog) and 5 ms with psycopg, while a micro-batch of a change stream peeks and
writes in a few milliseconds: connecting anew in each was most of what sluice added to a micro-batch's cycle
(docs/postgres.md, freshness). Batch writes and reads do not pool: their connections end with their tasks, which
keeps the connection bound of docs/deploy.md.

A connection is lent out whole (one user at a time), checked with a round trip before it is lent again (a server
restart between two micro-batches must not fail a task), and given back only by a user that finished cleanly; an
error closes it. Idle ones are closed after IDLE_CLOSE_S, so a worker that stopped serving a query stops holding its
server connections. Connections are keyed by driver, address, autocommit and session settings: a connection set up
for logical decoding is never lent to a writer. Per process: nothing is shared between executors, and a forked
child starts with an empty pool.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

IDLE_CLOSE_S = 10.0  # an idle connection older than this is closed: a query that stopped, or a slow trigger
IDLE_PER_KEY = 2  # idle connections kept per key and process (connections-per-task's default); more are closed


@dataclass(frozen=True)
class PoolKey:
    """What makes two connections interchangeable. repr leaves out the URI: it carries the password."""

    driver: str  # "adbc" or "psycopg"
    uri: str = field(repr=False)
    autocommit: bool
    session: tuple[str, ...] = ()  # statements run once on a new connection (SET ...)


@dataclass
class _Idle:
    conn: Any
    since: float


@dataclass
class Lease:
    """A connection lent for a while: `release` gives it back to the pool it came from when pooled and its user
    finished cleanly, and closes it otherwise."""

    pool: ConnectionPool
    key: PoolKey
    conn: Any
    pooled: bool

    def release(self, clean: bool) -> None:
        if clean and self.pooled:
            self.pool.give_back(self.key, self.conn)
        else:
            _close(self.conn)


def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn.close()


def _idle_outside_transaction(conn: Any) -> bool:
    from psycopg.pq import TransactionStatus

    return not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE


def _alive(key: PoolKey, conn: Any) -> bool:
    """One round trip: whether the connection still reaches its server, outside any transaction."""
    try:
        if key.driver == "psycopg":
            if not _idle_outside_transaction(conn):
                return False
            conn.execute("SELECT 1").fetchall()
            if not key.autocommit:
                conn.rollback()
        else:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
                cur.fetchall()
            if not key.autocommit:
                conn.rollback()
        return True
    except Exception:
        return False


class ConnectionPool:
    """Idle connections of this process, by PoolKey; see the module's docstring."""

    def __init__(self, idle_close_s: float = IDLE_CLOSE_S, idle_per_key: int = IDLE_PER_KEY) -> None:
        self.idle_close_s = idle_close_s
        self.idle_per_key = idle_per_key
        self._start_empty()
        # A forked child (os.fork, multiprocessing) starts empty, with a lock of its own: the parent's sockets are
        # not its to use, and the parent may have held the lock when it forked.
        os.register_at_fork(after_in_child=self._start_empty)

    def _start_empty(self) -> None:
        self._idle: dict[PoolKey, list[_Idle]] = {}
        self._lock = threading.Lock()
        self._timer = threading.Condition(self._lock)  # the reaper's timed wait (never notified)
        self._reaper: threading.Thread | None = None

    def take(self, key: PoolKey, connect: Callable[[], Any]) -> Any:
        """An idle connection for `key` that answered a round trip, else a new one (open())."""
        while (idle := self._pop(key)) is not None:
            if _alive(key, idle):
                return idle
            _close(idle)
        return self.open(key, connect)

    @staticmethod
    def open(key: PoolKey, connect: Callable[[], Any]) -> Any:
        """A new connection from `connect()`, with the key's session statements run."""
        conn = connect()
        try:
            for statement in key.session:
                if key.driver == "psycopg":
                    conn.execute(statement)
                else:
                    with conn.cursor() as cur:
                        cur.execute(statement)
        except BaseException:
            _close(conn)
            raise
        return conn

    def give_back(self, key: PoolKey, conn: Any) -> None:
        """Keep a connection its user finished with cleanly (a failed user closes it instead: Lease.release)."""
        if key.driver == "psycopg" and not _idle_outside_transaction(conn):
            _close(conn)  # never keep a transaction (and its locks) open while idle
            return
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) >= self.idle_per_key:
                extra = conn
            else:
                idle.append(_Idle(conn, time.monotonic()))
                extra = None
                self._start_reaper()
        if extra is not None:
            _close(extra)

    def lease(self, key: PoolKey, connect: Callable[[], Any], pooled: bool) -> Lease:
        """A connection for `key`: from the pool when `pooled`, else a new one that its release closes."""
        return Lease(self, key, self.take(key, connect) if pooled else self.open(key, connect), pooled)

    @contextlib.contextmanager
    def connection(self, key: PoolKey, connect: Callable[[], Any], pooled: bool) -> Iterator[Any]:
        """A connection for the block, released as clean when the block does not raise."""
        lease = self.lease(key, connect, pooled)
        try:
            yield lease.conn
        except BaseException:
            lease.release(clean=False)
            raise
        lease.release(clean=True)

    def close_idle(self, older_than_s: float = 0.0) -> int:
        """Close the idle connections idle for longer than `older_than_s`; returns how many."""
        now = time.monotonic()
        closing: list[Any] = []
        with self._lock:
            for key, idle in list(self._idle.items()):
                keep = [i for i in idle if now - i.since <= older_than_s]
                closing += [i.conn for i in idle if now - i.since > older_than_s]
                if keep:
                    self._idle[key] = keep
                else:
                    del self._idle[key]
        for conn in closing:
            _close(conn)
        return len(closing)

    def idle_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())

    def _pop(self, key: PoolKey) -> Any | None:
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop().conn if idle else None  # the most recently used: the likeliest still warm

    def _start_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Thread(target=self._reap, name="sluice-pg-pool-reaper", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        while True:
            with self._lock:
                self._timer.wait(self.idle_close_s / 2)
                if not self._idle:
                    self._reaper = None
                    return
            self.close_idle(self.idle_close_s)


POOL = ConnectionPool()
