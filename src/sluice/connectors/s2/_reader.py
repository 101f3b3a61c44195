"""Reading S2 records on the executors: one SDK read session per partition (a stream, or a seq-num range of one),
handed to Spark as Arrow batches of the query's schema (the raw record, JSON bodies parsed, or upsert changes)."""

from __future__ import annotations

import asyncio
import json
import logging
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

import numpy as np
import pyarrow as pa

from sluice.connector import (
    DataLossError,
    DeadLetterRoute,
    DeadLetterWriter,
    OptionError,
    SluiceError,
    Split,
    SplitReader,
    read_with_letters,
    to_arrow_schema,
)
from sluice.connectors.s2._client import Connection, explain_sdk_error
from sluice.connectors.s2._kinds import RecordKind
from sluice.connectors.s2._options import ReadOptions
from sluice.connectors.s2._records import RecordColumns, protobuf_records

log = logging.getLogger("sluice.s2")

META_COLUMNS = ("stream", "seq_num", "timestamp", "headers", "body")
CORRUPT = "_corrupt_record"
ARROW_BATCH_RECORDS = 4096  # records per Arrow batch handed to Spark


class BodyError(SluiceError):
    """A record whose body does not parse as a JSON object of the read's schema."""


def _headers_array(headers: list[list[tuple[bytes, bytes]]] | None, n: int, arrow_type: pa.DataType) -> pa.Array:
    """list<struct<name, value>> built from flat arrays and offsets (no per-record dicts); None: all empty."""
    item = arrow_type.value_type
    if headers is None:
        offsets = pa.array(np.zeros(n + 1, np.int32))
    else:
        offsets = pa.array([0, *accumulate(len(h) for h in headers)], pa.int32())
    if headers is None or not offsets[-1].as_py():
        values = pa.StructArray.from_arrays([pa.array([], pa.binary()), pa.array([], pa.binary())],
                                            fields=list(item))
    else:
        flat = [pair for h in headers for pair in h]
        values = pa.StructArray.from_arrays([pa.array([k for k, _ in flat], pa.binary()),
                                             pa.array([v for _, v in flat], pa.binary())], fields=list(item))
    return pa.ListArray.from_arrays(offsets, values, type=arrow_type)


