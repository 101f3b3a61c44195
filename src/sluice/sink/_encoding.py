"""Vectorized helpers that turn Arrow record batches into engine entries (no per-row dicts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice._errors import OptionError
from sluice.engine._buffer import Ints

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


def binary_column(batch: pa.RecordBatch, name: str) -> tuple[list[bytes], list[int]]:
    """Entries = the values of one string/binary column as bytes; sizes = their byte lengths.

    A string column is viewed as binary (same buffers, no copy) and the sizes are the differences of its offsets:
    the only per-row work is making the bytes objects (about 50 ns a row: a store that can take Arrow should keep
    row numbers as its entries instead, see ArrowRows and binary_sizes)."""
    column, sizes = _binary_view(batch, name)
    return column.to_pylist(), sizes.tolist()


# The offsets' integer type, its width in bytes and its struct format, by the array classes whose sizes are their
# offsets' differences (a string's are a binary's). By class, not by `column.type`: that makes a DataType object, and
# hashes its name.
_OFFSETS: dict[type, tuple[type[np.integer], int, Literal["i", "q"]]] = {
    pa.StringArray: (np.int32, 4, "i"), pa.BinaryArray: (np.int32, 4, "i"),
    pa.LargeStringArray: (np.int64, 8, "q"), pa.LargeBinaryArray: (np.int64, 8, "q"),
}


def binary_sizes(batch: pa.RecordBatch, name: str) -> np.ndarray:
    """The byte lengths of one string/binary column's values, from its offsets: an integer array of the offsets'
    width (int32, int64 for the large types and other layouts), no per-row step and no view of the column."""
    offsets = _offsets(batch, name)
    return _binary_view(batch, name)[1] if offsets is None else offsets[1:] - offsets[:-1]


def binary_running_sums(batch: pa.RecordBatch, name: str) -> Ints:
    """The running sums of one string/binary column's byte lengths (value i's: the bytes of values 0 to i), which its
    offsets are, so no pass makes them: hand them to the engine without sizes (`Encoded(entries, None,
    running=...)`), and it makes each entry's size only where one is needed.

    A memoryview of the offsets themselves when the first is 0 (as in the batches Spark hands a task): no copy and no
    numpy call, each of which costs a Spark task several times what it costs on batches already in memory
    (bench/floors/socket_feed.py); else a numpy array, the offsets less the first."""
    column = _body(batch, name)
    layout = _OFFSETS.get(type(column))
    if layout is None:
        return _binary_view(batch, name)[1].cumsum()
    start = column.offset
    offsets = memoryview(column.buffers()[1]).cast(layout[2])[start:start + len(column) + 1]
    first = offsets[0]
    return offsets[1:] if not first else cast("Ints", np.asarray(offsets[1:]) - first)


def _offsets(batch: pa.RecordBatch, name: str) -> np.ndarray | None:
    """The column's offsets, from its slice's first (None: a layout without them, measured through a view)."""
    column = _body(batch, name)
    layout = _OFFSETS.get(type(column))
    if layout is None:
        return None
    return np.frombuffer(column.buffers()[1], dtype=layout[0], count=len(column) + 1, offset=column.offset * layout[1])


def _body(batch: pa.RecordBatch, name: str) -> pa.Array:
    column = batch.column(name)
    if column.null_count:
        raise OptionError(
            f"column '{name}' has {column.null_count} null value(s) in this batch; a record body cannot be null. "
            "Filter them out or fill them (e.g. F.coalesce(col, F.lit(''))) before writing."
        )
    return column


def _binary_view(batch: pa.RecordBatch, name: str) -> tuple[pa.Array, np.ndarray]:
    """The column viewed as binary (Arrow's compute kernels and to_numpy would measure it in more passes, and
    to_numpy imports pandas into every Python worker on its first batch), and its values' byte lengths."""
    column = _body(batch, name)
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = column.view(pa.binary() if pa.types.is_string(kind) else pa.large_binary())
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        width = 8 if pa.types.is_large_binary(column.type) else 4
        offsets = np.frombuffer(column.buffers()[1], dtype=np.int64 if width == 8 else np.int32,
                                count=len(column) + 1, offset=column.offset * width)
        return column, np.diff(offsets).astype(np.int64, copy=False)
    # other layouts (e.g. binary views): Arrow measures them
    return column, pc.binary_length(column).to_numpy(zero_copy_only=False).astype(np.int64)


