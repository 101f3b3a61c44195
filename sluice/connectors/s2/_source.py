"""Reading S2 streams: `spark.read.format("s2")` / `readStream`, and `format("s2_upsert")` changelogs.

A split is one stream; positions are seq nums. The enumerator lists streams (`s2.streams`, or every
stream under `s2.discovery-prefix`, re-listed every `s2.discovery-interval-ms`) and resolves start/end
positions; readers open one SDK read session per partition (a stream, or a seq-num range of one).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from itertools import accumulate
from typing import Any

import numpy as np
import pyarrow as pa

from sluice.connector import (
    DataLossError,
    Option,
    OptionError,
    Options,
    OptionSpec,
    SluiceError,
    Split,
    SplitEnumerator,
    SplitReader,
)
from sluice.connectors.s2._commits import committed_end
from sluice.connectors.s2._kinds import RecordKind
from sluice.connectors.s2._options import CONNECTION_OPTIONS, Connection, explain_sdk_error
from sluice.connectors.s2._records import RecordColumns, protobuf_records

log = logging.getLogger("sluice.s2")

META_COLUMNS = ("stream", "seq_num", "timestamp", "headers", "body")
DEFAULT_SCHEMA = ("stream string, seq_num long, timestamp timestamp, "
                  "headers array<struct<name: binary, value: binary>>, body binary")
CORRUPT = "_corrupt_record"
ARROW_BATCH_RECORDS = 4096  # records per Arrow batch handed to Spark

SOURCE_OPTIONS = (
    Option("s2.streams", "list", (), "Streams to read (comma-separated); or use s2.discovery-prefix."),
    Option("s2.discovery-prefix", "str", None, "Read every stream whose name starts with this (new ones too)."),
    Option("s2.discovery-interval-ms", "int", 10_000, "How often streaming reads look for new streams.", minimum=0),
    Option("s2.start", "str", "earliest",
           "earliest (first available record), latest (the tail), a seq num, or a timestamp (ISO 8601 or "
           "timestamp:<epoch ms>)."),
    Option("s2.end", "str", "latest", "Batch reads: where to stop (exclusive): latest, a seq num or a timestamp."),
    Option("s2.read-committed", "bool", True,
           "Read an exactly-once writer's streams up to the last micro-batch it committed, never part of one "
           "(false: up to the tail, a micro-batch still being appended included)."),
    Option("failOnDataLoss", "bool", True,
           "Fail when records to read were trimmed or the stream deleted (false: warn and skip ahead)."),
    Option("max-records-per-trigger", "int", None, "Streaming: most records per micro-batch.", minimum=1),
    Option("max-bytes-per-trigger", "int", None, "Streaming: most metered bytes per micro-batch.", minimum=1),
    Option("s2.max-records-per-partition", "int", 500_000,
           "Cut a stream into partitions of at most this many records, read in parallel (0: never).", minimum=0),
    Option("format", "choice", "binary",
           "binary: the raw record (body as bytes); json: parse bodies into the columns of the given schema.",
           choices=("binary", "json")),
    Option("mode", "choice", "PERMISSIVE",
           "format=json: PERMISSIVE (bad bodies give nulls and _corrupt_record) or FAILFAST (fail).",
           choices=("PERMISSIVE", "FAILFAST")),
)


def _check_streams(opts: Options) -> None:
    if bool(opts["s2.streams"]) == bool(opts["s2.discovery-prefix"]):
        raise OptionError("set exactly one of s2.streams (a list) or s2.discovery-prefix")


READ_SPEC = OptionSpec("s2", (*CONNECTION_OPTIONS, *SOURCE_OPTIONS), (_check_streams,))
UPSERT_READ_SPEC = OptionSpec("s2_upsert", (
    *CONNECTION_OPTIONS, *SOURCE_OPTIONS,
    Option("primary-key", "list", (), "Key columns: parsed from the @key header.", required=True),
), (_check_streams,))


def parse_position(text: str, option: str) -> tuple[str, int | None]:
    """('earliest'|'latest', None), ('seq', n) or ('timestamp', epoch ms)."""
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return value.lower(), None
    if value.isdigit():
        return "seq", int(value)
    if value.lower().startswith("timestamp:") and value[10:].strip().isdigit():
        return "timestamp", int(value[10:])
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(f"{option}={text!r}: use earliest, latest, a seq num, timestamp:<epoch ms> or an ISO 8601 "
                          "timestamp") from None
    if moment.tzinfo is None:
        raise OptionError(f"{option}={text!r}: give the timestamp a time zone, e.g. {value}Z")
    return "timestamp", int(moment.timestamp() * 1000)


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


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


class S2Enumerator(SplitEnumerator):
    def __init__(self, conn: Connection, opts: Options, batch: bool) -> None:
        self.conn = conn
        self.streams = tuple(opts["s2.streams"])
        self.prefix = opts["s2.discovery-prefix"]
        self.interval = opts["s2.discovery-interval-ms"] / 1000.0
        self.start = parse_position(opts["s2.start"], "s2.start")
        self.end = parse_position(opts["s2.end"], "s2.end") if batch else ("latest", None)
        if self.end[0] == "earliest":
            raise OptionError("s2.end=earliest would read nothing; use latest, a seq num or a timestamp")
        if self.start[0] == self.end[0] and self.start[0] in ("seq", "timestamp") and self.start[1] > self.end[1]:
            # Refused as given, before positions are clamped to a stream's tail (which could hide it).
            raise OptionError(f"s2.start={opts['s2.start']} is after s2.end={opts['s2.end']}: the read would return "
                              "nothing. Swap them, or check which one you meant.")
        self.read_committed = opts["s2.read-committed"]
        self._listed: list[Split] = []
        self._listed_at = float("-inf")

    def discover(self) -> list[Split]:
        if self.streams:
            return [Split(s) for s in self.streams]
        if time.monotonic() - self._listed_at >= self.interval:
            async def listing() -> list[str]:
                import s2_sdk

                async with self.conn.client() as client:
                    try:
                        return [s.name async for s in
                                client.basin(self.conn.basin).list_all_streams(prefix=self.prefix)]
                    except s2_sdk.S2Error as error:
                        raise explain_sdk_error(error, self.conn.basin, None, "list-streams", self.conn) \
                            or error from None

            self._listed = [Split(name) for name in sorted(_run(listing()))]
            self._listed_at = time.monotonic()
        return self._listed

    def _resolve(self, splits: Sequence[Split], *wheres: tuple[str, int | None],
                 floors: Mapping[str, int] | None = None) -> dict[str, list[int]]:
        """Seq num of each of `wheres` in every split: one client (each costs an SSL context), one tail check per
        stream, streams asked concurrently. With s2.read-committed, "latest" is the committed end (_commits.py)
        above each split's floor: `floors`, or the first of `wheres`."""
        import s2_sdk

        async def resolve(basin: Any, split: Split) -> list[int]:
            try:
                floor = None if floors is None else floors.get(split.split_id)
                return await positions(self.conn.stream(basin, split.split_id), floor)
            except s2_sdk.S2Error as error:
                raise explain_sdk_error(error, self.conn.basin, split.split_id, "check-tail or read", self.conn) \
                    or error from None

        async def positions(stream: Any, floor: int | None) -> list[int]:
            tail = (await stream.check_tail()).seq_num
            out: list[int] = []
            for kind, value in wheres:
                if kind == "latest" and self.read_committed and (floor is not None or out):
                    out.append(await committed_end(stream, tail, out[0] if floor is None else floor))
                elif kind == "latest":
                    out.append(tail)
                elif kind == "seq":
                    out.append(min(value, tail))
                elif kind == "earliest" and tail == 0:
                    out.append(0)  # nothing was ever written: reading would only get S2's 416
                else:
                    start = s2_sdk.SeqNum(0) if kind == "earliest" else s2_sdk.Timestamp(value)
                    try:
                        batch = await stream.read(start=start, limit=s2_sdk.ReadLimit(count=1))
                    except s2_sdk.ReadUnwrittenError as at_tail:
                        # S2 answers 416 when the start resolves to the tail: every record trimmed, or a
                        # timestamp after the last record's. Reading from there means reading new records
                        # (never past the tail this plan saw, so a batch read's start stays <= its end).
                        out.append(min(at_tail.tail.seq_num, tail))
                        continue
                    out.append(batch.records[0].seq_num if batch.records else tail)
            return out

        async def resolve_all() -> list[list[int]]:
            async with self.conn.client() as client:
                basin = client.basin(self.conn.basin)
                return await asyncio.gather(*(resolve(basin, split) for split in splits))

        if not splits:
            return {}
        return dict(zip([s.split_id for s in splits], _run(resolve_all()), strict=True))

    def start_position(self, split: Split) -> int:
        return self.start_positions([split])[split.split_id]

    def end_position(self, split: Split) -> int:
        return self.end_positions([split])[split.split_id]

    def start_positions(self, splits: Sequence[Split]) -> dict[str, int]:
        return {sid: found[0] for sid, found in self._resolve(splits, self.start).items()}

    def end_positions(self, splits: Sequence[Split], starts: Mapping[str, int] | None = None) -> dict[str, int]:
        return {sid: found[0] for sid, found in self._resolve(splits, self.end, floors=starts).items()}

    def bounds(self, splits: Sequence[Split]) -> dict[str, tuple[int, int]]:
        found = self._resolve(splits, self.start, self.end)
        backwards = sorted(f"{sid} ({start} > {end})" for sid, (start, end) in found.items() if start > end)
        if backwards:  # a read that could only ever be empty is a mistake in the options, not an empty result
            raise OptionError(f"s2.start is after s2.end on stream(s) {', '.join(backwards)} (seq nums): the read "
                              "would return nothing. Check s2.start and s2.end.")
        return {sid: (start, end) for sid, (start, end) in found.items()}

    def bytes_end(self, split: Split, start: int, end: int, max_bytes: int) -> tuple[int, int]:
        import s2_sdk

        async def scan() -> tuple[int, int]:
            position, used = start, 0
            async with self.conn.client() as client:
                stream = self.conn.stream(client.basin(self.conn.basin), split.split_id)
                while position < end and used < max_bytes:
                    try:
                        batch = await stream.read(start=s2_sdk.SeqNum(position),
                                                  limit=s2_sdk.ReadLimit(count=min(1000, end - position)))
                    except s2_sdk.ReadUnwrittenError:  # trimmed up to the tail meanwhile: nothing left to meter
                        break
                    if not batch.records:
                        break
                    for record in batch.records:
                        size = s2_sdk.metered_bytes([record])
                        if used + size > max_bytes and position > start:
                            return position, used
                        used += size
                        position = record.seq_num + 1
                        if position >= end:
                            break
            return min(position, end), used

        return _run(scan())


