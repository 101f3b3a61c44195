"""Lookup joins on the table store (`sluice.lookup(df, "tablestore", ...)`, docs/lookup.md): the rows of an Arrow
batch's keys, read from one Delta version of the table, opening only the data files whose statistics can hold them.

Which version: `lookup.version` when set (every task reads it); otherwise the version of the table's latest
completed barrier in the MetaService (what `barrier` reads name, and what every commit of the table store ends
with), resolved on the driver when the lookup is planned (so that a table without one is refused there) and again
by each task when it starts, so that a streaming query's later micro-batches see later barriers. All the batches
of one task read one version; two tasks may read two, when a barrier completes between their starts.

How: the version's add actions (from the Delta log: each data file's path and its columns' min/max) pick the files
whose range on every key column can hold one of the batch's keys; a file without bounds for a key column is kept.
Only those files are opened, as one pyarrow dataset filtered by `is_in` on the key, so pyarrow also skips row groups
by their Parquet statistics. (Not deltalake's own `to_pyarrow_dataset()`: for a file whose log entry has stats but
none for the filtered column, deltalake 1.6 guarantees `column >= null`, and pyarrow then drops the file: rows lost.)
The files are reached through the warehouse's pyarrow filesystem, as the table's batch read reaches them: a local
folder, or s3:// with the storage.* options resolved on the driver (`Warehouse`). Each worker process keeps the
file lists of the last few versions it opened, so the next task does not replay the Delta log.
"""

from __future__ import annotations

import bisect
import datetime
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import ArrayType, MapType, StructType

from sluice.connector import LookupReader, OptionError, Options, from_arrow_schema, require_name
from sluice.meta import MetaService, check_url
from sluice.tablestore._options import LookupOptions
from sluice.tablestore._storage import Warehouse
from sluice.tablestore._table import StoreTable, TableStoreError

_VERSIONS: OrderedDict[tuple[str, int], VersionFiles] = OrderedDict()
_VERSIONS_LOCK = threading.Lock()
KEPT_VERSIONS = 4  # versions a worker process keeps the file lists of (a stream moves from barrier to barrier)


@dataclass(frozen=True)
class VersionFiles:
    """One version's data files (as the warehouse's filesystem names them), its Arrow schema, and the add actions'
    per-file bounds of each column (None where a file has none)."""

    paths: tuple[str, ...]
    schema: pa.Schema
    low: dict[str, list[Any]]
    high: dict[str, list[Any]]

    def holding(self, column: str, keys: list[Any]) -> list[bool]:
        """Per file: whether its range of `column` can hold one of `keys` (sorted): unknown bounds can."""
        lows, highs = self.low.get(column), self.high.get(column)
        if lows is None or highs is None:
            return [True] * len(self.paths)
        out = []
        for low, high in zip(lows, highs, strict=True):
            try:
                out.append(low is None or high is None or
                           bisect.bisect_right(keys, high) > bisect.bisect_left(keys, low))
            except TypeError:  # bounds the keys do not compare with: the file is read
                out.append(True)
        return out


def _version_files(table: StoreTable, version: int) -> VersionFiles:
    """This process's file list of `table` at `version`, from its Delta log."""
    key = (table.uri, version)
    with _VERSIONS_LOCK:
        if key in _VERSIONS:
            _VERSIONS.move_to_end(key)
            return _VERSIONS[key]
    dt = table.delta(version)
    actions = pa.table(dt.get_add_actions(flatten=True))
    if "deletionVector.storageType" in actions.column_names and \
            actions.column("deletionVector.storageType").null_count < actions.num_rows:
        raise TableStoreError(f"table '{table.name}' has deletion vectors, which this reader does not apply; rewrite "
                              "the table without them (OPTIMIZE / REORG PURGE)")
    schema = pa.schema(dt.schema().to_arrow())
    paths = tuple(table.file_path(unquote(p)) for p in actions.column("path").to_pylist())
    bounds = {side: {name.removeprefix(f"{side}."): actions.column(name).to_pylist()
                     for name in actions.column_names if name.startswith(f"{side}.")} for side in ("min", "max")}
    for name, highs in bounds["max"].items():
        kind = schema.field(name).type if name in schema.names else None
        if kind is not None and pa.types.is_timestamp(kind):
            # Delta keeps timestamp bounds in milliseconds, the maximum truncated: a microsecond later may be in it.
            bounds["max"][name] = [None if h is None else h + datetime.timedelta(milliseconds=1) for h in highs]
        elif kind is not None and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            # Writers may cut a long string bound to a prefix (Delta's default: 32 characters), below the true maximum.
            bounds["max"][name] = [None if h is None or len(h) >= 32 else h for h in highs]
    found = VersionFiles(paths, schema, bounds["min"], bounds["max"])
    with _VERSIONS_LOCK:
        _VERSIONS[key] = found
        while len(_VERSIONS) > KEPT_VERSIONS:
            _VERSIONS.popitem(last=False)
    return found


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
        import pyarrow.dataset as ds

        files = _version_files(self.table, self.task_version())
        keep = [True] * len(files.paths)
        where = None
        for name in self.on:
            values = pc.unique(keys.column(name).combine_chunks()).cast(files.schema.field(name).type)
            ordered = pc.sort_indices(values)
            held = files.holding(name, values.take(ordered).to_pylist())
            keep = [k and h for k, h in zip(keep, held, strict=True)]
            found = pc.field(name).isin(values)
            where = found if where is None else where & found
        paths = [path for path, kept in zip(files.paths, keep, strict=True) if kept]
        if not paths:
            return files.schema.empty_table().select(list(self.columns))
        dataset = ds.dataset(paths, schema=files.schema, format="parquet",
                             filesystem=self.table.warehouse.filesystem())
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
