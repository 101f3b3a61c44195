"""The measures of bench/tracking/, the same for every store: throughput (the batch read and the stream timed
alternately, best of the rounds), and freshness (a writer paced at `rate` rows/s, rate/20 rows every 50 ms, for
`seconds`, while a running query hands each micro-batch to `arrived`, which notes now - at of every row; p50/p99 once
every row written has arrived)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from bench.measures import percentile


def alternating(rounds: int, batch: Callable[[], float], stream: Callable[[], float]
                ) -> tuple[float, float, dict[str, list[float]]]:
    """The best seconds of the batch read and of the stream, timed alternately, and every round's."""
    runs: dict[str, list[float]] = {"batch": [], "stream": []}
    for _ in range(rounds):  # alternating; the first round pays the JVM's and the workers' warm-up
        runs["batch"].append(batch())
        runs["stream"].append(stream())
    return min(runs["batch"]), min(runs["stream"]), runs


def arrivals() -> tuple[list[float], Callable[[Any, int], None]]:
    """The lags (ms) noted so far, and the foreachBatch function that notes them from the rows' `at` column."""
    lags: list[float] = []

    def arrived(frame: Any, _batch_id: int) -> None:
        now = time.time()
        for (at,) in frame.select("at").collect():
            lags.append((now - at.timestamp()) * 1000)

    return lags, arrived


def paced(query: Any, lags: list[float], insert: Callable[[int], None], rate: int, seconds: int, window_ms: int,
          what: str = "rows") -> tuple[float, float, int]:
    """Writes through `insert(n)` at the pace, waits for every row in `lags`, stops the query: (p50, p99, count)."""
    stop = threading.Event()
    per_tick = max(1, rate // 20)
    written = 0

    def write() -> None:
        nonlocal written
        tick = time.monotonic()
        while not stop.is_set():
            insert(per_tick)
            written += per_tick
            tick += 0.05
            time.sleep(max(0.0, tick - time.monotonic()))

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(seconds)  # the measured period: the writer's pace, not a synchronization
    stop.set()
    writer.join()
    deadline = time.monotonic() + 60
    while len(lags) < written and time.monotonic() < deadline:
        query.processAllAvailable()  # returns while the window holds rows back: polled
        time.sleep(0.1)
    query.stop()
    ordered = sorted(lags)
    if len(ordered) != written:
        raise SystemExit(f"window {window_ms} ms: {len(ordered)} {what} arrived of {written} written")
    return percentile(ordered, 0.5), percentile(ordered, 0.99), len(ordered)
