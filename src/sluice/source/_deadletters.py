"""A read task's dead letters (errors.tolerance=all): records a source cannot decode or type go to the read's
dead-letter target (sluice/sink/_deadletters.py) with their reason, and the task leaves them out of what it yields.

The driver plans the target once (`SourceDataSource.dead_letters`) and the route travels to the executors inside the
reader. `read_with_letters` runs one read task between opening the task's `DeadLetterWriter` and committing it: no
driver commit follows a read task, so the task commits its own dead letters when its split is read (or when Spark
stops reading it early, as a batch read's limit does; what was left out so far is then in the target). A failed
task commits nothing; Spark runs it again and it sends the same records aside again. A replayed micro-batch too,
unless the target's commit is idempotent per (query id, micro-batch): at least once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from sluice.sink._arrow_writers import task_context
from sluice.sink._deadletters import DeadLetterRoute, DeadLetterWriter

T = TypeVar("T")


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
    try:
        try:
            for item in read(letters):
                yield item
                letters.drain()
        except GeneratorExit:  # Spark read no further (a limit): what was left out so far goes aside all the same
            _commit(route, letters)
            raise
        _commit(route, letters)
    finally:
        letters.close()


def _commit(route: DeadLetterRoute, letters: DeadLetterWriter) -> None:
    letters.commit()
    # No driver commit follows a read task: the task notes its dead letters for sluice doctor (errors.meta).
    route.record(letters.count, letters.context.write_id)
