"""Decoding of PostgreSQL's built-in `pgoutput` logical replication messages (protocol version 1) into Arrow.

The messages come from `pg_logical_slot_peek_binary_changes` as one Arrow binary column (ADBC, COPY BINARY).
Parsing a message is the only per-change Python work: each change's text values go into per-column lists,
and every column of a chunk is then typed in one pyarrow cast (ints, floats, numerics, booleans, dates,
timestamps); only arrays and bytea are converted value by value. Values are in PostgreSQL's text output
form with the reading session's DateStyle ISO and TimeZone UTC (set by the reader).

Message layout: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from struct import Struct
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.connectors.postgres._conn import PostgresError

# Metadata columns every change row carries after the table's columns.
OP, LSN, COMMIT_TIME, XID, TABLE = "_op", "_lsn", "_commit_time", "_xid", "_table"
METADATA_FIELDS = (
    pa.field(OP, pa.string()), pa.field(LSN, pa.int64()), pa.field(COMMIT_TIME, pa.timestamp("us", tz="UTC")),
    pa.field(XID, pa.int64()), pa.field(TABLE, pa.string()),
)
METADATA_COLUMNS = tuple(f.name for f in METADATA_FIELDS)

_I32, _I16, _I64 = Struct("!i"), Struct("!h"), Struct("!q")
_BEGIN = Struct("!qqi")  # final (commit) LSN, commit time, xid
_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


@dataclass
class Relation:
    """A Relation message: the table's name and columns as the change messages after it send them."""

    relid: int
    name: str  # schema.table
    columns: list[str]
    replica_identity: str  # d(efault) n(othing) f(ull) i(ndex)


class UnchangedToastError(PostgresError):
    pass


