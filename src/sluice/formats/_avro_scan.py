"""Walk Avro bodies in bulk, without building values, to check that each body is exactly one record of the writer
schema (Avro's specification, "Binary Encoding"): every varint ends within 10 bytes, lengths are not negative,
union branches and enum indexes exist, and the record ends at the body's last byte.

Why: the bulk reader decodes a block of bodies as one stream and trusts the block's record count; a body with a
trailing byte or a short one shifts every record after it, and a block whose records end before its bytes do sends
arrow-avro (datafusion 55) into a loop that never returns. Checked here first, a bad body is named by its index
with Avro's reason, and the block handed on is one the reader parses. One pass of numpy per field, all bodies at
once: record i's position is pos[i]."""

from __future__ import annotations

import numpy as np

from sluice.formats._avro_schema import AvroType

_PAD = 16


class _Scan:
    def __init__(self, data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.data = np.concatenate([data, np.zeros(_PAD, np.uint8)])
        self.limit = len(data)
        self.ends = ends
        self.pos = starts.astype(np.int64).copy()
        self.reason: dict[int, str] = {}
        self.failed = np.zeros(len(starts), dtype=bool)

    def fail(self, rows: np.ndarray, mask: np.ndarray, reason: str) -> None:
        for r in rows[mask & ~self.failed[rows]]:
            self.reason[int(r)] = reason
        self.failed[rows[mask]] = True

    def _bound(self, rows: np.ndarray, what: str) -> None:
        over = self.pos[rows] > self.ends[rows]
        if over.any():
            self.fail(rows, over, f"the body ends inside {what} (EOF)")
            self.pos[rows[over]] = self.ends[rows[over]]

    def varint(self, rows: np.ndarray, what: str) -> np.ndarray:
        """Zigzag-decoded longs at each row's position; the positions move past them. Byte by byte over the rows
        whose varint goes on: most varints are one or two bytes, so this touches little more than those bytes."""
        pos = self.pos[rows]
        z = np.zeros(len(rows), dtype=np.uint64)
        going = np.arange(len(rows))
        for k in range(10):
            byte = self.data[np.minimum(pos[going], self.limit)]
            z[going] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            pos[going] += 1
            going = going[byte >= 0x80]
            if not len(going):
                break
        else:
            unterminated = np.zeros(len(rows), dtype=bool)
            unterminated[going] = True
            self.fail(rows, unterminated, f"a varint of {what} runs past 10 bytes (bad varint)")
        self.pos[rows] = pos
        self._bound(rows, what)
        value = (z >> np.uint64(1)).astype(np.int64) ^ -(z & np.uint64(1)).astype(np.int64)
        return np.where(self.failed[rows], 0, value)

    def skip(self, rows: np.ndarray, nbytes: np.ndarray | int, what: str) -> None:
        self.pos[rows] += nbytes
        self._bound(rows, what)

    def walk(self, t: AvroType, rows: np.ndarray, what: str) -> None:
        rows = rows[~self.failed[rows]]
        if not len(rows):
            return
        k = t.kind
        if k == "null":
            return
        if k == "boolean":
            self.skip(rows, 1, what)
        elif k in ("int", "long"):
            self.varint(rows, what)
        elif k == "enum":
            idx = self.varint(rows, what)
            out = (idx < 0) | (idx >= len(t.symbols))
            if out.any():
                self.fail(rows, out, f"enum index {int(idx[out][0])} of {what} is not one of {len(t.symbols)} symbols")
        elif k == "float":
            self.skip(rows, 4, what)
        elif k == "double":
            self.skip(rows, 8, what)
        elif k == "fixed":
            self.skip(rows, t.size, what)
        elif k in ("bytes", "string"):
            n = self.varint(rows, f"the length of {what}")
            neg = n < 0
            if neg.any():
                self.fail(rows, neg, f"negative length {int(n[neg][0])} of {what}")
            self.skip(rows, np.maximum(n, 0), what)
        elif k == "record":
            for f in t.fields:
                self.walk(f.type, rows, f"field {f.name!r}")
        elif k == "union":
            b = self.varint(rows, f"the union branch of {what}")
            out = (b < 0) | (b >= len(t.branches))
            if out.any():
                self.fail(rows, out, f"union branch {int(b[out][0])} of {what} is not one of {len(t.branches)}")
            for i, branch in enumerate(t.branches):
                self.walk(branch, rows[b == i], what)
        elif k in ("array", "map"):
            self._blocks(t, rows, what)
        else:
            raise AssertionError(k)

    def _blocks(self, t: AvroType, rows: np.ndarray, what: str) -> None:
        assert t.items is not None
        while len(rows):
            count = self.varint(rows, f"the block count of {what}")
            sized = count < 0
            if sized.any():  # a negative count is followed by the block's byte size: skip it whole
                size = self.varint(rows[sized], f"the block size of {what}")
                bad = size < 0
                if bad.any():
                    self.fail(rows[sized], bad, f"negative block size of {what}")
                self.skip(rows[sized], np.maximum(size, 0), what)
            left = np.where(sized | self.failed[rows], 0, count)
            # a count past what the rest of the body can hold is refused at once, so a corrupt count costs no loop
            # of that many rounds (nor the reader's: items of no bytes, arrays of null, count as one byte each;
            # arrow-avro reads no arrays of null anyway). Items of one width are skipped together.
            least, width = _min_size(t.items) + (1 if t.kind == "map" else 0), _width(t.items)
            room = self.ends[rows] - self.pos[rows]
            over = (left > 0) & (left * max(least, 1) > room)
            if over.any():
                self.fail(rows, over, f"a block count of {what} larger than the rest of the body")
                left = np.where(over, 0, left)
            if t.kind == "array" and width is not None:
                self.skip(rows, left * width, what)
                left = np.zeros_like(left)
            items = rows
            while True:
                live = left > 0
                if not live.any():
                    break
                items, left = items[live], left[live] - 1
                if t.kind == "map":
                    self.walk(AvroType("string"), items, f"a key of {what}")
                self.walk(t.items, items, f"an item of {what}")
                left = np.where(self.failed[items], 0, left)
            rows = rows[(count != 0) & ~self.failed[rows]]


def _min_size(t: AvroType) -> int:
    """The fewest bytes a value of `t` takes."""
    if t.kind == "null":
        return 0
    if t.kind in ("float", "double", "fixed"):
        return {"float": 4, "double": 8}.get(t.kind, t.size)
    if t.kind == "record":
        return sum(_min_size(f.type) for f in t.fields)
    return 1


def _width(t: AvroType) -> int | None:
    """The one size every value of `t` takes, None when values vary."""
    if t.kind in ("null", "boolean", "float", "double", "fixed"):
        return {"null": 0, "boolean": 1, "float": 4, "double": 8}.get(t.kind, t.size)
    if t.kind == "record":
        widths = [_width(f.type) for f in t.fields]
        return None if any(w is None for w in widths) else sum(w for w in widths if w is not None)
    return None


def first_bad(schema: AvroType, data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[int, str] | None:
    """(index, reason) of the first body that is not exactly one record of `schema`, or None when all are."""
    s = _Scan(data, starts, ends)
    s.walk(schema, np.arange(len(starts)), "the record")
    short = ~s.failed & (s.pos < ends)
    if short.any():
        s.fail(np.arange(len(starts)), short, "the record ends before the body does (trailing bytes)")
    if not s.failed.any():
        return None
    i = int(np.flatnonzero(s.failed)[0])
    return i, s.reason[i]
