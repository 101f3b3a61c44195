"""Decoding of pgoutput's logical decoding messages (`pg_logical_emit_message`, pgoutput option `messages`,
PostgreSQL 14+) into Arrow: the rows of format("postgres_changes") with option 'messages.prefix'.

A Message ('M'), protocol version 1: Int8 flags (1: transactional), Int64 LSN (the end of the message's WAL record),
String prefix (NUL-terminated), Int32 length, the content. A transactional message comes inside its transaction's
BEGIN ... COMMIT when the transaction commits (never when it rolls back); a non-transactional one comes on its own,
where the server decodes its WAL record. Parsed with numpy over a chunk's messages at once, as _pgoutput.py parses
changes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connectors.postgres._client import PostgresError
from sluice.connectors.postgres._pgoutput import (
    _PG_EPOCH_US,
    COMMIT_TIME,
    LSN,
    XID,
    _be,
    format_lsn,
    message_bytes,
)

PREFIX, CONTENT, TRANSACTIONAL, MESSAGE_LSN = "prefix", "content", "transactional", "message_lsn"
MESSAGE_FIELDS = (
    pa.field(PREFIX, pa.string(), False), pa.field(CONTENT, pa.binary(), False),
    pa.field(TRANSACTIONAL, pa.bool_(), False), pa.field(MESSAGE_LSN, pa.int64(), False),
    pa.field(LSN, pa.int64(), False), pa.field(COMMIT_TIME, pa.timestamp("us", tz="UTC")), pa.field(XID, pa.int64()),
)
MESSAGES_SCHEMA = pa.schema(MESSAGE_FIELDS)

_B, _M = 0x42, 0x4D
_TABLE_MESSAGES = (0x52, 0x49, 0x55, 0x44, 0x54)  # Relation, Insert, Update, Delete, Truncate


def _slices(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, kind: pa.DataType) -> pa.Array:
    """An Arrow string or binary array of the byte ranges (start, length) of `data`."""
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    values = data[np.repeat(starts - offsets[:-1], lengths) + np.arange(total)] if total else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(kind, len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(values)])


class MessageDecoder:
    """Turns pgoutput messages into record batches of MESSAGES_SCHEMA: the messages whose prefix is one of `prefixes`
    (compared exactly). Transactional ones of the transactions whose commit LSN is in [start, end), in commit order
    (`_lsn`, `_commit_time`, `_xid`: their transaction's); non-transactional ones as the server sends them (`_lsn`:
    their own LSN; the server sends those whose WAL record starts at or after the slot's position, so the peek
    must start from a slot at `start`)."""

    def __init__(self, prefixes: Sequence[str], start: int, end: int, publication: str) -> None:
        self.prefixes = pa.array(list(prefixes), pa.string())
        self.start, self.end = start, end
        self.publication = publication
        self.txn: tuple[int, int, int] = (-1, 0, 0)  # commit LSN, commit time (Unix us), xid

    def feed(self, messages: pa.Array) -> Iterator[pa.RecordBatch]:
        """Decode a chunk of messages (an Arrow binary array); yields at most one record batch."""
        if len(messages) == 0:
            return
        messages, data, offsets = message_bytes(messages)
        starts = offsets[:-1]
        kinds = data[starts]
        if np.isin(kinds, _TABLE_MESSAGES).any():
            raise PostgresError(
                f"publication '{self.publication}' publishes a table now (a change of it came, in the transaction "
                f"committed at LSN {format_lsn(max(self.txn[0], 0))} or later): a stream of messages "
                "(messages.prefix) reads a publication without tables. Remove the table from the publication, or "
                "stream its changes with a query of their own")
        n = len(starts)
        is_begin = kinds == _B
        begins = np.flatnonzero(is_begin)
        txn_of = np.maximum.accumulate(np.where(is_begin, np.arange(n), -1))
        lsn, ts, xid = np.full(n, self.txn[0], np.int64), np.full(n, self.txn[1], np.int64), \
            np.full(n, self.txn[2], np.int64)
        if len(begins):
            b_lsn, b_ts = _be(data, starts[begins] + 1, 8), _be(data, starts[begins] + 9, 8) + _PG_EPOCH_US
            b_xid = _be(data, starts[begins] + 17, 4) & 0xFFFFFFFF  # xids are unsigned 32-bit
            inside = txn_of >= 0
            rank = np.searchsorted(begins, txn_of[inside])
            lsn[inside], ts[inside], xid[inside] = b_lsn[rank], b_ts[rank], b_xid[rank]
            self.txn = (int(b_lsn[-1]), int(b_ts[-1]), int(b_xid[-1]))
        rows = np.flatnonzero(kinds == _M)
        if not len(rows):
            return
        at = starts[rows]
        transactional = (data[at + 1] & 1) == 1
        own = _be(data, at + 2, 8)
        # A non-transactional message the server sends lies after the slot's position; one that ends at or before
        # `start` was read by the batch before (a slot behind `start` would send it again).
        in_range = np.where(transactional, (lsn[rows] >= self.start) & (lsn[rows] < self.end), own > self.start)
        prefix_at = at + 10
        # A prefix ends at the first NUL after its start (a C string): found among the NULs of these messages' bytes.
        low, high = int(prefix_at[0]), int(offsets[rows[-1] + 1])
        nuls = np.flatnonzero(data[low:high] == 0) + low
        prefix_end = nuls[np.searchsorted(nuls, prefix_at)]
        prefix = _slices(data, prefix_at, prefix_end - prefix_at, pa.string())
        content = _slices(data, prefix_end + 5, _be(data, prefix_end + 1, 4), pa.binary())
        wanted = pc.and_(pc.is_in(prefix, value_set=self.prefixes), pa.array(in_range))
        if not pc.any(wanted).as_py():
            return
        commit_time = pa.array(np.where(transactional, ts[rows], 0), pa.int64(), mask=~transactional)
        batch = pa.RecordBatch.from_arrays([
            prefix, content, pa.array(transactional), pa.array(own, pa.int64()),
            pa.array(np.where(transactional, lsn[rows], own), pa.int64()),
            commit_time.cast(pa.timestamp("us", tz="UTC")),
            pa.array(np.where(transactional, xid[rows], 0), pa.int64(), mask=~transactional)], schema=MESSAGES_SCHEMA)
        yield batch.filter(wanted)
