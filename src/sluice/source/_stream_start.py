"""A stream's start errors reported whole.

Spark's streaming source runner (pyspark.sql.streaming.python_streaming_source_runner, every line 4.0-4.3) calls
`reader.stop()` in a `finally` around `streamReader()`: an exception raised there leaves `reader` unbound, and the
user reads Spark's `UnboundLocalError: cannot access local variable 'reader'` with sluice's message buried in the
traceback. So a failing `streamReader()` returns a `FailedStreamReader` instead, which raises the same exception at
Spark's first call (initialOffset or latestOffset), where the runner reports it as it is. Only inside that runner:
anywhere else (a test, a tool calling `streamReader()` itself) the exception is raised where it happens.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

F = TypeVar("F", bound=Callable[..., Any])

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def in_spark_runner() -> bool:
    """Whether this process is Spark's streaming source runner: imported by a daemon, or run as `python -m`."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return RUNNER in sys.modules or getattr(main_spec, "name", None) == RUNNER


class FailedStreamReader(DataSourceStreamReader):
    """The reader of a stream whose start failed: every call that would read raises the start's exception."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def _fail(self) -> NoReturn:
        raise self.error

    def initialOffset(self) -> dict:
        self._fail()

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        self._fail()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        self._fail()

    def read(self, partition: InputPartition) -> Any:
        self._fail()

    def commit(self, end: dict) -> None:
        """Nothing was read, so nothing to commit."""

    def stop(self) -> None:
        """Nothing was opened."""


def reported_whole(stream_reader: F) -> F:
    """`streamReader()` whose exceptions reach the user as they are (see the module's docstring)."""

    @functools.wraps(stream_reader)
    def start(self: Any, schema: Any) -> Any:
        try:
            return stream_reader(self, schema)
        except Exception as error:
            if not in_spark_runner():
                raise
            return FailedStreamReader(error)  # re-raised at Spark's first call

    return start  # type: ignore[return-value]