class S2Reader(SplitReader):
    """Reads seq nums [start, end) of a stream with one read session; yields Arrow batches of the schema."""

    def __init__(self, conn: Connection, schema: Any, options: ReadOptions, *, materialize: bool = False,
                 dead_letters: DeadLetterRoute | None = None, read_id: str = "", streaming: bool = False) -> None:
        """`materialize` (upserts, batch reads): the latest row per @key of each stream, without deleted keys.
        `dead_letters`: where records whose body does not parse go (errors.tolerance=all), named after the
        streaming query, else `read_id`."""
        self.dead_letters, self.read_id, self.streaming = dead_letters, read_id, streaming

        self.conn = conn
        self.kind = options.kind
        self.materialize = materialize
        self.fail_on_data_loss = options.fail_on_data_loss
        self.json = options.format == "json" or self.kind is RecordKind.UPSERT
        self.failfast = options.mode == "FAILFAST"
        self.arrow_schema = to_arrow_schema(schema)
        names = self.arrow_schema.names
        if self.json:
            self.data_fields = [f for f in self.arrow_schema if f.name not in META_COLUMNS and f.name not in
                                (CORRUPT, "_op")]
        else:
            unknown = [n for n in names if n not in META_COLUMNS]
            if unknown:
                raise OptionError(f"column(s) {unknown} are not S2 record columns ({', '.join(META_COLUMNS)}); to "
                                  "parse JSON bodies into columns use .option('format', 'json')")
            self.data_fields = []

    # ------------------------------------------------------------------ reading
    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        return read_with_letters(self.dead_letters, self.read_id, self.streaming, split.split_id,
                                 lambda letters: self._read(split, start, end, letters))

    def _read(self, split: Split, start: int, end: int, letters: DeadLetterWriter | None
              ) -> Iterator[pa.RecordBatch]:
        loop = asyncio.new_event_loop()
        try:
            agen = self._records(split.split_id, start, end)
            pending = RecordColumns.empty()
            while True:
                try:
                    columns = loop.run_until_complete(agen.__anext__())
                except StopAsyncIteration:
                    break
                pending.extend(columns)
                if len(pending) >= ARROW_BATCH_RECORDS and not self.materialize:
                    yield self._to_arrow(split.split_id, pending, letters)
                    pending = RecordColumns.empty()
            if self.materialize:
                pending = self._materialize(pending)
            if len(pending):
                yield self._to_arrow(split.split_id, pending, letters)
        finally:
            loop.close()

    async def _records(self, stream_name: str, start: int, end: int) -> Any:
        """RecordColumns of seq nums [start, end), command records left out."""
        import s2_sdk

        expected = start
        async with self.conn.client() as client:
            stream = self.conn.stream(client.basin(self.conn.basin), stream_name)
            try:
                with protobuf_records():  # not across a yield: each step of this generator runs in a new task
                    session = stream.read_session(start=s2_sdk.SeqNum(start),
                                                  limit=s2_sdk.ReadLimit(count=end - start))
                    session.__aiter__()  # starts the session's task now: it keeps this context
                async with session:
                    async for batch in session:
                        records = batch.records
                        if not records:
                            continue
                        if records[0].seq_num > expected:
                            self._data_loss(stream_name, expected, records[0].seq_num)
                        expected = records[-1].seq_num + 1
                        columns = RecordColumns.of(records)
                        seq_nums = columns.seq_nums
                        if seq_nums and seq_nums[-1] >= end:  # seq nums increase: cut without testing each one
                            columns = columns.head(bisect_left(seq_nums, end))
                        if len(columns):
                            yield columns
                        if expected >= end:
                            return
            except s2_sdk.S2ServerError as error:
                if error.status_code == 404 or isinstance(error, s2_sdk.ReadUnwrittenError):
                    self._data_loss(stream_name, expected, None, error)
                    return
                raise explain_sdk_error(error, self.conn.basin, stream_name, "read") or error from None

    def _data_loss(self, stream: str, expected: int, found: int | None, error: Exception | None = None) -> None:
        what = (f"records {expected}..{found - 1} of stream '{stream}' were trimmed" if found is not None
                else f"stream '{stream}' is gone or shorter than expected ({error})")
        if self.fail_on_data_loss:
            raise DataLossError(f"{what} before they were read. Set .option('failOnDataLoss', 'false') to skip "
                                "ahead (with a warning) instead of failing.")
        log.warning("%s; skipping ahead (failOnDataLoss=false)", what)

    # ------------------------------------------------------------------ conversion
    def _to_arrow(self, stream: str, records: RecordColumns, letters: DeadLetterWriter | None) -> pa.RecordBatch:
        columns: dict[str, pa.Array] = {}
        names = self.arrow_schema.names
        if self.json:
            parsed, corrupt, reasons = self._parse(stream, records)
            if letters is not None and any(reason is not None for reason in reasons):
                records, parsed = self._set_aside(stream, records, parsed, reasons, letters)
                corrupt = [None] * len(records)
            if CORRUPT in names:
                parsed[CORRUPT] = pa.array(corrupt, pa.string())
            columns.update(parsed)
        n = len(records)
        if "stream" in names:
            columns["stream"] = pa.repeat(pa.scalar(stream, pa.string()), n)
        if "seq_num" in names:
            columns["seq_num"] = pa.array(records.seq_nums, pa.int64())
        if "timestamp" in names:
            columns["timestamp"] = pa.array(records.timestamps, pa.int64()).cast(
                pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))
        if "headers" in names:
            columns["headers"] = _headers_array(records.headers, n, self.arrow_schema.field("headers").type)
        if "body" in names:
            columns["body"] = pa.array(records.bodies, pa.binary())
        return pa.RecordBatch.from_arrays([columns[name].cast(self.arrow_schema.field(name).type)
                                           for name in names], schema=self.arrow_schema)

    def _set_aside(self, stream: str, records: RecordColumns, parsed: dict[str, pa.Array],
                   reasons: list[str | None], letters: DeadLetterWriter) -> tuple[RecordColumns, dict[str, pa.Array]]:
        """The records whose body does not parse, to the dead letters (as the raw record); the others returned."""
        bad = [i for i, reason in enumerate(reasons) if reason is not None]
        aside = records.take(bad)
        headers = aside.headers or [[] for _ in bad]
        letters.add([{"stream": stream, "seq_num": seq_num, "timestamp": at, "headers": [list(h) for h in pairs],
                      "body": body}
                     for seq_num, at, pairs, body in zip(aside.seq_nums, aside.timestamps, headers, aside.bodies,
                                                         strict=True)],
                    [BodyError(f"record {seq_num} of stream '{stream}' is not a JSON object of the schema "
                               f"({reasons[i]})") for i, seq_num in zip(bad, aside.seq_nums, strict=True)])
        keep = [i for i, reason in enumerate(reasons) if reason is None]
        taken = pa.array(keep, pa.int64())
        return records.take(keep), {name: column.take(taken) for name, column in parsed.items()}

    def _parse(self, stream: str, records: RecordColumns
               ) -> tuple[dict[str, pa.Array], list[str | None], list[str | None]]:
        """The JSON columns: from the body (format=json) or from @key and the body (upsert); each record's text
        when its body does not parse (_corrupt_record) and why."""
        names = self.arrow_schema.names
        if self.kind is RecordKind.UPSERT:
            headers = records.header_dicts()
            keys = [h.get(b"@key", b"{}") for h in headers]
            ops = [h.get(b"@action", b"u").decode() for h in headers]
            merged = []
            for key, body, op in zip(keys, records.bodies, ops, strict=True):
                try:
                    row = json.loads(body) if op == "u" and body else {}
                    row.update(json.loads(key))
                    merged.append(json.dumps(row).encode())
                except ValueError:
                    merged.append(b"")
            parsed, corrupt, reasons = self._parse_json(stream, records, merged)
            if "_op" in names:
                parsed["_op"] = pa.array(ops, pa.string())
        else:
            parsed, corrupt, reasons = self._parse_json(stream, records, records.bodies)
        return parsed, corrupt, reasons

    def _parse_json(self, stream: str, records: RecordColumns, bodies: list[bytes]
                    ) -> tuple[dict[str, pa.Array], list[str | None], list[str | None]]:
        import pyarrow.json as pj

        schema = pa.schema(self.data_fields)
        n = len(bodies)
        if all(b and b"\n" not in b for b in bodies):
            try:
                table = pj.read_json(pa.BufferReader(b"\n".join(bodies)), parse_options=pj.ParseOptions(
                    explicit_schema=schema, unexpected_field_behavior="ignore"))
                if table.num_rows == n:
                    parsed = {f.name: table.column(f.name).combine_chunks() for f in self.data_fields}
                    return parsed, [None] * n, [None] * n
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                pass  # a malformed body somewhere in the batch: go row by row
        rows: list[dict[str, Any]] = []
        corrupt: list[str | None] = []
        reasons: list[str | None] = []
        for seq_num, raw, body in zip(records.seq_nums, records.bodies, bodies, strict=True):
            try:
                value = json.loads(body)
                if not isinstance(value, dict):
                    raise ValueError("not a JSON object")
                table = pa.Table.from_pylist([value], schema=schema)  # type check per field
                rows.append(table.to_pylist()[0])
                corrupt.append(None)
                reasons.append(None)
            except (ValueError, pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as error:
                if self.failfast:
                    raise SluiceError(f"record {seq_num} of stream '{stream}' is not a JSON object of the "
                                      f"schema ({error}); mode=FAILFAST. Use mode=PERMISSIVE to keep it in "
                                      f"{CORRUPT} instead.") from None
                rows.append({})
                corrupt.append(raw.decode("utf-8", "replace"))
                reasons.append(str(error))
        table = pa.Table.from_pylist(rows, schema=schema)
        return {f.name: table.column(f.name).combine_chunks() for f in self.data_fields}, corrupt, reasons

    def _materialize(self, records: RecordColumns) -> RecordColumns:
        """Latest record per @key in stream order; keys whose latest change is a delete are dropped."""
        latest: dict[bytes, int] = {}
        for i, headers in enumerate(records.header_dicts()):
            key = headers.get(b"@key")
            if key is None:
                continue
            latest.pop(key, None)  # re-insert: dict order = order of each key's last change
            if headers.get(b"@action") != b"d":
                latest[key] = i
        return records.take(list(latest.values()))