class ChangeDecoder:
    """Turns a stream of pgoutput messages into record batches of `schema` (table columns + METADATA_FIELDS).

    Only transactions whose commit LSN is in [start, end) are emitted; Relation messages are taken from all.
    `column_types` gives each table column's PostgreSQL type (format_type), which decides how its text parses.
    """

    def __init__(self, schema: pa.Schema, column_types: dict[str, str], start: int, end: int,
                 tables: set[str], batch_rows: int = 65_536) -> None:
        self.schema = schema
        self.column_types = column_types
        self.data_names = [f.name for f in schema if f.name not in METADATA_COLUMNS]
        self._index = {name: i for i, name in enumerate(self.data_names)}
        self.start, self.end = start, end
        self.tables = tables
        self.batch_rows = batch_rows
        self.relations: dict[int, Relation] = {}
        self._slots: dict[int, list[int]] = {}  # relid -> schema column index of each relation column
        self._reset()
        self.in_range = False
        self.txn: tuple[int, int, int] = (0, 0, 0)  # commit LSN, commit time (Unix us), xid
        self.changes = 0

    def _reset(self) -> None:
        self._values: list[list[Any]] = [[] for _ in self.data_names]
        self._meta: list[list[Any]] = [[] for _ in METADATA_FIELDS]
        self._rows = 0

    # ------------------------------------------------------------------ messages
    def feed(self, messages: pa.Array) -> Iterator[pa.RecordBatch]:
        """Decode a chunk of messages; yields full batches (call `flush()` at the end for the rest)."""
        for msg in messages.to_pylist():
            kind = msg[0]
            if kind == 0x42:  # B
                lsn, ts, xid = _BEGIN.unpack_from(msg, 1)
                self.in_range = self.start <= lsn < self.end
                self.txn = (lsn, ts + _PG_EPOCH_US, xid)
            elif kind == 0x52:  # R
                self._relation(msg)
            elif not self.in_range:
                continue
            elif kind == 0x49:  # I
                self._row(msg, 5, "insert")  # relid, then 'N'
            elif kind == 0x55:  # U
                self._update(msg)
            elif kind == 0x44:  # D
                self._row(msg, 5, "delete")  # relid, then 'K' or 'O'
            elif kind == 0x54:  # T
                self._truncate(msg)
            else:
                continue  # C, Y (type), O (origin), M (message): nothing to emit
            if self._rows >= self.batch_rows:
                yield self.flush()

    def _relation(self, msg: bytes) -> None:
        relid = _I32.unpack_from(msg, 1)[0]
        pos = 5
        nsp_end = msg.index(b"\0", pos)
        rel_end = msg.index(b"\0", nsp_end + 1)
        name = f"{msg[pos:nsp_end].decode()}.{msg[nsp_end + 1:rel_end].decode()}"
        pos = rel_end + 1
        ident = chr(msg[pos])
        natts = _I16.unpack_from(msg, pos + 1)[0]
        pos += 3
        columns = []
        for _ in range(natts):
            end = msg.index(b"\0", pos + 1)
            columns.append(msg[pos + 1:end].decode())
            pos = end + 1 + 8  # type oid, typmod
        self.relations[relid] = Relation(relid, name, columns, ident)
        if name in self.tables:
            new = [c for c in columns if c not in self._index]
            if new:
                raise PostgresError(
                    f"table {name} has column(s) {new} that the stream's schema does not (ALTER TABLE ... ADD COLUMN "
                    f"in the transaction committed at LSN {format_lsn(self.txn[0])}); restart the query with the same "
                    "checkpoint: it reads the new schema and goes on from where it stopped")
            self._slots[relid] = [self._index[c] for c in columns]

    def _tuple(self, msg: bytes, pos: int, slots: list[int], out: list[Any]) -> tuple[int, list[int]]:
        """Parse TupleData at `pos` into `out` (by schema column); returns (end position, unchanged-TOAST slots)."""
        ncols = _I16.unpack_from(msg, pos)[0]
        pos += 2
        unchanged = []
        for i in range(ncols):
            kind = msg[pos]
            if kind == 0x74:  # t: text
                n = _I32.unpack_from(msg, pos + 1)[0]
                out[slots[i]] = msg[pos + 5:pos + 5 + n]
                pos += 5 + n
            elif kind == 0x6E:  # n: null
                pos += 1
            elif kind == 0x75:  # u: unchanged TOASTed value, not sent
                unchanged.append(slots[i])
                pos += 1
            else:
                raise PostgresError(f"pgoutput sent a tuple value of kind {chr(kind)!r}; sluice reads text values")
        return pos, unchanged

    def _row(self, msg: bytes, pos: int, op: str) -> None:
        relid = _I32.unpack_from(msg, 1)[0]
        slots = self._slots.get(relid)
        if slots is None:
            return  # a table of the publication that this stream does not read
        row: list[Any] = [None] * len(self.data_names)
        self._tuple(msg, pos + 1, slots, row)  # skip the 'N' / 'K' / 'O' marker
        self._emit(row, op, relid)

    def _update(self, msg: bytes) -> None:
        relid = _I32.unpack_from(msg, 1)[0]
        slots = self._slots.get(relid)
        if slots is None:
            return
        pos = 5
        old: list[Any] | None = None
        if msg[pos] in (0x4B, 0x4F):  # K / O: the old key or (REPLICA IDENTITY FULL) the whole old row
            old = [None] * len(self.data_names)
            pos, _ = self._tuple(msg, pos + 1, slots, old)
            old_full = msg[5] == 0x4F
        row: list[Any] = [None] * len(self.data_names)
        _, unchanged = self._tuple(msg, pos + 1, slots, row)
        if unchanged:
            if old is None or not old_full:
                rel = self.relations[relid]
                names = [self.data_names[s] for s in unchanged]
                raise UnchangedToastError(
                    f"an UPDATE of {rel.name} (transaction committed at LSN {format_lsn(self.txn[0])}) left the large "
                    f"(TOASTed) column(s) {names} unchanged and PostgreSQL did not send their values. Run ALTER TABLE "
                    f"{rel.name} REPLICA IDENTITY FULL so updates carry the old row, then restart the query")
            for s in unchanged:
                row[s] = old[s]  # carried over from the full old row
        self._emit(row, "update", relid)

    def _truncate(self, msg: bytes) -> None:
        count = _I32.unpack_from(msg, 1)[0]
        relids = [_I32.unpack_from(msg, 6 + 4 * i)[0] for i in range(count)]
        hit = [self.relations[r].name for r in relids if r in self._slots]
        if hit:
            raise PostgresError(
                f"TRUNCATE of {hit} (transaction committed at LSN {format_lsn(self.txn[0])}): a changelog of per-row "
                "changes cannot express it. Reload the table: drop the slot (sluice postgres drop-slot), clear the "
                "target and start the query with a new checkpoint (snapshot=true reads the table again)")

    def _emit(self, row: list[Any], op: str, relid: int) -> None:
        for column, value in zip(self._values, row, strict=True):
            column.append(value)
        lsn, ts, xid = self.txn
        for column, value in zip(self._meta, (op, lsn, ts, xid, self.relations[relid].name), strict=True):
            column.append(value)
        self._rows += 1
        self.changes += 1

    @property
    def pending(self) -> int:
        """Rows decoded and not yet flushed."""
        return self._rows

    # ------------------------------------------------------------------ typing
    def flush(self) -> pa.RecordBatch:
        """The rows decoded since the last flush, typed as `schema`."""
        arrays = [text_to_arrow(values, self.column_types.get(name, "text"), self.schema.field(name).type, name)
                  for name, values in zip(self.data_names, self._values, strict=True)]
        meta = [pa.array(values, field.type) for values, field in zip(self._meta, METADATA_FIELDS, strict=True)]
        by_name = dict(zip(self.data_names, arrays, strict=True)) | dict(zip(METADATA_COLUMNS, meta, strict=True))
        batch = pa.RecordBatch.from_arrays([by_name[f.name] for f in self.schema], schema=self.schema)
        self._reset()
        return batch


