"""The core every sluice format shares: its name, its option declarations, and refusing what it does not do.

Options are declared once per direction, as class attributes: `write_spec` (sinks; the engine's sink.* options alone
when a sink declares none) and `read_spec` (sources). Spark's options become `Options` in one place per direction,
`write_options()` and `read_options()`; a format's `TypedOptions` dataclass types them (`ReadOptions.of(opts)`).

A format is a sink (`SinkDataSource`, sluice/sink/_datasource.py), a split source (`SourceDataSource`,
sluice/source/_datasource.py), or both (`class HBaseDataSource(SinkDataSource, SourceDataSource)`). The core holds what
either side needs; each side adds its own hooks. The DataSource keeps no state between Spark's calls but what
`learn_once` caches for the one write or read it serves.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar, cast

from pyspark.sql.datasource import DataSource

from sluice._errors import OptionError
from sluice._options import Options, OptionSpec

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
    from pyspark.sql.types import StructType

T = TypeVar("T")


class SluiceDataSource(DataSource):
    format_name: ClassVar[str] = "sluice"
    # The options of writes; None: the format is not written.
    write_spec: ClassVar[OptionSpec | None] = None
    # The options of spark.read / spark.readStream; None: the format is not read.
    read_spec: ClassVar[OptionSpec | None] = None
    # A format that is only read (a change stream) refuses every write before anything else, naming how it is
    # read and the format to write with instead.
    read_api: ClassVar[str] = "spark.read"
    write_with: ClassVar[str | None] = None
    # What counts as a refused record (errors.tolerance=all sends it to the dead-letter target), one sentence each
    # way, for docs/reliability.md's table, which is generated from them: `refused_writes` the failures the store
    # reports per record, `refused_reads` the records a read cannot decode or type. None: the format has none.
    refused_writes: ClassVar[str | None] = None
    refused_reads: ClassVar[str | None] = None

    @classmethod
    def name(cls) -> str:
        return cls.format_name

    def write_options(self) -> Options:
        """The options of a write (every write path starts here): a format that is not written refuses."""
        self._refuse_writes()

    def _refuse_writes(self) -> NoReturn:
        instead = f"; write with format('{self.write_with}')" if self.write_with else ""
        raise OptionError(f"format '{self.format_name}' is read-only ({self.read_api}){instead}")

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        self._refuse_writes()

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        self._refuse_writes()

    def learn_once(self, key: Hashable, learn: Callable[[], T]) -> T:
        """What the driver learns about the target (a table's columns and keys), asked of the store once per planned
        write: Spark makes a DataSource per write and calls several hooks (primary_key, sink_config, plan_write)."""
        learned: dict[Hashable, Any] = self.__dict__.setdefault("_learned", {})
        if key not in learned:
            learned[key] = learn()
        return cast("T", learned[key])