class S2Reader(SplitReader):
    """Reads seq nums [start, end) of a stream with one read session; yields Arrow batches of the schema."""

    def __init__(self, conn: Connection, schema: Any, opts: Options, kind: RecordKind = RecordKind.APPEND, *,
                 materialize: bool = False) -> None:
        """`materialize` (upserts, batch reads): the latest row per @key of each stream, without deleted keys."""
        from sluice.spark._compat import to_arrow_schema

        self.conn = conn
        self.kind = kind
        self.materialize = materialize
        self.fail_on_data_loss = opts["failOnDataLoss"]
        self.json = opts["format"] == "json" or kind is RecordKind.UPSERT
        self.failfast = opts["mode"] == "FAILFAST"
        self.arrow_schema = to_arrow_schema(schema)
        self.key_columns = tuple(opts["primary-key"]) if kind is RecordKind.UPSERT else ()
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
                    yield self._to_arrow(split.split_id, pending)
                    pending = RecordColumns.empty()
            if self.materialize:
                pending = self._materialize(pending)
            if len(pending):
                yield self._to_arrow(split.split_id, pending)
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
    def _to_arrow(self, stream: str, records: RecordColumns) -> pa.RecordBatch:
        n = len(records)
        columns: dict[str, pa.Array] = {}
        names = self.arrow_schema.names
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
        if self.json:
            columns.update(self._parse(stream, records))
        return pa.RecordBatch.from_arrays([columns[name].cast(self.arrow_schema.field(name).type)
                                           for name in names], schema=self.arrow_schema)

    def _parse(self, stream: str, records: RecordColumns) -> dict[str, pa.Array]:
        """The JSON columns: from the body (format=json) or from @key and the body (upsert)."""
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
            parsed, corrupt = self._parse_json(stream, records, merged)
            if "_op" in names:
                parsed["_op"] = pa.array(ops, pa.string())
        else:
            parsed, corrupt = self._parse_json(stream, records, records.bodies)
        if CORRUPT in names:
            parsed[CORRUPT] = pa.array(corrupt, pa.string())
        return parsed

    def _parse_json(self, stream: str, records: RecordColumns, bodies: list[bytes]
                    ) -> tuple[dict[str, pa.Array], list[str | None]]:
        import pyarrow.json as pj

        schema = pa.schema(self.data_fields)
        n = len(bodies)
        if all(b and b"\n" not in b for b in bodies):
            try:
                table = pj.read_json(pa.BufferReader(b"\n".join(bodies)), parse_options=pj.ParseOptions(
                    explicit_schema=schema, unexpected_field_behavior="ignore"))
                if table.num_rows == n:
                    return {f.name: table.column(f.name).combine_chunks() for f in self.data_fields}, [None] * n
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                pass  # a malformed body somewhere in the batch: go row by row
        rows: list[dict[str, Any]] = []
        corrupt: list[str | None] = []
        for seq_num, raw, body in zip(records.seq_nums, records.bodies, bodies, strict=True):
            try:
                value = json.loads(body)
                if not isinstance(value, dict):
                    raise ValueError("not a JSON object")
                table = pa.Table.from_pylist([value], schema=schema)  # type check per field
                rows.append(table.to_pylist()[0])
                corrupt.append(None)
            except (ValueError, pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as error:
                if self.failfast:
                    raise SluiceError(f"record {seq_num} of stream '{stream}' is not a JSON object of the "
                                      f"schema ({error}); mode=FAILFAST. Use mode=PERMISSIVE to keep it in "
                                      f"{CORRUPT} instead.") from None
                rows.append({})
                corrupt.append(raw.decode("utf-8", "replace"))
        table = pa.Table.from_pylist(rows, schema=schema)
        return {f.name: table.column(f.name).combine_chunks() for f in self.data_fields}, corrupt

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
