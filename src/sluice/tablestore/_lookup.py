"""Lookup joins on the table store (`sluice.lookup(df, "tablestore", ...)`, docs/lookup.md): the rows of an Arrow
batch's keys, read from one Delta version of the table, opening only the data files whose statistics can hold them.

Which version: `lookup.version` when set (every task reads it); otherwise the version of the table's latest
completed barrier in the MetaService (what `barrier` reads name, and what every commit of the table store ends
with), resolved on the driver when the lookup is planned (so that a table without one is refused there) and again
by each task when it starts, so that a streaming query's later micro-batches see later barriers. All the batches
of one task read one version; two tasks may read two, when a barrier completes between their starts.

How: deltalake's pyarrow dataset of that version, whose fragments carry each data file's min/max statistics from
the Delta log, filtered by `is_in` on the key (several key columns: `is_in` on each, then the exact pairs by a join
in sluice's join back). pyarrow skips every file whose statistics cannot match before opening it, then row groups
by their Parquet statistics. The dataset reaches the warehouse as the table's batch read does: a local folder, or
s3:// with the storage.* options resolved on the driver (`Warehouse`), through deltalake's own filesystem. Each
worker process keeps the datasets of the last few versions it opened, so the next task does not replay the log.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import ArrayType, MapType, StructType

from sluice.connector import LookupReader, OptionError, Options, from_arrow_schema, require_name
from sluice.meta import MetaService, check_url
from sluice.tablestore._options import LookupOptions
from sluice.tablestore._storage import Warehouse
from sluice.tablestore._table import StoreTable

_DATASETS: OrderedDict[tuple[str, int], Any] = OrderedDict()
_DATASETS_LOCK = threading.Lock()
KEPT_VERSIONS = 4  # datasets a worker process keeps (a stream moves from barrier to barrier)


def _dataset(table: StoreTable, version: int) -> Any:
    """This process's pyarrow dataset of `table` at `version` (deltalake's: fragments with the files' stats)."""
    key = (table.uri, version)
    with _DATASETS_LOCK:
        if key in _DATASETS:
            _DATASETS.move_to_end(key)
            return _DATASETS[key]
    dataset = table.delta(version).to_pyarrow_dataset()
    with _DATASETS_LOCK:
        _DATASETS[key] = dataset
        while len(_DATASETS) > KEPT_VERSIONS:
            _DATASETS.popitem(last=False)
    return dataset


def _latest_barrier_version(table: StoreTable, meta: str) -> int:
    last = MetaService(meta).last_barrier(table.name)
    if last is None:
        raise OptionError(f"table '{table.name}' has no completed barrier in the MetaService {meta_display(meta)}: a "
                          "lookup reads the version of the latest one. Set lookup.version to read a Delta version, "
                          "or option meta to the MetaService its writes commit to.")
    return last[1]


def meta_display(meta: str) -> str:
    return meta.split("@")[-1] if "@" in meta else meta  # a postgresql:// URL's credentials never shown


class TableStoreLookupReader(LookupReader):
    """Rows of one table-store table by key from one version: see the module's docstring."""

    def __init__(self, table: StoreTable, version: int | None, meta: str, on: tuple[str, ...],
                 columns: tuple[str, ...], schema: StructType) -> None:
        self.table, self.version, self.on, self.columns = table, version, on, columns
        self._meta = meta  # the MetaService's location (a postgresql:// URL may hold a password: never shown)
        self._schema = schema
        self._task_version: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_task_version": None}  # each task resolves the latest barrier anew

    @property
    def schema(self) -> StructType:
        return self._schema

    @property
    def described(self) -> str:
        return f"table '{self.table.name}' in {self.table.warehouse.root}"

    def task_version(self) -> int:
        """The version this task reads: lookup.version, else the latest barrier's when the task first looks up."""
        if self.version is not None:
            return self.version
        if self._task_version is None:
            self._task_version = _latest_barrier_version(self.table, self._meta)
        return self._task_version

    def lookup(self, keys: pa.Table) -> pa.Table:
        dataset = _dataset(self.table, self.task_version())
        where = None
        for name in self.on:
            values = pc.unique(keys.column(name).combine_chunks())
            found = pc.field(name).isin(values.cast(dataset.schema.field(name).type))
            where = found if where is None else where & found
        return dataset.to_table(columns=list(self.columns), filter=where)


def plan_lookup(opts: Options, on: tuple[str, ...], columns: tuple[str, ...] | None) -> TableStoreLookupReader:
    """The reader of a lookup in the table the options name: its version opened on the driver (the named one, or
    the latest barrier's), the key and looked-up columns checked against that version's schema."""
    options = LookupOptions.of(opts)
    table = StoreTable(options.table, Warehouse.resolve(opts["warehouse"], opts))
    meta = check_url(options.meta)
    if not meta.startswith(("postgresql://", "postgres://")):
        # A SQLite path: absolute here, on the driver (a worker's working directory is not the driver's).
        meta = str(Path(meta.removeprefix("sqlite:///").removeprefix("sqlite://")).absolute())
    if not table.exists():
        table.delta()  # refuses a missing table by name, before the MetaService is asked about it
    version = options.lookup_version if options.lookup_version is not None else \
        _latest_barrier_version(table, meta)
    schema = pa.schema(table.delta(version).schema().to_arrow())
    spark = from_arrow_schema(schema)
    of = f"table '{table.name}' (version {version})"
    for key in on:
        require_name(key, schema.names, "key column", of, advice="Name the table's key column in on=, as the "
                     "DataFrame names it (rename the DataFrame's column to match).")
        kind = spark[key].dataType
        if isinstance(kind, ArrayType | MapType | StructType):
            raise OptionError(f"key column '{key}' of {of} is {kind.simpleString()}: look up by a scalar column")
    for name in columns or ():
        require_name(name, schema.names, "looked-up column", of, advice="Leave it out of columns=[...].")
    wanted = tuple(dict.fromkeys([*on, *(columns if columns is not None else
                                         [n for n in schema.names if n not in on])]))
    rows = StructType([spark[name] for name in wanted])
    return TableStoreLookupReader(table, options.lookup_version, meta, on, wanted, rows)
