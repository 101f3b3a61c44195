"""The MetaService's PostgreSQL connections, kept for the life of the process.

The table store calls the MetaService three or more times per table commit, each call a transaction; opening a
connection for each (a server process and SCRAM authentication) cost 150-300 ms under load, most of a commit. So a
process keeps its connections to each MetaService database: a transaction takes an idle one (or opens one when none
is idle) and gives it back when it ends cleanly. A process making its calls one at a time holds one connection per
database; one that ran calls from several threads at once keeps as many as were in progress at once. They close at
process exit or at `MetaService.close()`. A forked child starts with none of its own (the parent's sockets are not
its to use; psycopg leaves a connection made in another process open when it is collected).

A kept connection is not checked by an extra round trip before use: the transaction's first statement is the check.
Its BEGIN must be answered within the connection's connect_timeout (`begin`), as connecting had to be: a network
that went silent while the connection sat idle fails the call then, instead of holding it until the network answers
again (a proxy or a hung peer acknowledges every byte, so TCP's own timeouts never fire).
"""

from __future__ import annotations

import atexit
import os
import selectors
import threading
import time
from typing import Any

import psycopg
from psycopg import pq


class KeptConnections:
    """Idle connections of this process, by database URL."""

    def __init__(self) -> None:
        self._start_empty()
        os.register_at_fork(after_in_child=self._start_empty)

    def _start_empty(self) -> None:
        self._idle: dict[str, list[Any]] = {}
        self._lock = threading.Lock()  # a fresh one: the parent may have held its lock when it forked

    def take(self, url: str) -> Any | None:
        """An idle connection to `url`, or None when there is none (the caller opens one)."""
        with self._lock:
            idle = self._idle.get(url)
            return idle.pop() if idle else None

    def give_back(self, url: str, conn: Any) -> None:
        """Keep `conn` for the next transaction when it is usable and outside a transaction; close it otherwise."""
        if conn.closed or conn.broken or conn.info.transaction_status != pq.TransactionStatus.IDLE:
            conn.close()
            return
        with self._lock:
            self._idle.setdefault(url, []).append(conn)

    def close(self, url: str | None = None) -> None:
        """Close the idle connections to `url` (None: to every database). One in use by another thread stays in
        use, and is kept when it is given back."""
        with self._lock:
            urls = list(self._idle) if url is None else [url]
            closing = [conn for u in urls for conn in self._idle.pop(u, [])]
        for conn in closing:
            conn.close()

    def idle(self, url: str) -> int:
        with self._lock:
            return len(self._idle.get(url, []))


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
