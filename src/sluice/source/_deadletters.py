"""A read task's dead letters (errors.tolerance=all): records a source cannot decode or type go to the read's
dead-letter target (sluice/sink/_deadletters.py) with their reason, and the task leaves them out of what it yields.

The driver plans the target once (`SourceDataSource.dead_letters`) and the route travels to the executors inside the
reader. `read_with_letters` runs one read task between opening the task's `DeadLetterWriter` and committing it: no
driver commit follows a read task, so the task commits its own dead letters when its split is read (or when Spark
stops reading it early, as a batch read's limit does; what was left out so far is then in the target). A failed
task commits nothing; Spark runs it again and it sends the same records aside again. A replayed micro-batch too,
unless the target's commit is idempotent per (query id, micro-batch): at least once. The bounds hold per read task:
errors.max-records as records go aside, errors.max-ratio over the task's whole read (there is no driver commit of a
read to check them at over a micro-batch).

`conform_or_aside` is the SDK's `conform` for readers whose values a store hands over as text or wider types: a row
with a value that does not convert goes aside instead of failing its whole batch. `build_or_aside` is the same for
readers that build their batch from the store's records themselves (documents, rows of cells): a record holding a
value the read cannot type goes aside, as it came.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice._errors import SluiceError
from sluice.sink._arrow_writers import task_context
from sluice.sink._deadletters import DeadLetterRoute, DeadLetterWriter
from sluice.sink._encoding import conform

T = TypeVar("T")
R = TypeVar("R")


class ReadBoundError(SluiceError):
    """A read task sent more records aside than errors.max-records or errors.max-ratio allow."""


def read_with_letters(route: DeadLetterRoute | None, read_id: str, streaming: bool, target: str,
                      read: Callable[[DeadLetterWriter | None], Iterator[T]]) -> Iterator[T]:
    """`read(letters)`'s items, `letters` the task's dead-letter writer for records of `target` (None without a
    route: the reader fails on a record it cannot decode, as with errors.tolerance=none). The writer is named after
    the streaming query and micro-batch (`read_id` for a batch read) and the task's partition, as a write's task is;
    what the reader adds is written as the read goes and committed when it ends."""
    if route is None:
        yield from read(None)
        return
    letters = route.open(task_context(read_id, streaming), target)
    seen = 0  # records the task read: those it yielded and those it sent aside
    try:
        try:
            for item in read(letters):
                yield item
                letters.drain()
                batch = item[-1] if isinstance(item, tuple) else item  # or a (split id, batch) of read_many
                seen += getattr(batch, "num_rows", 1)
                _check(route, letters, seen, ratio=False)  # a count bound is known to be broken at once
        except GeneratorExit:  # Spark read no further (a limit): what was left out so far goes aside all the same
            _commit(route, letters)
            raise
        letters.drain()
        _check(route, letters, seen, ratio=True)  # a ratio only over the task's whole read
        _commit(route, letters)
    finally:
        letters.close()


def _check(route: DeadLetterRoute, letters: DeadLetterWriter, yielded: int, *, ratio: bool) -> None:
    """A read task's bounds (errors.max-records; with `ratio`, errors.max-ratio too), over what it read: past one, it
    fails and commits nothing it sent aside."""
    bounds = route.read_bounds
    if bounds is None or not letters.count:
        return
    if not ratio:
        bounds = replace(bounds, max_ratio=None)
    broken = bounds.over_bound(letters.count, yielded + letters.count)
    if broken is not None:
        raise ReadBoundError(f"a read task of {route.connector} (partition {letters.context.partition_id}): {broken} "
                             "Bounds are checked per read task.")


def _commit(route: DeadLetterRoute, letters: DeadLetterWriter) -> None:
    letters.commit()
    # No driver commit follows a read task: the task notes its dead letters for sluice doctor (errors.meta).
    route.record(letters.count, letters.context.write_id)


class ValueTypeError(SluiceError):
    """A value a read cannot convert to its column's Spark type (a record it cannot type)."""


# What a reader's error says when a record it cannot type fails the read (errors.tolerance=none).
SEND_ASIDE = ("To send such records to a dead-letter target and read on, set errors.tolerance=all with "
              "errors.deadletter.format and its options (docs/reliability.md).")


def conform_or_aside(batch: pa.RecordBatch, schema: pa.Schema, letters: DeadLetterWriter | None,
                     where: str, *, key: Sequence[str] = ()) -> pa.RecordBatch:
    """`conform(batch, schema)`; with `letters`, rows holding a value that does not convert to its column's type
    go to the dead letters instead (each row as it came, its error naming `where`, the row's `key` columns that
    the batch holds, the column and the value) and the others are returned. A column whose type cannot convert at
    all still fails the read: no record is at fault."""
    try:
        return conform(batch, schema)
    except pa.ArrowInvalid:
        if letters is None:
            raise
    bad: dict[int, ValueTypeError] = {}
    for field in schema:  # rare: the values at fault found one by one
        column = batch.column(field.name)
        if isinstance(column.type, pa.ExtensionType):
            column = column.storage
        if column.type == field.type:
            continue
        for row in range(len(column)):
            try:
                pc.cast(column.slice(row, 1), field.type)
            except pa.ArrowInvalid as e:
                if row not in bad:
                    value = column[row].as_py()
                    named = [f"{k}={batch.column(k)[row].as_py()!r}" for k in key if k in batch.schema.names]
                    at = f"{where}, key ({', '.join(named)})" if named else where
                    bad[row] = ValueTypeError(f"{at}: the value {value!r} of column '{field.name}' does not "
                                              f"convert to {field.type}: {e}")
    rows = sorted(bad)
    if not rows:
        return conform(batch, schema)  # raises what it raised: no one row is at fault
    letters.add(pa.Table.from_batches([batch.take(pa.array(rows, pa.int64()))]), [bad[row] for row in rows])
    keep = pa.array(np.isin(np.arange(batch.num_rows), rows, invert=True))
    return conform(batch.filter(keep), schema)


# What building a batch raises on a value the read cannot type (OptionError is a ValueError).
UNTYPED = (ValueError, TypeError, ArithmeticError, pa.ArrowException, ValueTypeError)


def build_or_aside(records: Sequence[R], build: Callable[[Sequence[R]], pa.RecordBatch],
                   letters: DeadLetterWriter | None, described: Callable[[R], str],
                   letter: Callable[[R], Mapping[str, object]]) -> pa.RecordBatch:
    """`build(records)`: the batch a reader makes of records as its store handed them over, in one call. When it
    fails on a value the read cannot type (`UNTYPED`), the records are built one by one to find those at fault;
    `build`'s error should name the column and the value. With `letters` they go aside (`letter(record)`: the
    record as it came; the error: `described(record)`, e.g. its table and key, and what building it raised) and the
    batch of the others is returned (empty when none is left). Without, the read fails with a ValueTypeError naming
    the first and saying how to send such records aside. When no one record fails alone, `build`'s error is raised."""
    try:
        return build(records)
    except UNTYPED as e:
        failed = e
    kept: list[R] = []
    bad: list[R] = []
    errors: list[BaseException] = []
    for record in records:  # rare: the records at fault found one by one
        try:
            build([record])
        except UNTYPED as e:
            error = ValueTypeError(f"{described(record)}: {e}")
            if letters is None:
                raise ValueTypeError(f"{error}. {SEND_ASIDE}") from None
            bad.append(record)
            errors.append(error)
        else:
            kept.append(record)
    if not bad:
        raise failed
    assert letters is not None
    letters.add([letter(record) for record in bad], errors)
    return build(kept)