def text_to_arrow(values: list[bytes | None], pg_type: str, target: pa.DataType, column: str) -> pa.Array:
    """A column of PostgreSQL text output values as `target` (the type the batch reader gives the column)."""
    raw = pa.array(values, pa.binary()).cast(pa.string())
    try:
        if pa.types.is_string(target) or pa.types.is_large_string(target):
            return raw.cast(target)
        if pa.types.is_boolean(target):
            return pc.equal(raw, "t")
        if pa.types.is_binary(target):  # bytea in hex output: \x0102...
            return pa.array([None if v is None else bytes.fromhex(v[2:].decode()) for v in values], target)
        if pa.types.is_list(target):
            return pa.array([None if v is None else _parse_array(v.decode(), target.value_type) for v in values],
                            target)
        if pa.types.is_date(target) or pa.types.is_timestamp(target) or pa.types.is_floating(target) \
                or pa.types.is_integer(target) or pa.types.is_decimal(target):
            return raw.cast(target)
    except (pa.ArrowInvalid, ValueError) as e:
        raise PostgresError(f"column '{column}' ({pg_type}): a changed value does not convert to "
                            f"{target}: {e}") from None
    raise PostgresError(f"column '{column}' ({pg_type}) has no conversion to {target} in the change reader")


def _parse_array(text: str, element: pa.DataType) -> list[Any]:
    """A one-dimensional PostgreSQL array literal of simple values ({1,2,NULL}, {"a b",c})."""
    inner = text[text.index("{") + 1:text.rindex("}")]
    items: list[str | None] = []
    pos = 0
    while pos < len(inner):
        if inner[pos] == '"':
            end = pos + 1
            buf = []
            while inner[end] != '"':
                if inner[end] == "\\":
                    end += 1
                buf.append(inner[end])
                end += 1
            items.append("".join(buf))
            pos = end + 2
        else:
            end = inner.find(",", pos)
            end = len(inner) if end < 0 else end
            token = inner[pos:end]
            items.append(None if token == "NULL" else token)
            pos = end + 1
    if pa.types.is_boolean(element):
        return [None if v is None else v == "t" for v in items]
    if pa.types.is_integer(element):
        return [None if v is None else int(v) for v in items]
    if pa.types.is_floating(element):
        return [None if v is None else float(v) for v in items]
    if pa.types.is_date(element):
        return [None if v is None else dt.date.fromisoformat(v) for v in items]
    return items