def body_column_name(schema_names: Sequence[str], types: Sequence[str]) -> str:
    """The column a raw body comes from: the only string/binary column, or the one named `body` (`types`: Spark's
    type names, DataType.typeName())."""
    if "body" in schema_names:
        return "body"
    candidates = [n for n, t in zip(schema_names, types, strict=True) if t in ("string", "binary")]
    if len(candidates) == 1 and len(schema_names) == 1:
        return candidates[0]
    raise OptionError(
        f"raw bodies come from a single string/binary column or a column named 'body'; the DataFrame has "
        f"columns {list(schema_names)}. Select one column or rename it to 'body'."
    )


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """The batch's columns named in `schema`, cast to its types: what a reader must yield to Spark.

    Extension types (e.g. ADBC's opaque numeric) are unwrapped to their storage first.
    """
    arrays = []
    for field in schema:
        column = batch.column(field.name)
        if isinstance(column.type, pa.ExtensionType):
            column = column.storage
        try:
            arrays.append(column if column.type == field.type else pc.cast(column, field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise type(e)(f"column '{field.name}' does not convert from {column.type} to {field.type}: {e}") from None
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def partition_buckets(batch: pa.RecordBatch, columns: Sequence[str], parallelism: int) -> list[int]:
    """Bucket of every row: hash of the partition-key columns modulo `parallelism` (vectorized)."""
    import pandas as pd

    missing = [c for c in columns if c not in batch.schema.names]
    if missing:
        raise OptionError(
            f"sink.partition-key column(s) {missing} are not in the DataFrame (columns: {batch.schema.names})."
        )
    frame = pa.Table.from_batches([batch.select(list(columns))]).to_pandas()
    hashes = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    buckets: list[int] = (hashes % parallelism).tolist()
    return buckets


def partition_keys(batch: pa.RecordBatch, columns: Sequence[str]) -> tuple[Any, list[Any]]:
    """Exact partition keys of every row, as (integer codes, key per code): one code per distinct key value
    (a value, or a tuple for several columns, as Arrow gives them to Python), computed vectorized, so rows
    group as fast as hash buckets do."""
    import pandas as pd

    missing = [c for c in columns if c not in batch.schema.names]
    if missing:
        raise OptionError(
            f"sink.partition-key column(s) {missing} are not in the DataFrame (columns: {batch.schema.names})."
        )
    combined = np.zeros(batch.num_rows, dtype=np.int64)
    for name in columns:
        codes, uniques = pd.factorize(pd.Series(batch.column(name).to_pandas(types_mapper=pd.ArrowDtype)),
                                      use_na_sentinel=False)
        combined, _ = pd.factorize(combined * len(uniques) + codes)  # stays below rows^2: no overflow
    _, first, codes = np.unique(combined, return_index=True, return_inverse=True)
    keys = batch.select(list(columns)).take(pa.array(first)).to_pylist()
    names = [row[columns[0]] for row in keys] if len(columns) == 1 else [tuple(row.values()) for row in keys]
    return codes, names


def row_numbers(entries: Sequence[int]) -> np.ndarray:
    """Engine entries that are row numbers as an int64 array: a range (what ArrowRows gives, and what a batch of
    consecutive rows stays in the engine) without a step per row."""
    if type(entries) is range:
        return np.arange(entries.start, entries.stop, entries.step, dtype=np.int64)
    return np.asarray(entries, dtype=np.int64)


class ArrowRows:
    """A task's Arrow rows addressed by a running row number, so engine entries are ints, not row objects.

    `add` files a RecordBatch and returns its entries (row numbers, a range) and per-row sizes (the batch's average,
    a numpy array): the engine cuts batches of them without a Python step per row; `table` rebuilds the rows of a
    submitted engine batch as one Arrow table in entry order (slices when the rows are contiguous, else `take`);
    `release` forgets rows once the store acknowledged them, dropping a RecordBatch when all its rows are done.
    Thread-safe: the task thread adds, store threads read.
    """

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._batches: dict[int, pa.RecordBatch] = {}
        self._pending: dict[int, int] = {}
        self._next = 0

    def add(self, batch: pa.RecordBatch) -> tuple[range, np.ndarray]:
        n = batch.num_rows
        with self._lock:
            start = self._next
            self._next += n
            self._starts.append(start)
            self._batches[start] = batch
            self._pending[start] = n
        size = max(1, batch.nbytes // max(n, 1))
        return range(start, start + n), np.full(n, size, dtype=np.int64)

    def _runs(self, entries: Sequence[int]) -> list[tuple[int, Any]]:
        """(batch start, numpy row numbers) per run of entries that fall in one RecordBatch, in entry order."""

        rows = row_numbers(entries)
        with self._lock:
            starts = np.asarray(self._starts, dtype=np.int64)
        owner = starts[np.searchsorted(starts, rows, side="right") - 1]
        cuts = np.flatnonzero(np.diff(owner)) + 1
        return [(int(chunk_owner[0]), chunk) for chunk, chunk_owner in
                zip(np.split(rows, cuts), np.split(owner, cuts), strict=True)]

    def table(self, entries: Sequence[int]) -> pa.Table:
        pieces = []
        for start, rows in self._runs(entries):
            with self._lock:
                batch = self._batches[start]
            local = rows - start
            if len(local) and (np.diff(local) == 1).all():  # consecutive rows in order: a zero-copy slice
                pieces.append(batch.slice(int(local[0]), len(local)))
            else:
                pieces.append(batch.take(pa.array(local)))
        return pa.Table.from_batches(pieces)

    def take(self, entries: Sequence[int]) -> pa.Table:
        """The rows of entries the store refused (Store.refused_rows), forgotten as they are handed over."""
        rows = self.table(entries)
        self.release(entries)
        return rows

    def release(self, entries: Sequence[int]) -> None:
        for start, rows in self._runs(entries):
            with self._lock:
                self._pending[start] -= len(rows)
                if self._pending[start] <= 0:
                    del self._pending[start], self._batches[start]
                    self._starts.remove(start)


def unwritable_columns(schema: StructType) -> list[str]:
    """Columns (nested paths too) of types no sluice store writes: intervals, variant, geometry/geography.

    Spark's own failure for them names no column (intervals) or is a panic deep in an encoder (variant).
    """
    from pyspark.sql import types as T

    # SpatialType (geometry/geography) exists from Spark 4.1 on.
    names = ("DayTimeIntervalType", "YearMonthIntervalType", "CalendarIntervalType", "VariantType", "SpatialType")
    refused = tuple(getattr(T, name) for name in names if hasattr(T, name))
    found: list[str] = []

    def walk(path: str, dtype: Any) -> None:
        if isinstance(dtype, refused):
            found.append(f"'{path}' ({dtype.simpleString()})")
        elif isinstance(dtype, T.StructType):
            for field in dtype.fields:
                walk(f"{path}.{field.name}", field.dataType)
        elif isinstance(dtype, T.ArrayType):
            walk(f"{path}[]", dtype.elementType)
        elif isinstance(dtype, T.MapType):
            walk(f"{path}{{key}}", dtype.keyType)
            walk(f"{path}{{value}}", dtype.valueType)

    for field in schema.fields:
        walk(field.name, field.dataType)
    return found


def check_writable(format_name: str, schema: StructType) -> None:
    """On the driver, before any task starts: refuse column types the format cannot write, naming them."""
    bad = unwritable_columns(schema)
    if bad:
        raise OptionError(
            f"format '{format_name}' cannot write column(s) {', '.join(bad)}. Supported: numbers, decimal, string, "
            "binary, boolean, date, timestamp, timestamp_ntz and arrays, maps and structs of them. Convert first, "
            "e.g. CAST(col AS STRING), or to_json(col) for a variant.")
