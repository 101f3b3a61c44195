"""`SourceDataSource`: a split source (FLIP-27, sluice/source) as the reader of a Spark Python Data Source.

A source subclasses it, declares `read_spec` and implements `schema()` and `reader()` (a `SplitBatchReader` over
its enumerator and split reader) and/or `streamReader()` (a `SplitStreamReader`). Options are parsed on the
driver by `read_options()` and typed by the format's `TypedOptions` (`ReadOptions.of(self.read_options())`); the
enumerator and reader carry what executors need.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from sluice._options import Options, OptionSpec
from sluice.metrics._reads import ReadObserver
from sluice.source._stream_start import reported_whole
from sluice.spark._datasource import SluiceDataSource

if TYPE_CHECKING:
    from sluice.sink._deadletters import DeadLetterRoute
    from sluice.source._lookup import LookupReader


class SourceDataSource(SluiceDataSource):
    # The options of a lookup join on this store (sluice.lookup, docs/lookup.md): its connection, what names the
    # table, and sluice.connector.LOOKUP_OPTIONS; None: the store has no lookups.
    lookup_spec: ClassVar[OptionSpec | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A source's own `streamReader()` is wrapped so that an error raised when the stream starts reaches the
        user whole, not masked by Spark's streaming runner (sluice/source/_stream_start.py says how)."""
        super().__init_subclass__(**kwargs)
        if "streamReader" in cls.__dict__:
            cls.streamReader = reported_whole(cls.__dict__["streamReader"])  # type: ignore[method-assign]

    def read_options(self) -> Options:
        """The options of this read, parsed and checked once on the driver."""
        if self.read_spec is None:
            raise NotImplementedError(f"{type(self).__name__} declares no read_spec")
        return self.read_spec.parse(self.options)

    def lookup_options(self) -> Options:
        """The options of a lookup join on this store, parsed and checked once on the driver."""
        if self.lookup_spec is None:
            raise NotImplementedError(f"{type(self).__name__} declares no lookup_spec")
        return self.lookup_spec.parse(self.options)

    def lookup_reader(self, opts: Options, on: tuple[str, ...], columns: tuple[str, ...] | None) -> LookupReader:
        """The driver's plan of a lookup join (a store with `lookup_spec` implements it): the table checked to have
        the key columns `on` and the looked-up `columns` (None: all its others), refusing either by name, and the
        `LookupReader` the workers call, its schema typed as this store's batch read types those columns."""
        raise NotImplementedError(f"{type(self).__name__} declares lookup_spec without lookup_reader()")

    def read_observer(self, event_time: str | None = None) -> ReadObserver | None:
        """The driver's observer of this read (live metrics; None when no collector runs; `event_time`: the
        column of each row's event time)."""
        return ReadObserver.on_driver(self.format_name, event_time=event_time)

    def dead_letters(self, opts: Options, streaming: bool, *, one_task: bool = False) -> DeadLetterRoute | None:
        """The read's dead-letter route (errors.tolerance=all: records it cannot decode or type go there), planned
        on the driver and carried to the read tasks inside the reader (`read_with_letters`); None: such a record
        fails the read. For a read whose spec has ERROR_OPTIONS and check_error_options; its bounds
        (errors.max-records, errors.max-ratio) are checked per read task (`read_with_letters`).

        `one_task`: the read sends records aside from one task per micro-batch (or batch read) at most. Otherwise a
        target that commits on the driver (tablestore, a transactional sink) is refused: a read task commits its own
        dead letters, and such a target takes a second task's commit under the same query and micro-batch for a
        replay of the first and drops it."""
        from sluice._errors import OptionError
        from sluice.engine._refusals import ErrorPolicy
        from sluice.sink._deadletters import plan_dead_letters  # the sink side, imported by reads that send aside

        route = plan_dead_letters(opts, self.format_name, streaming)
        if route is None:
            return None
        if not one_task and route.plan.commits_on_driver:
            raise OptionError(
                f"errors.deadletter.format={route.target_format} commits on the driver, which format "
                f"'{self.format_name}''s read tasks cannot reach: each task commits its own dead letters, and this "
                "target would keep only the first task's of a micro-batch. Choose a target its tasks write "
                "themselves: postgres, sluice_kafka or s2 (without errors.deadletter.sink.transactional).")
        return replace(route, read_bounds=ErrorPolicy.of(opts))
