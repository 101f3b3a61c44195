"""Arrow record batches -> S2 records, whole batches at a time (polars for JSON, pyarrow for the rest).

An entry is `(stream name, s2_sdk.Record)`, or the bare record when every row goes to one stream (a fixed
s2.stream: no pair per row, and the store sends a batch without a pass over it); its size is S2's metered size
(8 + 2 * headers + header names and values + body), so the engine's byte limits are S2's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import Encoded, OptionError, RecordError, WriteContext, delete_mask, refuse_truncate
from sluice.connectors.s2._kinds import RecordKind
from sluice.connectors.s2._options import AppendWriteOptions, FormatWriteOptions, template_columns

HEADERS_COLUMN = "headers"
TIMESTAMP_COLUMN = "timestamp"
MAX_STREAM_NAME = 512
_NO_HEADERS: tuple[tuple[bytes, bytes], ...] = ()  # shared and immutable: a record without headers makes no list


def json_bodies(batch: pa.RecordBatch, columns: Sequence[str]) -> pa.Array:
    """One compact JSON object per row over `columns` (vectorized; binary as base64, as Flink's JSON does)."""
    import polars as pl

    frame = pl.from_arrow(pa.Table.from_batches([batch.select(list(columns))]))
    assert isinstance(frame, pl.DataFrame)
    binary = [name for name, dtype in frame.schema.items() if dtype == pl.Binary]
    if binary:
        frame = frame.with_columns([pl.col(name).bin.encode("base64") for name in binary])
    # Decimals of up to 15 digits are exact as doubles: write them as JSON numbers (as Flink does); wider ones
    # stay exact strings.
    narrow = [name for name, dtype in frame.schema.items()
              if isinstance(dtype, pl.Decimal) and (dtype.precision or 38) <= 15]
    if narrow:
        frame = frame.with_columns([pl.col(name).cast(pl.Float64) for name in narrow])
    encoded = frame.select(pl.struct(pl.all()).struct.json_encode().cast(pl.Binary).alias("j"))["j"]
    return encoded.to_arrow()


def _lengths(array: pa.Array) -> np.ndarray:
    return pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _as_binary(array: pa.Array, name: str) -> pa.Array:
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return array.cast(pa.large_binary())
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        return array
    raise OptionError(f"column '{name}' must be string or binary for format=raw, not {array.type}")


class StreamRouter:
    """The stream of every row: `s2.stream` itself, or its template filled from columns (orders/{region})."""

    def __init__(self, template: str, schema_names: Sequence[str]) -> None:
        self.template = template
        self.columns = template_columns(template)
        missing = [c for c in self.columns if c not in schema_names]
        if missing:
            raise OptionError(f"s2.stream template {template!r} names column(s) {missing} that the DataFrame does not "
                              f"have (columns: {list(schema_names)})")
        self.pieces: list[str | tuple[str]] = []
        rest = template
        for column in self.columns:
            before, _, rest = rest.partition("{" + column + "}")
            if before:
                self.pieces.append(before)
            self.pieces.append((column,))
        if rest:
            self.pieces.append(rest)

    @property
    def fixed(self) -> bool:
        return not self.columns

    def streams(self, batch: pa.RecordBatch) -> list[str] | str:
        if self.fixed:
            return self.template
        parts = []
        for piece in self.pieces:
            if isinstance(piece, tuple):
                column = batch.column(piece[0])
                if column.null_count:
                    raise OptionError(f"column '{piece[0]}' routes rows to streams (s2.stream={self.template!r}) "
                                      f"but has {column.null_count} null value(s); fill or filter them first")
                parts.append(column.cast(pa.string()))
            else:
                parts.append(pa.scalar(piece))
        names = pc.binary_join_element_wise(*parts, "").to_pylist()
        bad = next((n for n in names if not 1 <= len(n.encode()) <= MAX_STREAM_NAME or n in (".", "..")), None)
        if bad is not None:
            raise OptionError(f"row routed to stream name {bad!r} by s2.stream={self.template!r}: stream names are "
                              "1-512 bytes and not '.' or '..'")
        return names


class _Stamper:
    """@writer/@wseq headers: who wrote a record and its index in that writer's output to that stream."""

    def __init__(self, context: WriteContext) -> None:
        epoch = context.epoch if context.epoch is not None else 0
        self.writer = f"{context.write_id}/{epoch}/{context.partition_id}".encode()
        self.next: dict[str, int] = {}

    def numbers(self, streams: list[str] | str, n: int) -> list[int]:
        if isinstance(streams, str):
            start = self.next.get(streams, 0)
            self.next[streams] = start + n
            return list(range(start, start + n))
        out = []
        counters = self.next
        for name in streams:
            value = counters.get(name, 0)
            counters[name] = value + 1
            out.append(value)
        return out


class S2Encoder:
    """Callable: RecordBatch -> Encoded (entries, metered sizes; the rows kept, for upserts). One per Spark task."""

    def __init__(self, options: FormatWriteOptions, schema_names: Sequence[str], context: WriteContext,
                 stamp: bool, bare_records: bool = False) -> None:
        """`bare_records`: entries are records, not (stream, record) pairs; only for a fixed s2.stream."""
        import s2_sdk

        self._record = s2_sdk.Record
        self.kind = options.kind
        self.router = StreamRouter(options.s2_stream, schema_names)
        if bare_records and not self.router.fixed:
            raise ValueError(f"bare records need a fixed s2.stream, not the template {options.s2_stream!r}")
        self.bare_records = bare_records
        self.stamper = _Stamper(context) if stamp else None
        names = list(schema_names)
        if isinstance(options, AppendWriteOptions):
            self.format = options.format
            self.headers_column = HEADERS_COLUMN if HEADERS_COLUMN in names else None
            self.timestamp_column = TIMESTAMP_COLUMN if TIMESTAMP_COLUMN in names else None
            data = [n for n in names if n not in (HEADERS_COLUMN, TIMESTAMP_COLUMN)]
            if self.format == "raw":
                if "body" in data:
                    self.body_columns = ["body"]
                elif len(data) == 1:
                    self.body_columns = data
                else:
                    raise OptionError(f"format=raw needs one data column, or a column named 'body'; the DataFrame "
                                      f"has {data} (besides headers/timestamp). Select one column or rename it.")
            else:
                if not data:
                    raise OptionError("the DataFrame has no column to put in the record body")
                self.body_columns = data
        else:
            self.key_columns = list(options.primary_key)
            self.op_column = options.upsert_op_column
            self.reduce = options.upsert_reduce
            missing = [c for c in [*self.key_columns, *([self.op_column] if self.op_column else [])] if c not in names]
            if missing:
                raise OptionError(f"column(s) {missing} named by primary-key/upsert.op-column are not in the "
                                  f"DataFrame (columns: {names})")
            self.value_columns = [n for n in names if n not in self.key_columns and n != self.op_column]
            if not self.value_columns:
                raise OptionError("s2_upsert needs at least one non-key column for the record body "
                                  f"(primary-key={self.key_columns}, columns: {names})")

    def __call__(self, batch: pa.RecordBatch) -> Encoded:
        if self.kind is RecordKind.APPEND:
            return Encoded(*self._append(batch))
        return self._upsert(batch)

    # ------------------------------------------------------------------ append
    def _append(self, batch: pa.RecordBatch) -> tuple[list[Any], list[int]]:
        if self.format == "raw":
            bodies_array = _as_binary(batch.column(self.body_columns[0]), self.body_columns[0])
            if bodies_array.null_count:
                raise RecordError(f"column '{self.body_columns[0]}' has {bodies_array.null_count} null value(s); a "
                                  "record body cannot be null. Filter them or fill them first (errors.tolerance=all "
                                  "sends such rows aside).", rows=_null_rows(bodies_array))
        else:
            bodies_array = json_bodies(batch, self.body_columns)
        sizes = _lengths(bodies_array) + 8
        bodies = bodies_array.to_pylist()
        streams = self.router.streams(batch)
        headers = self._user_headers(batch) if self.headers_column else None
        timestamps = self._timestamps(batch) if self.timestamp_column else None
        if headers is not None:
            sizes = sizes + np.fromiter((2 * len(h) + sum(len(k) + len(v) for k, v in h) for h in headers),
                                        np.int64, len(headers))
        return self._entries(streams, bodies, sizes, headers, timestamps)

    def _user_headers(self, batch: pa.RecordBatch) -> list[list[tuple[bytes, bytes]]]:
        column = batch.column(self.headers_column)
        kind = column.type
        rows = column.to_pylist()

        def b(value: Any) -> bytes:
            return value if isinstance(value, bytes) else str(value).encode()

        out: list[list[tuple[bytes, bytes]]] = []
        for row in rows:
            if row is None:
                out.append([])
            elif pa.types.is_map(kind):
                out.append([(b(k), b(v)) for k, v in row])
            elif pa.types.is_list(kind) and pa.types.is_struct(kind.value_type):
                out.append([(b(item["name"]), b(item["value"])) for item in row])
            else:
                raise OptionError("the headers column must be map<string,string> (or binary) or "
                                  f"array<struct<name,value>>, not {kind}")
        for h in out:
            if any(not name for name, _ in h):
                raise OptionError("a header name in the headers column is empty; S2 reserves empty names for "
                                  "command records")
        return out

    def _timestamps(self, batch: pa.RecordBatch) -> list[int | None]:
        column = batch.column(self.timestamp_column)
        if pa.types.is_timestamp(column.type):
            column = pc.cast(column.cast(pa.timestamp("ms", tz="UTC")), pa.int64())
        elif pa.types.is_integer(column.type):
            column = column.cast(pa.int64())
        else:
            raise OptionError(f"the timestamp column must be a timestamp or a long of epoch ms, not {column.type}")
        return column.to_pylist()

    # ------------------------------------------------------------------ upsert
    def _upsert(self, batch: pa.RecordBatch) -> Encoded:
        if self.op_column:
            refuse_truncate(batch.column(self.op_column), self.op_column, "s2")
        for column in self.key_columns:
            nulls = batch.column(column).null_count
            if nulls:
                raise RecordError(f"primary-key column '{column}' has {nulls} null value(s) in this batch; an "
                                  "upsert key cannot be null. Filter or fill them before writing (errors.tolerance="
                                  "all sends such rows aside).", rows=_null_rows(batch.column(column)))
        kept = None
        if self.reduce and batch.num_rows > 1:
            kept = self._last_per_key(batch)
            if kept is not None:
                batch = batch.take(kept)
        keys = json_bodies(batch, self.key_columns)
        if self.op_column:
            deletes = delete_mask(batch.column(self.op_column).cast(pa.string()))
        else:
            deletes = pa.array(np.zeros(batch.num_rows, dtype=bool))
        values = json_bodies(batch, self.value_columns)
        bodies_array = pc.if_else(deletes, pa.scalar(b"", pa.large_binary()), values)
        delete_flags = deletes.to_numpy(zero_copy_only=False)
        # @key + @action headers: 2 * 2 + len("@key") + len(key) + len("@action") + 1
        sizes = 8 + _lengths(bodies_array) + 4 + 4 + _lengths(keys) + 7 + 1
        key_list, bodies = keys.to_pylist(), bodies_array.to_pylist()
        headers = [[(b"@key", k), (b"@action", b"d" if d else b"u")]
                   for k, d in zip(key_list, delete_flags, strict=True)]
        entries, sizes_list = self._entries(self.router.streams(batch), bodies, sizes, headers, None)
        return Encoded(entries, sizes_list, None if kept is None else kept.to_pylist())

    def _last_per_key(self, batch: pa.RecordBatch) -> pa.Array | None:
        """Indices of each key's last row, in order (None: nothing to drop). No key's changes reorder."""
        table = pa.Table.from_batches([batch]).append_column("__row", pa.array(np.arange(batch.num_rows)))
        group = list(self.key_columns)
        if not self.router.fixed:
            group += [c for c in self.router.columns if c not in group]  # a key on two streams is two keys
        last = table.group_by(group, use_threads=False).aggregate([("__row", "max")]).column("__row_max")
        if len(last) == batch.num_rows:
            return None
        return pc.take(last, pc.sort_indices(last)).combine_chunks()

    # ------------------------------------------------------------------ records
    def _entries(self, streams: list[str] | str, bodies: list[bytes], sizes: np.ndarray,
                 headers: list[list[tuple[bytes, bytes]]] | None, timestamps: list[int | None] | None
                 ) -> tuple[list[Any], list[int]]:
        record = self._record
        n = len(bodies)
        entries: list[Any]  # records, or (stream, record) pairs
        if self.stamper is not None:
            numbers = self.stamper.numbers(streams, n)
            writer = self.stamper.writer
            wseq = [str(i).encode() for i in numbers]
            # 2 * 2 + len("@writer") + len(writer) + len("@wseq") + len(n)
            sizes = sizes + (4 + 7 + len(writer) + 5) + np.fromiter((len(w) for w in wseq), np.int64, n)
            stamps = [[(b"@writer", writer), (b"@wseq", w)] for w in wseq]
            headers = stamps if headers is None else [h + s for h, s in zip(headers, stamps, strict=True)]
        if isinstance(streams, str) and self.bare_records:
            if headers is None and timestamps is None:
                # s2_sdk only iterates and measures a Record's headers: a tuple serves where it declares a list.
                entries = [record(b, _NO_HEADERS) for b in bodies]  # type: ignore[arg-type]
            else:
                hs = headers if headers is not None else [_NO_HEADERS] * n
                ts = timestamps if timestamps is not None else [None] * n
                entries = [record(b, h, t) for b, h, t in zip(bodies, hs, ts, strict=True)]  # type: ignore[arg-type]
        elif isinstance(streams, str):
            if headers is None and timestamps is None:
                entries = [(streams, record(b)) for b in bodies]
            elif timestamps is None:  # so headers is not None
                entries = [(streams, record(b, h)) for b, h in zip(bodies, headers or [], strict=True)]
            else:
                hs = headers if headers is not None else [[] for _ in range(n)]
                entries = [(streams, record(b, h, t)) for b, h, t in zip(bodies, hs, timestamps, strict=True)]
        else:
            hs = headers if headers is not None else [[] for _ in range(n)]
            ts = timestamps if timestamps is not None else [None] * n
            entries = [(s, record(b, h, t)) for s, b, h, t in zip(streams, bodies, hs, ts, strict=True)]
        return entries, sizes.tolist()


def _null_rows(column: pa.Array) -> list[int]:
    return np.flatnonzero(np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)).tolist()
