"""Exception classes a caller can catch. Messages never contain secrets."""

from __future__ import annotations

from collections.abc import Sequence


class SluiceError(Exception):
    """Base class of every error sluice raises on purpose."""


class OptionError(SluiceError, ValueError):
    """An option is unknown, malformed, out of range, or conflicts with another option."""


class SinkError(SluiceError):
    """A write to a store failed for good (fatal error or retries exhausted).

    Carries the store, the target (never credentials), the size of the batch that failed and the cause.
    """

    def __init__(
        self,
        message: str,
        *,
        store: str = "",
        target: str = "",
        batch_records: int | None = None,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.store = store
        self.target = target
        self.batch_records = batch_records
        self.cause = cause


class RecordTooLargeError(SinkError):
    """One record is larger than the store accepts; it was not sent."""


class RetryableError(SluiceError):
    """Raised (or returned through a future) by a store for a failure worth retrying."""


class ThrottledError(RetryableError):
    """The store asked us to slow down (rate limited); retried and counted as a throttle."""


class RetryEntries(RetryableError):
    """Some entries of a batch failed for a passing reason and only they go again (Flink's
    `ResultHandler.retryForEntries`): the others were stored. `positions` index the batch's entries, in order;
    `cause` (a RetryableError or ThrottledError) says how the engine counts the failure."""

    def __init__(self, message: str, positions: list[int], cause: RetryableError) -> None:
        super().__init__(message)
        self.positions = positions
        self.cause = cause


class RecordError(SluiceError):
    """The store refused a request for what one of its records holds (a constraint it violates, a value that does not
    fit, a record over a size limit, a key the store rejects): sending the same record again fails again. Raised (or
    returned through a future) for a whole batch when the store cannot tell which record it was: with
    errors.tolerance=all the engine splits the batch until the record is alone, then sends it aside
    (docs/reliability.md, "When a record is refused").

    An encoder that finds values the store cannot take before anything is sent raises it with `rows`, the
    positions of those rows in the Arrow batch it was given: with errors.tolerance=all they go aside and the rest of
    the batch is encoded again."""

    def __init__(self, message: str, rows: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.rows = list(rows)


class RefusedRecords(SluiceError):
    """Some entries of a batch were refused for what they hold, each with its own error (a bulk response's items, a
    producer's per-record delivery reports); the others were stored, except `retry`'s, which failed for a passing
    reason and go again. `positions` index the batch's entries, in order; `errors` has one error per position."""

    def __init__(self, message: str, positions: list[int], errors: list[BaseException],
                 retry: RetryEntries | None = None) -> None:
        super().__init__(message)
        if len(positions) != len(errors):
            raise ValueError(f"{len(positions)} refused positions but {len(errors)} errors")
        self.positions = positions
        self.errors = errors
        self.retry = retry


class ConflictError(SluiceError):
    """Another query or job holds what this one needs (a replication slot, a table's writing role); the message
    names the holder and what to do."""


class DataLossError(SluiceError):
    """Data a streaming query needed is gone from the store (trimmed, deleted, or a replication slot lost)."""


class RestartNeededError(SluiceError):
    """A streaming query must be started again with the same checkpoint to go on: what it reads changed in a way a
    running query's fixed schema cannot carry (a column added to a captured table). `sluice.run` restarts the query
    on this error and on no other. The message starts with `CODE`, so the error is recognized in the text Spark
    gives a driver for a task's failure (StreamingQueryException), where the class itself is not kept."""

    CODE = "[SLUICE_RESTART_NEEDED]"

    def __init__(self, message: str) -> None:
        super().__init__(f"{self.CODE} {message}")
