"""The MetaService's PostgreSQL connections, kept for the life of the process.

The table store calls the MetaService three or more times per table commit, each call a transaction; opening a
connection for each (a server process and SCRAM authentication) cost 150-300 ms under load, most of a commit. So a
process keeps its connections to each MetaService database: a transaction takes an idle one (or opens one when none
is idle) and gives it back when it ends cleanly. A process making its calls one at a time holds one connection per
database; one that ran calls from several threads at once keeps as many as were in progress at once. A connection
idle for IDLE_CLOSE_S is closed (the next call opens one again), and every one at process exit or at
`MetaService.close()`: a long-lived driver or a Python worker Spark reuses would otherwise hold a server slot for
as long as it lives, used or not. One closer thread per process does it, and only while it keeps an idle connection.
A forked child starts with none of its own (the parent's sockets are not its to use; psycopg leaves a connection
made in another process open when it is collected).

A kept connection is not checked by an extra round trip before use: the transaction's first statement is the check.
Its BEGIN must be answered within the connection's connect_timeout (`begin`), as connecting had to be: a network
that went silent while the connection sat idle fails the call then, instead of holding it until the network answers
again (a proxy or a hung peer acknowledges every byte, so TCP's own timeouts never fire).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import selectors
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

# How long a kept connection may sit idle before it is closed. A constant, not an option: a MetaService is named by
# its URL alone (the table store makes one per step, in executors too), and libpq refuses parameters it does not
# know in a URL. 60 s keeps the connection across the micro-batches of a streaming query triggered at up to a minute
# (3 transactions per commit), and a process that calls less often reconnects at most once a minute (150-300 ms
# under load: 0.5% of that minute) instead of holding a server slot until it exits. An operator who wants it shorter
# sets PostgreSQL's idle_session_timeout on the database: a kept connection the server ended is replaced once.
IDLE_CLOSE_S = 60.0


class KeptConnections:
    """Idle connections of this process, by database URL; each closed after `idle_close_s` idle (None: kept until
    closed). `clock` is time.monotonic unless a test sets one (then `wake()` makes the closer look again)."""

    def __init__(self, idle_close_s: float | None = IDLE_CLOSE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_close_s = idle_close_s
        self.clock = clock
        self._start_empty()
        os.register_at_fork(after_in_child=self._start_empty)

    def _start_empty(self) -> None:
        self._idle: dict[str, list[tuple[float, Any]]] = {}  # (idle since, connection), the newest last
        self._lock = threading.Condition()  # a fresh one: the parent may have held its lock when it forked
        self._closer: threading.Thread | None = None

    def take(self, url: str) -> Any | None:
        """An idle connection to `url`, or None when there is none (the caller opens one)."""
        with self._lock:
            idle = self._idle.get(url)
            if not idle:
                return None
            conn = idle.pop()[1]  # the most recently used: the others expire first
            if not idle:
                del self._idle[url]
            return conn

    def give_back(self, url: str, conn: Any) -> None:
        """Keep `conn` for the next transaction when it is usable and outside a transaction; close it otherwise."""
        if conn.closed or conn.broken or conn.info.transaction_status != pq.TransactionStatus.IDLE:
            conn.close()
            return
        with self._lock:
            self._idle.setdefault(url, []).append((self.clock(), conn))
            if self.idle_close_s is not None and self._closer is None:
                self._closer = threading.Thread(target=self._close_when_idle, name="sluice-meta-idle-closer",
                                                daemon=True)
                self._closer.start()

    def close(self, url: str | None = None) -> None:
        """Close the idle connections to `url` (None: to every database). One in use by another thread stays in
        use, and is kept when it is given back."""
        with self._lock:
            urls = list(self._idle) if url is None else [url]
            closing = [conn for u in urls for _, conn in self._idle.pop(u, [])]
            self._lock.notify_all()  # the closer ends when nothing is left idle
        for conn in closing:
            conn.close()

    def idle(self, url: str) -> int:
        with self._lock:
            return len(self._idle.get(url, []))

    def wake(self) -> None:
        """Make the closer look at the clock now (a test that moved `clock`)."""
        with self._lock:
            self._lock.notify_all()

    def _close_when_idle(self) -> None:
        """The closer: sleeps until the oldest idle connection's bound, closes what passed it; ends when nothing is
        idle (give_back starts it again), so a process that keeps nothing runs no thread for it."""
        while True:
            with self._lock:
                while True:
                    bound = self.idle_close_s
                    sinces = [since for idle in self._idle.values() for since, _ in idle]
                    if bound is None or not sinces:
                        self._closer = None
                        return
                    now = self.clock()
                    closing = [conn for idle in self._idle.values() for since, conn in idle if now - since >= bound]
                    if closing:
                        for url, idle in list(self._idle.items()):
                            kept = [(since, conn) for since, conn in idle if now - since < bound]
                            if kept:
                                self._idle[url] = kept
                            else:
                                del self._idle[url]
                        break
                    self._lock.wait(min(sinces) + bound - now)
            for conn in closing:  # outside the lock: a close sends to the server
                with contextlib.suppress(Exception):  # best effort, as at exit: the closer goes on with the rest
                    conn.close()


class NoAnswer(psycopg.OperationalError):
    """The database did not answer a transaction's BEGIN in time."""


def begin(conn: Any, sql: str, answer_within: float) -> None:
    """Run `sql` (BEGIN, then the transaction's advisory locks) on `conn` (autocommit: no BEGIN of psycopg's own).
    The first answer must come within `answer_within` seconds (NoAnswer, "... timeout", otherwise);
    the locks after it may be waited for as long as another transaction holds them."""
    pgconn = conn.pgconn
    pgconn.send_query(sql.encode())
    deadline: float | None = time.monotonic() + answer_within
    with selectors.DefaultSelector() as selector:
        key = selector.register(pgconn.socket, selectors.EVENT_WRITE)
        while pgconn.flush():  # non-blocking: 1 while part of the query is still to be sent
            _wait(selector, deadline, answer_within)
        selector.modify(key.fileobj, selectors.EVENT_READ)
        error: psycopg.Error | None = None
        while True:
            while pgconn.is_busy():
                _wait(selector, deadline, answer_within)
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                break
            deadline = None  # answered: the server is there
            if error is None and result.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
                error = psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    if error is not None:
        raise error


def _wait(selector: selectors.BaseSelector, deadline: float | None, answer_within: float) -> None:
    ready = selector.select(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if not ready and deadline is not None and time.monotonic() >= deadline:
        raise NoAnswer(f"the MetaService's database did not answer within {answer_within:g} s "
                                           "(timeout; connect_timeout in its URL sets it)")


KEPT = KeptConnections()
atexit.register(KEPT.close)
