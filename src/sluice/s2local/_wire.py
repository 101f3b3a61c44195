"""Protobuf and s2s framing helpers for the hot paths (reads are concatenations of stored bytes)."""

from __future__ import annotations

import gzip
import struct
from typing import Any

import zstandard

from sluice.s2local._errors import S2Error

TERMINAL = 0x80
COMPRESSION_MASK = 0x60
CODECS = {"zstd": 1, "gzip": 2}
MAX_FRAME_BYTES = 2 * 1024 * 1024 + 1024  # a full 1 MiB batch plus framing, with room for protobuf overhead

_zstd_c = zstandard.ZstdCompressor()
_zstd_d = zstandard.ZstdDecompressor()


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def varint(value: int) -> bytes:
    # Fast paths: seq nums, lengths and tags of the append/read paths mostly fit in 1-3 bytes.
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise S2Error("bad_proto", "truncated varint in AppendInput")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise S2Error("bad_proto", "varint too long in AppendInput")


def split_append_records(raw: bytes) -> list[bytes]:
    """The encoded AppendRecord of every record in an encoded AppendInput (field 1), in order.

    Lets the append path re-tag a body-only record's bytes instead of building a protobuf object per
    record; the caller has already parsed `raw` with protobuf, so it is well-formed.
    """
    out = []
    pos, end = 0, len(raw)
    while pos < end:
        tag = raw[pos]
        if tag == 0x0A:  # field 1 (records), length-delimited: the hot case, with an inlined 1-2 byte length
            length = raw[pos + 1]
            if length < 0x80:
                pos += 2
            elif raw[pos + 2] < 0x80:
                length = (length & 0x7F) | (raw[pos + 2] << 7)
                pos += 3
            else:
                length, pos = read_varint(raw, pos + 1)
            out.append(raw[pos:pos + length])
            pos += length
            continue
        tag, pos = read_varint(raw, pos)
        wire = tag & 7
        if wire == 2:
            length, pos = read_varint(raw, pos)
            pos += length
        elif wire == 0:
            _, pos = read_varint(raw, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise S2Error("bad_proto", f"unexpected wire type {wire} in AppendInput")
    return out


def position(seq_num: int, timestamp: int) -> bytes:
    """An encoded StreamPosition message."""
    return b"\x08" + varint(seq_num) + b"\x10" + varint(timestamp)


def read_batch(framed_records: list[bytes], tail: tuple[int, int] | None) -> bytes:
    """ReadBatch: stored records are already framed as field 1; the tail is field 2."""
    body = b"".join(framed_records)
    if tail is not None:
        pos = position(*tail)
        body += b"\x12" + varint(len(pos)) + pos
    return body


def append_ack(start: tuple[int, int], end: tuple[int, int], tail: tuple[int, int]) -> bytes:
    out = b""
    for tag, pos in ((b"\x0a", start), (b"\x12", end), (b"\x1a", tail)):
        encoded = position(*pos)
        out += tag + varint(len(encoded)) + encoded
    return out


def compress(body: bytes, codec: str) -> bytes:
    return _zstd_c.compress(body) if codec == "zstd" else gzip.compress(body)


def decompress(body: bytes, code: int) -> bytes:
    try:
        if code == 1:
            return _zstd_d.decompress(body, max_output_size=MAX_FRAME_BYTES)
        if code == 2:
            return gzip.decompress(body)
    except Exception as error:
        raise S2Error("bad_frame", f"cannot decompress frame: {error}") from None
    raise S2Error("bad_frame", f"unknown compression code {code}")


def frame(body: bytes, codec: str | None = None, terminal: bool = False) -> bytes:
    flag = TERMINAL if terminal else 0
    if codec and len(body) >= 1024 and not terminal:
        body = compress(body, codec)
        flag |= CODECS[codec] << 5
    return struct.pack(">I", len(body) + 1)[1:] + bytes([flag]) + body


def terminal_frame(error: S2Error) -> bytes:
    return frame(struct.pack(">H", error.status) + error.body(), terminal=True)


class FrameReader:
    """Incremental s2s frame parser with a bound on frame size."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf.extend(data)
        out = []
        while len(self._buf) >= 4:
            length = int.from_bytes(self._buf[:3], "big")
            if length < 1 or length > MAX_FRAME_BYTES:
                raise S2Error("bad_frame", f"frame length {length} outside 1..{MAX_FRAME_BYTES}")
            if len(self._buf) < 3 + length:
                break
            flag = self._buf[3]
            body = bytes(self._buf[4:3 + length])
            del self._buf[:3 + length]
            if flag & TERMINAL:
                raise S2Error("bad_frame", "clients may not send terminal frames")
            code = (flag & COMPRESSION_MASK) >> 5
            out.append(decompress(body, code) if code else body)
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


def is_command_record(record: Any) -> bool:
    """A command record (fence, trim): exactly one header, with an empty name."""
    return len(record.headers) == 1 and not record.headers[0].name
