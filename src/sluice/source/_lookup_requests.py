"""Lookup requests in flight together: the options every store's lookup shares for it, and the worker process's
thread pools that send a batch's requests concurrently (docs/lookup.md).

A `LookupReader` whose store answers many keys per request (PostgreSQL's `= ANY`, ClickHouse's `IN`, `_mget`,
`getMultiple`) splits an Arrow batch's distinct keys into requests of at most `lookup.max-keys-per-request` keys and
hands them to `run_requests`, which sends up to `lookup.max-concurrent-requests` of them at once from a thread pool
of the worker process. The pool belongs to the store client (`client`: a hashable that names it, e.g. the server
address): one per worker process, reused by every task and micro-batch the process serves, never one per batch.
Results come back in the requests' order whatever order they complete in, so a batch's rows do not depend on it. A
request that fails (after the store's own retries) fails the batch: the requests not started are cancelled, and the
error is raised, never an empty answer for its keys. Threads end with the process (`shutdown`, atexit), and a forked
child starts without its parent's pools.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from sluice._options import Option

T = TypeVar("T")
R = TypeVar("R")

# Why 1,000 keys a request (the default of lookup.max-keys-per-request): such a statement costs the server a few
# milliseconds of index probes, so a request's fixed cost (a round trip, a prepared statement's bind, an HTTP
# exchange) is a small share of it; and Spark's Arrow batch of 10,000 rows (spark.sql.execution.arrow.
# maxRecordsPerBatch's default) still makes 10 requests, enough to keep 4 in flight busy. bench/lookup.py measures it.
DEFAULT_KEYS_PER_REQUEST = 1_000
DEFAULT_CONCURRENT_REQUESTS = 4


def lookup_max_concurrent_requests(what: str, default: int = DEFAULT_CONCURRENT_REQUESTS) -> Option:
    """`lookup.max-concurrent-requests`, one name for every store: how many of a batch's requests a task has in
    flight at once; `what` says what one request is and what carries it (a store's own words)."""
    return Option("lookup.max-concurrent-requests", "int", default, f"{what} in flight at once per task; 1 sends "
                  "them one after the other.", minimum=1, maximum=10_000)


def lookup_max_keys_per_request(what: str, default: int = DEFAULT_KEYS_PER_REQUEST) -> Option:
    """`lookup.max-keys-per-request`: the most distinct keys one request of a batch carries; a batch with more is
    split into several requests (sent lookup.max-concurrent-requests at a time)."""
    return Option("lookup.max-keys-per-request", "int", default, f"Distinct keys of an Arrow batch in one {what}; a "
                  "batch with more is split into several, sent up to lookup.max-concurrent-requests at once.",
                  minimum=1, maximum=1_000_000)


def slices(count: int, size: int) -> list[tuple[int, int]]:
    """(offset, length) of consecutive requests of at most `size` of `count` keys (none for no keys)."""
    return [(start, min(size, count - start)) for start in range(0, count, size)]


@dataclass
class RequestCounter:
    """Requests open at once (sent, not yet answered) in this process, and the most seen: what a test observes."""

    open: int = 0
    peak: int = 0
    sent: int = 0


_LOCK = threading.Lock()
_POOLS: dict[tuple[Hashable, int], ThreadPoolExecutor] = {}
_COUNTER = RequestCounter()
_GATE: int | None = None  # observe_requests(parties): requests held until that many have been open at once
_GATE_REACHED = threading.Event()


def _pool(client: Hashable, concurrency: int) -> ThreadPoolExecutor:
    key = (client, concurrency)
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="sluice-lookup")
        return pool


def _counted(request: Callable[[T], R], item: T) -> R:
    with _LOCK:
        _COUNTER.open += 1
        _COUNTER.sent += 1
        _COUNTER.peak = max(_COUNTER.peak, _COUNTER.open)
        gate = _GATE
        if gate is not None and _COUNTER.open >= gate:
            _GATE_REACHED.set()
    try:
        if gate is not None and not _GATE_REACHED.wait(60):
            raise TimeoutError(f"observe_requests({gate}): fewer than {gate} lookup requests were ever open at once "
                               f"in 60 s (the most: {_COUNTER.peak})")
        return request(item)
    finally:
        with _LOCK:
            _COUNTER.open -= 1


def run_requests(client: Hashable, concurrency: int, request: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`request(item)` for each item, up to `concurrency` at once on `client`'s pool in this process; the results in
    `items`' order. The first failure cancels the requests not started and is raised once the running ones end."""
    if len(items) <= 1 or concurrency <= 1:
        return [_counted(request, item) for item in items]
    pool = _pool(client, concurrency)
    futures: list[Future[R]] = [pool.submit(_counted, request, item) for item in items]
    done, pending = wait(futures, return_when=FIRST_EXCEPTION)
    failed = next((f for f in futures if f in done and f.exception() is not None), None)
    if failed is not None:
        for future in pending:
            future.cancel()
        wait(pending)  # no request of this batch still runs once it has failed
        raise failed.exception()  # type: ignore[misc]
    return [future.result() for future in futures]


@contextmanager
def observe_requests(parties: int | None = None) -> Iterator[RequestCounter]:
    """Count the lookup requests open at once in this process from now on (`peak`); with `parties`, hold every
    request until that many have been open at once, so a test sees them in flight together by an event, not by
    timing (a request held 60 s without it fails, naming the most seen)."""
    global _GATE
    with _LOCK:
        _COUNTER.open = _COUNTER.peak = _COUNTER.sent = 0
        _GATE = parties
        _GATE_REACHED.clear()
    try:
        yield _COUNTER
    finally:
        with _LOCK:
            _GATE = None


def shutdown() -> None:
    """End every pool's threads (after their running requests): at the process's exit."""
    with _LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


def _forget_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()
    _POOLS.clear()  # their threads are the parent's: a forked child has none of them


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
