"""One append checked against a stream's working state (fencing token, match_seq_num, limits, timestamps, command
records), turned into the rows to store and the AppendAck to send: no I/O, no state of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.s2local import _proto as pb
from sluice.s2local._config import MAX_BATCH_RECORDS, MAX_FENCING_TOKEN_BYTES, MIB, now_ms
from sluice.s2local._errors import S2Error, fencing_token_mismatch, seq_num_mismatch
from sluice.s2local._resources import Stream
from sluice.s2local._wire import append_ack, read_varint, split_append_records, varint


@dataclass
class Work:
    """Working copy of a stream's state while a group of appends is validated."""

    next_seq: int
    last_ts: int
    fencing_token: str
    trim_point: int


def prepare(stream: Stream, state: Work, append_input: Any, raw: bytes | None) -> tuple[list[Any], bytes, Work]:
    """The rows to store, the AppendAck and the stream's state after `append_input`; S2Error when S2 refuses it."""
    records = append_input.records
    count = len(records)
    if not 1 <= count <= MAX_BATCH_RECORDS:
        raise S2Error("invalid", f"a batch holds 1 to {MAX_BATCH_RECORDS} records, got {count}")
    if append_input.HasField("fencing_token") and \
            len(append_input.fencing_token.encode()) > MAX_FENCING_TOKEN_BYTES:
        raise S2Error("invalid", f"fencing_token is at most {MAX_FENCING_TOKEN_BYTES} bytes")
    if append_input.HasField("fencing_token") and append_input.fencing_token != state.fencing_token:
        raise fencing_token_mismatch(state.fencing_token)
    if append_input.HasField("match_seq_num") and append_input.match_seq_num != state.next_seq:
        raise seq_num_mismatch(state.next_seq)
    timestamping = stream.config.get("timestamping") or {}
    mode = timestamping.get("mode") or "client-prefer"
    uncapped = bool(timestamping.get("uncapped"))
    arrival = now_ms()
    seq, last_ts, token, trim = state.next_seq, state.last_ts, state.fencing_token, state.trim_point
    parts = split_append_records(raw) if raw is not None else [r.SerializeToString() for r in records]
    rows = []
    total = 0
    first_ts = None
    ts_bytes: tuple[int, bytes] = (-1, b"")
    sid = stream.id
    for index, part in enumerate(parts):
        if not part or part[0] == 0x1A:
            # Fast path, the common case: a body and nothing else. Its bytes are re-tagged into a
            # SequencedRecord (body is field 3 in AppendRecord, field 4 in SequencedRecord).
            body_len = len(part) - 2  # tag byte + a one-byte length, unless the body is 128 bytes or more
            if body_len >= 0x80:
                body_len = read_varint(part, 1)[0]
            metered = 8 + max(body_len, 0)
            if mode == "client-require":
                raise S2Error("invalid", "this stream's timestamping mode is client-require: every record "
                                         "needs a timestamp")
            ts = max(arrival, last_ts)
            if ts != ts_bytes[0]:
                ts_bytes = (ts, varint(ts))
            blob = b"\x08" + varint(seq) + b"\x10" + ts_bytes[1] + (b"\x22" + part[1:] if part else b"")
        else:
            record = records[index]
            metered, ts, token, trim = _slow_record(record, mode, uncapped, arrival, last_ts, token, trim)
            ts = max(ts, last_ts)
            blob = pb.SequencedRecord(seq_num=seq, timestamp=ts, headers=record.headers,
                                      body=record.body).SerializeToString()
        if metered > MIB:
            raise S2Error("invalid", f"record {index} of the batch is {metered} metered bytes; the limit is {MIB}")
        total += metered
        last_ts = ts  # monotonic per stream: every path above takes max(ts, last_ts)
        if first_ts is None:
            first_ts = ts
        rows.append((sid, seq, ts, metered, b"\x0a" + varint(len(blob)) + blob))
        seq += 1
    if total > MIB:
        raise S2Error("invalid", f"the batch is {total} metered bytes; the limit is {MIB}")
    trim = min(trim, seq)
    assert first_ts is not None
    ack = append_ack((state.next_seq, first_ts), (seq, last_ts), (seq, last_ts))
    return rows, ack, Work(seq, last_ts, token, trim)

def _slow_record(record: Any, mode: str, uncapped: bool, arrival: int, last_ts: int, token: str, trim: int
                 ) -> tuple[int, int, str, int]:
    """Metered size, timestamp and command effects of a record with headers or a client timestamp."""
    headers = record.headers
    metered = 8 + 2 * len(headers) + len(record.body)
    command = None
    for header in headers:
        metered += len(header.name) + len(header.value)
        if not header.name:
            command = header.value
    if command is not None:
        if len(headers) != 1:
            raise S2Error("invalid", "a command record has exactly one header, whose name is empty")
        if command == b"fence":
            if len(record.body) > MAX_FENCING_TOKEN_BYTES:
                raise S2Error("invalid", f"fencing token longer than {MAX_FENCING_TOKEN_BYTES} bytes")
            try:
                token = record.body.decode()
            except UnicodeDecodeError:
                raise S2Error("invalid", "fencing token must be UTF-8") from None
        elif command == b"trim":
            if len(record.body) != 8:
                raise S2Error("invalid", "a trim command's body is an 8-byte big-endian seq num")
            trim = max(trim, int.from_bytes(record.body, "big"))
        else:
            raise S2Error("invalid", f"unknown command record {command!r}")
    if mode == "arrival":
        ts = arrival
    elif record.HasField("timestamp"):
        ts = record.timestamp if uncapped else min(record.timestamp, arrival)
    elif mode == "client-require":
        raise S2Error("invalid", "this stream's timestamping mode is client-require: every record needs a "
                                 "timestamp")
    else:
        ts = arrival
    return metered, max(ts, last_ts), token, trim
