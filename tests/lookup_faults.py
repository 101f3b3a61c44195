"""A store killed under a lookup reader (docs/lookup.md, Faults): the reader's batches run in the test's process
through the workers' own code (`enrich`), so the test sees each attempt; the server is SIGKILLed between two batches
and, for the negative control, started again once an attempt has met the outage."""

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa

from sluice.metrics._lookups import LookupTally
from sluice.source._lookup_join import enrich
from tests.faults import Striker


def looked_up(plan, batch: pa.RecordBatch) -> dict[str, list]:
    """One Arrow batch through the workers' code, in this process, without a cache."""
    return enrich(plan, batch, None, LookupTally()).to_pydict()


class _FailedAttempts(logging.Handler):
    """Sets `met` at the first retry warning sluice's lookup readers log (`sluice.lookup`, lookup_retry_pause)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.met = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("looking up "):
            self.met.set()


@contextlib.contextmanager
def started_again_after_a_failed_attempt(start: Callable[[], None], timeout: float = 120) -> Iterator[None]:
    """While the body runs a lookup against a killed server: once one of its attempts has failed (the event: the
    reader's retry warning), `start()` the server again in the background. On leaving, the restart is joined (its
    failure raised) and the attempt must have failed: a body that never met the outage proves no retry."""
    attempts = _FailedAttempts()
    logger = logging.getLogger("sluice.lookup")
    logger.addHandler(attempts)

    def restart() -> None:
        assert attempts.met.wait(timeout), f"no lookup attempt failed within {timeout:.0f} s of the kill"
        start()

    striker = Striker(restart)
    striker.start()
    met = False
    try:
        yield
        met = attempts.met.is_set()
    finally:
        attempts.met.set()  # a body that failed before any attempt: the server still comes back for later tests
        striker.join(timeout + 120)
        logger.removeHandler(attempts)
    assert met, "the lookup answered without an attempt failing first: it never met the outage"
