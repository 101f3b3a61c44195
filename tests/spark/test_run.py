"""sluice.run's policy: a query that ends on sluice's "restart needed" error is started again, a bounded number of
times; any other error is raised as it came. Spark's end to end run is tests/connectors/postgres/
test_schema_evolution.py; here the loop alone, with queries that end as told (no store is involved)."""

import pytest

import sluice
from sluice.spark._run import RestartsExhaustedError


class Ended:
    """A started query that ends with `error` (None: stopped)."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def awaitTermination(self) -> None:
        if self.error is not None:
            raise self.error


def starts(*errors: Exception | None):
    """A start_query that ends its n-th query with errors[n]; `.calls` counts the starts."""
    def start():
        start.calls += 1
        return Ended(errors[start.calls - 1])
    start.calls = 0
    return start


# What a driver gets for a task's RestartNeededError: Spark's text, the Python error's inside it.
SPARK_TEXT = ("[STREAM_FAILED] Query [id = 1] terminated with exception: Job aborted ... Traceback (most recent call "
              "last):\n  ...\nsluice.connectors.postgres._client.SchemaChangedError: "
              f"{sluice.RestartNeededError.CODE} table public.t has column(s) ['extra'] ...")


def test_restart_needed_starts_the_query_again_and_other_errors_are_raised_as_they_came():
    start = starts(RuntimeError(SPARK_TEXT), sluice.RestartNeededError("raised on the driver"), None)
    assert isinstance(sluice.run(start), Ended) and start.calls == 3

    # The negative control: the same failure without the code is not a restart.
    other = starts(RuntimeError(SPARK_TEXT.replace(sluice.RestartNeededError.CODE, "")), None)
    with pytest.raises(RuntimeError, match="SchemaChangedError"):
        sluice.run(other)
    assert other.calls == 1


def test_restarts_are_bounded():
    start = starts(*[RuntimeError(SPARK_TEXT)] * 3)
    with pytest.raises(RestartsExhaustedError, match=r"restarted 2 time\(s\) \(max_restarts=2\).*Last: "
                                                     r"\[SLUICE_RESTART_NEEDED\] table public\.t has column"):
        sluice.run(start, max_restarts=2)
    assert start.calls == 3
