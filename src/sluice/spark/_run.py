"""`sluice.run`: a streaming query started again, with the same checkpoint, when it stops on sluice's "restart
needed" error (RestartNeededError: what it reads changed in a way its fixed schema cannot carry, e.g. a column
added to a table postgres_changes captures), and on nothing else.

Spark keeps no Python exception class across the JVM: a task's failure reaches the driver as a
StreamingQueryException whose text holds the Python error's. RestartNeededError's message starts with its CODE,
which is what is looked for in that text."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sluice._errors import RestartNeededError, SluiceError

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("sluice")


class RestartsExhaustedError(SluiceError):
    """`sluice.run` restarted a query max_restarts times and it asked for another restart."""


def needs_restart(error: BaseException) -> bool:
    """Whether `error` (raised by the query's start or by awaitTermination) is sluice's "restart needed"."""
    return isinstance(error, RestartNeededError) or RestartNeededError.CODE in str(error)


def run(start_query: Callable[[], StreamingQuery], *, max_restarts: int = 10) -> StreamingQuery:
    """Call `start_query` (it builds the streaming DataFrame, so that a restart reads the source's schema again,
    and starts the query with its checkpoint location), wait for the query to end, and when it ends on sluice's
    "restart needed" error call `start_query` again, at most `max_restarts` times; any other error is raised as
    it came. Returns the last query once it ends without an error (stopped, or Trigger.AvailableNow done)."""
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    restarts = 0
    while True:
        try:
            query = start_query()
            query.awaitTermination()
            return query
        except Exception as e:
            if not needs_restart(e):
                raise
            if restarts >= max_restarts:
                raise RestartsExhaustedError(
                    f"the query was restarted {restarts} time(s) (max_restarts={max_restarts}) and asks for another "
                    f"restart; raise max_restarts if the source keeps changing. Last: {_reason(e)}") from e
            restarts += 1
            log.warning("sluice.run: restarting the query with the same checkpoint (restart %d of at most %d): %s",
                        restarts, max_restarts, _reason(e))


def _reason(error: BaseException) -> str:
    """The restart-needed message out of Spark's text (the line that carries the code), else the error's text."""
    text = str(error)
    for line in text.splitlines():
        if RestartNeededError.CODE in line:
            return line[line.index(RestartNeededError.CODE):].strip()
    return text.splitlines()[0] if text else type(error).__name__
