"""The engine's side of errors.tolerance: records a store refuses are found (a batch split until the record is alone,
or the entries a per-item response names) and handed to the dead-letter route, within errors.max-records. Each test
has its negative control: with errors.tolerance=none the same store fails the write."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import replace

import pytest

from sluice import RecordError, RefusedRecords, SinkError
from sluice.connector import RetryableError, RetryEntries
from sluice.engine import AsyncSinkWriter, Batch, SinkConfig, Store, completed_future
from sluice.engine._refusals import ErrorPolicy

TOLERANT = ErrorPolicy(tolerance="all")


class CheckingStore(Store):
    """Refuses a whole batch that holds a negative entry (as a COPY violating a CHECK does), and records what it
    stored, in order."""

    name = "checking"

    def __init__(self) -> None:
        self.stored: list[int] = []
        self.requests = 0
        self.lock = threading.Lock()

    def submit(self, batch: Batch) -> Future[None]:
        with self.lock:
            self.requests += 1
            bad = [e for e in batch.entries if e < 0]
            if bad:
                return completed_future(RecordError(f"new row violates check constraint (value {bad[0]})"))
            self.stored.extend(batch.entries)
        return completed_future()


class ItemStore(Store):
    """Answers per entry, as a bulk response does: negative entries refused, the rest stored; entries divisible by
    7 fail once for a passing reason."""

    name = "items"

    def __init__(self) -> None:
        self.stored: list[int] = []
        self.failed_once: set[int] = set()

    def submit(self, batch: Batch) -> Future[None]:
        refused = [i for i, e in enumerate(batch.entries) if e < 0]
        passing = [i for i, e in enumerate(batch.entries) if e >= 0 and e % 7 == 0 and e not in self.failed_once]
        self.failed_once.update(batch.entries[i] for i in passing)
        self.stored.extend(e for i, e in enumerate(batch.entries) if i not in refused and i not in passing)
        if not refused and not passing:
            return completed_future()
        retry = RetryEntries("busy", passing, RetryableError("busy")) if passing else None
        if not refused:
            return completed_future(retry)
        return completed_future(RefusedRecords("refused", refused,
                                               [RecordError(f"bad value {batch.entries[i]}") for i in refused], retry))


def run(store: Store, entries: list[int], errors: ErrorPolicy, **config) -> tuple[AsyncSinkWriter, list]:
    refused: list[tuple[object, str]] = []

    def route(items, reasons):
        refused.extend(zip(items, [str(r) for r in reasons], strict=True))

    cfg = replace(SinkConfig(retry_delay_ms=1, flush_buffer_timeout=60_000, **config), errors=errors)
    with AsyncSinkWriter(store, cfg, on_refused=route) as writer:
        writer.write_chunk(entries, [1] * len(entries))
        writer.flush()
    return writer, refused


ENTRIES = [i if i not in (37, 512, 513, 998) else -i for i in range(1000)]


@pytest.mark.parametrize("mode", ["unordered", "global-ordered"])
def test_a_batch_refused_for_its_records_is_split_until_each_is_alone(mode):
    store = CheckingStore()
    writer, refused = run(store, ENTRIES, TOLERANT, batch_max_size=250, requests_max_buffered=2000, mode=mode)
    assert sorted(e for e, _ in refused) == [-998, -513, -512, -37]
    assert all("check constraint" in reason for _, reason in refused)
    good = [e for e in ENTRIES if e >= 0]
    # Every good record stored once; global order keeps the input's order through the splits.
    assert sorted(store.stored) == good
    if mode == "global-ordered":
        assert store.stored == good
    assert writer.stats.records == len(good) and writer.stats.dead_letters == 4
    assert store.requests < 4 + 4 * 2 * 8  # a binary search per refused record, not a request per record


def test_without_tolerance_the_same_refusal_fails_the_write():
    with pytest.raises(SinkError, match=r"errors.tolerance=all"):
        run(CheckingStore(), ENTRIES, ErrorPolicy(), batch_max_size=250, requests_max_buffered=2000)


def test_entries_a_per_item_response_refused_go_aside_and_passing_failures_retry():
    store = ItemStore()
    writer, refused = run(store, ENTRIES, TOLERANT, batch_max_size=100, requests_max_buffered=2000)
    assert sorted(e for e, _ in refused) == [-998, -513, -512, -37]
    assert sorted(store.stored) == [e for e in ENTRIES if e >= 0]  # the retried ones too, once
    assert writer.stats.records == 996 and writer.stats.dead_letters == 4


def test_without_tolerance_a_per_item_refusal_fails_the_write():
    with pytest.raises(SinkError, match=r"bad value -37.*errors.tolerance=all"):
        run(ItemStore(), ENTRIES, ErrorPolicy(), batch_max_size=100, requests_max_buffered=2000)


def test_more_refusals_than_errors_max_records_fail_the_task():
    with pytest.raises(SinkError, match=r"errors.max-records=3"):
        run(CheckingStore(), ENTRIES, ErrorPolicy(tolerance="all", max_records=3), batch_max_size=250,
            requests_max_buffered=2000)
    _, refused = run(CheckingStore(), ENTRIES, ErrorPolicy(tolerance="all", max_records=4), batch_max_size=250,
                     requests_max_buffered=2000)
    assert len(refused) == 4  # at the bound, not past it: the write goes on


def test_a_failing_dead_letter_route_fails_the_write():
    def broken(items, reasons):
        raise OSError("dead-letter topic unreachable")

    cfg = replace(SinkConfig(retry_delay_ms=1, flush_buffer_timeout=60_000, batch_max_size=250), errors=TOLERANT)
    with pytest.raises(SinkError, match="dead-letter topic unreachable"), \
            AsyncSinkWriter(CheckingStore(), cfg, on_refused=broken) as writer:
        writer.write_chunk(ENTRIES, [1] * len(ENTRIES))
        writer.flush()
