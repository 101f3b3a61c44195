"""Decoding of PostgreSQL's built-in `pgoutput` logical replication messages (protocol version 1) into Arrow.

The messages come from `pg_logical_slot_peek_binary_changes` as one Arrow binary column (ADBC, COPY BINARY).
Parsing a message is the only per-change Python work: each change's text values go into per-column lists,
and every column of a chunk is then typed in one pyarrow cast (ints, floats, numerics, booleans, dates,
timestamps); only arrays and bytea are converted value by value. Values are in PostgreSQL's text output
form with the reading session's DateStyle ISO and TimeZone UTC (set by the reader).

Message layout: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html

One module past ~400 lines on purpose: its message handlers (Begin, Commit, Relation, Insert/Update/Delete with
their unchanged TOAST values, Truncate) share one decoder's state, the relation cache and the open transaction, in
the order the stream gives them; split, each part would reach into the others' state.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from struct import Struct
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import TRUNCATE_OP
from sluice.connectors.postgres._client import PostgresError, SchemaChangedError
from sluice.connectors.postgres._pgtext import UntypedValueError, type_columns

if TYPE_CHECKING:
    from sluice.connector import DeadLetterWriter
    from sluice.connectors.postgres.changes._columns import Renamed

log = logging.getLogger("sluice.postgres")
_WARNED: set[tuple[str, tuple[str, ...]]] = set()  # (table, columns) warned about in this process: once each

# Metadata columns every change row carries after the table's columns.
OP, LSN, COMMIT_TIME, XID, TABLE = "_op", "_lsn", "_commit_time", "_xid", "_table"
# The columns an UPDATE left unchanged and pgoutput did not send (TOASTed values, 'u'), null in the row; null when
# none. Upsert sinks keep the stored value for them (their upsert.unchanged-column option).
UNCHANGED = "_unchanged"
METADATA_FIELDS = (
    pa.field(OP, pa.string()), pa.field(LSN, pa.int64()), pa.field(COMMIT_TIME, pa.timestamp("us", tz="UTC")),
    pa.field(XID, pa.int64()), pa.field(TABLE, pa.string()), pa.field(UNCHANGED, pa.list_(pa.string())),
)
METADATA_COLUMNS = tuple(f.name for f in METADATA_FIELDS)

_I32, _I16, _I64, _U32 = Struct("!i"), Struct("!h"), Struct("!q"), Struct("!I")
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


class UnchangedToastError(PostgresError):
    pass


def _warn_once(table: str, columns: list[str], message: str) -> None:
    if (table, tuple(columns)) not in _WARNED:
        _WARNED.add((table, tuple(columns)))
        log.warning("%s", message)


class ChangeDecoder:
    """Turns a stream of pgoutput messages into record batches of `schema` (table columns + METADATA_FIELDS).

    Only transactions whose commit LSN is in [start, end) are emitted; Relation messages are taken from all.
    `column_types` gives each table column's PostgreSQL type (format_type), which decides how its text parses.

    The change messages of a chunk are parsed with numpy across all messages at once, one column position at a
    time (where each value starts and how long it is), and each schema column is then gathered into one Arrow
    string array and cast. Only Relation and Truncate messages, which are rare, are handled one by one.
    """

    def __init__(self, schema: pa.Schema, column_types: dict[str, str], start: int, end: int,
                 tables: Mapping[str, Sequence[str]],
                 gone_columns: Callable[[str, list[str]], list[str]] | None = None,
                 whole_publication: str | None = None, keys: Mapping[str, Sequence[str]] | None = None,
                 letters: DeadLetterWriter | None = None, emit_truncates: bool = False,
                 renames: Mapping[str, Renamed] | None = None,
                 types: Mapping[str, Mapping[str, tuple[int, int]]] | None = None,
                 current_types: Callable[[str], Mapping[str, tuple[int, int]]] | None = None) -> None:
        """`tables`: each streamed table's columns in the stream's schema. `gone_columns(table, names)`: which of
        `names` the table no longer has (dropped or renamed since); without it a column the schema lacks is new.
        `whole_publication`: the publication, when the stream is all of its tables (a table of it that the stream
        lacks joined it later); None when the stream is some of its tables (the others are left out). `keys`: each
        table's primary key, which tells an update that changed it under REPLICA IDENTITY FULL. `letters`: where a
        change with a value that does not convert to its column's type goes (errors.tolerance=all); None: it fails
        the read. `emit_truncates`: a TRUNCATE of a streamed table comes as events (_truncate); False: it fails the
        read. `renames`: per table, columns renamed since the batch's start offset was written: changes sent under
        an old name come under the new one. `types`: each table's columns' (type oid, typmod) when the query
        started; `current_types(table)`: the table's now (asked when a Relation message differs): a type changed
        after the query started stops it."""
        self.schema = schema
        self.column_types = column_types
        self.data_names = [f.name for f in schema if f.name not in METADATA_COLUMNS]
        self._index = {name: i for i, name in enumerate(self.data_names)}
        self._discard = len(self.data_names)  # where values of columns left out go
        self.gone_columns = gone_columns
        self.whole_publication = whole_publication
        self.keys = keys or {}
        self.letters = letters
        self.emit_truncates = emit_truncates
        self.renames = renames or {}
        self.types = types or {}
        self.current_types = current_types
        self.start, self.end = start, end
        self.tables = tables
        self.relations: dict[int, Relation] = {}
        self._slots: dict[int, list[int]] = {}  # relid -> schema column index of each relation column
        self.txn: tuple[int, int, int] = (-1, 0, 0)  # commit LSN, commit time (Unix us), xid

    # ------------------------------------------------------------------ messages
    def feed(self, messages: pa.Array) -> Iterator[pa.RecordBatch]:
        """Decode a chunk of messages (an Arrow binary array); yields one record batch per run of change messages."""
        if len(messages) == 0:
            return
        messages, data, offsets = message_bytes(messages)
        starts = offsets[:-1]
        kinds = data[starts]
        # Relation (R) and Truncate (T) messages are handled one by one, in order, between runs of the others.
        special = np.flatnonzero((kinds == 0x52) | (kinds == 0x54))
        first = 0
        for i in [*special.tolist(), len(messages)]:
            if i > first:
                batch = self._run(data, starts[first:i], kinds[first:i])
                if batch is not None:
                    yield batch
            if i < len(messages):
                msg = messages[i].as_py()
                if msg[0] == 0x52:
                    self._relation(msg)
                elif self._in_range(self.txn[0]) and (events := self._truncate(msg)) is not None:
                    yield events
            first = i + 1

    def _in_range(self, lsn: int) -> bool:
        return self.start <= lsn < self.end

    def _run(self, data: np.ndarray, starts: np.ndarray, kinds: np.ndarray) -> pa.RecordBatch | None:
        """The rows of a run of messages with no Relation or Truncate among them."""
        n = len(starts)
        is_begin = kinds == 0x42
        begins = np.flatnonzero(is_begin)
        # Each message's transaction: the last BEGIN before it, or the one carried over from earlier messages.
        txn_of = np.maximum.accumulate(np.where(is_begin, np.arange(n), -1))
        lsn = np.full(n, self.txn[0], np.int64)
        ts = np.full(n, self.txn[1], np.int64)
        xid = np.full(n, self.txn[2], np.int64)
        if len(begins):
            b_lsn, b_ts = _be(data, starts[begins] + 1, 8), _be(data, starts[begins] + 9, 8) + _PG_EPOCH_US
            b_xid = _be(data, starts[begins] + 17, 4) & 0xFFFFFFFF  # xids are unsigned 32-bit
            inside = txn_of >= 0
            rank = np.searchsorted(begins, txn_of[inside])
            lsn[inside], ts[inside], xid[inside] = b_lsn[rank], b_ts[rank], b_xid[rank]
            self.txn = (int(b_lsn[-1]), int(b_ts[-1]), int(b_xid[-1]))
        change = ((kinds == 0x49) | (kinds == 0x55) | (kinds == 0x44)) & (lsn >= self.start) & (lsn < self.end)
        rows = np.flatnonzero(change)
        if not len(rows):
            return None
        relids = _be(data, starts[rows] + 1, 4)
        count = len(rows)
        value_start = np.zeros((len(self.data_names) + 1, count), np.int64)  # + the discarded columns' row
        value_len = np.full((len(self.data_names) + 1, count), -1, np.int64)  # -1: null
        table_of = np.zeros(count, np.int32)  # index into `names`
        names: list[str] = []
        keep = np.zeros(count, bool)
        rekeys = []  # per relation with updates that changed the key: (their rows, old tuple per schema column)
        for relid in np.unique(relids).tolist():
            slots = self._slots.get(relid)
            if slots is None:
                continue  # a table of the publication that this stream does not read
            mine = np.flatnonzero(relids == relid)
            keep[mine] = True
            table_of[mine] = len(names)
            names.append(self.relations[relid].name)
            rekey = self._parse_rows(data, starts[rows[mine]], kinds[rows[mine]], slots, relid, mine, value_start,
                                     value_len, lsn[rows[mine]])
            if rekey is not None:
                rekeys.append(rekey)
        rekeyed = np.zeros(count, bool)
        if rekeys:  # rare: only now the old tuples' arrays
            old_value_start, old_value_len = np.zeros_like(value_start), np.full_like(value_len, -1)
            for changed_rows, old_start, old_len in rekeys:
                rekeyed[changed_rows] = True
                old_value_start[:, changed_rows], old_value_len[:, changed_rows] = old_start, old_len
        if not keep.all():
            rows, value_start, value_len, table_of, rekeyed = rows[keep], value_start[:, keep], value_len[:, keep], \
                table_of[keep], rekeyed[keep]
            if rekeys:
                old_value_start, old_value_len = old_value_start[:, keep], old_value_len[:, keep]
            count = len(rows)
            if not count:
                return None
        op_kinds = kinds[rows]
        op_of = np.where(op_kinds == 0x49, 0, np.where(op_kinds == 0x55, 1, 2)).astype(np.int32)
        if rekeys:
            # Each such update becomes a delete of the old key then an insert of the new row, in that order: an
            # upsert of the new key alone would leave the old one behind in any keyed replica.
            order = np.repeat(np.arange(count), np.where(rekeyed, 2, 1))
            is_delete = np.zeros(len(order), bool)
            is_delete[np.flatnonzero(rekeyed) + np.arange(int(rekeyed.sum()))] = True  # the first of each pair
            value_start = np.where(is_delete, old_value_start[:, order], value_start[:, order])
            value_len = np.where(is_delete, old_value_len[:, order], value_len[:, order])
            op_of = np.where(is_delete, 2, np.where(rekeyed[order], 0, op_of[order])).astype(np.int32)
            rows, table_of = rows[order], table_of[order]
        texts = {name: _gather(data, value_start[i], value_len[i]) for i, name in enumerate(self.data_names)}
        by_name, untyped = type_columns(texts, self.column_types, self.schema)
        meta = {OP: _ops().take(op_of), LSN: pa.array(lsn[rows], pa.int64()),
                COMMIT_TIME: pa.array(ts[rows], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                XID: pa.array(xid[rows], pa.int64()), TABLE: pa.array(names, pa.string()).take(table_of),
                UNCHANGED: _unchanged_lists(value_len[:-1] == _UNCHANGED, self.data_names)}
        if untyped:
            keep = self._refuse(texts, meta, untyped)
            meta = {name: column.filter(keep) for name, column in meta.items()}
            if not len(meta[OP]):
                return None
        by_name |= meta
        return pa.RecordBatch.from_arrays([by_name[f.name] for f in self.schema], schema=self.schema)

    def _refuse(self, texts: dict[str, pa.Array], meta: dict[str, pa.Array],
                untyped: dict[int, tuple[str, UntypedValueError]]) -> pa.Array:
        """Changes with a value that does not convert to its column's type: each named by its table, column, commit
        LSN and value, sent to the dead letters (errors.tolerance=all: the change as its table, LSN, op, key and
        every value as PostgreSQL's text) or failing the read. Returns the mask of the changes kept."""
        rows = sorted(untyped)
        records, errors = [], []
        for row in rows:
            column, error = untyped[row]
            table, lsn, op = meta[TABLE][row].as_py(), format_lsn(meta[LSN][row].as_py()), meta[OP][row].as_py()
            value = texts[column][row].as_py()
            shown = repr(value if len(value) <= 100 else value[:100] + "...")
            errors.append(UntypedValueError(f"table {table}, the {op} committed at LSN {lsn}: value {shown} of "
                                            f"{error}"))
            columns = self.tables.get(table, self.data_names)
            records.append({"table": table, "lsn": lsn, "op": op, "xid": meta[XID][row].as_py(),
                            "key": {k: texts[k][row].as_py() for k in self.keys.get(table, ()) if k in texts},
                            "values": {c: texts[c][row].as_py() for c in columns if c in texts}})
        if self.letters is None:
            raise UntypedValueError(f"{errors[0]}. Declare the column as text in the table or send such changes "
                                    "aside: .option('errors.tolerance', 'all') with errors.deadletter.format and its "
                                    "options (docs/postgres.md)")
        self.letters.add(records, errors)
        return pa.array(np.isin(np.arange(len(meta[OP])), rows, invert=True))

    def _parse_rows(self, data: np.ndarray, starts: np.ndarray, kinds: np.ndarray, slots: list[int], relid: int,
                    out_rows: np.ndarray, value_start: np.ndarray, value_len: np.ndarray,
                    lsns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Fill value_start/value_len (schema column x row) for the change messages of one relation. Returns the
        updates that changed the key, if any: their rows and their old tuples' (start, length) per schema column."""
        marker = data[starts + 5]  # N (new tuple), or K / O (old key / old row) in updates and deletes
        has_old = (marker == 0x4B) | (marker == 0x4F)
        pos = starts + 6
        old_start = old_len = None
        updates_with_old = has_old & (kinds == 0x55)
        if has_old.any():
            old_start, old_len, after = _tuples(data, pos, len(slots), has_old)
            # Deletes: the old key/row is the row. Updates: the new tuple follows after an 'N'.
            pos = np.where(updates_with_old, after + 1, pos)
        new_tuple = ~has_old | updates_with_old
        # Inserts and updates: the new tuple; deletes: the old key or row (pos still points at it).
        v_start, v_len, _ = _tuples(data, pos, len(slots), np.ones(len(starts), bool))
        unchanged = (v_len == _UNCHANGED) & new_tuple[None, :]
        if unchanged.any() and old_start is not None and old_len is not None:
            # With the old row (REPLICA IDENTITY FULL) the value is known: filled in. Otherwise the value stays
            # _UNCHANGED (null, and named in the row's UNCHANGED list).
            carried = unchanged & (marker == 0x4F)[None, :]
            v_start[carried], v_len[carried] = old_start[carried], old_len[carried]
        for i, slot in enumerate(slots):
            value_start[slot, out_rows] = v_start[i]
            value_len[slot, out_rows] = v_len[i]
        if updates_with_old.any():
            assert old_start is not None and old_len is not None
            changed = self._key_changed(data, self.relations[relid], marker, updates_with_old, old_start, old_len,
                                        v_start, v_len)
            if changed.any():
                self._refuse_rekeyed_unchanged(relid, (v_len == _UNCHANGED) & changed[None, :], lsns)
                old_value_start = np.zeros((value_start.shape[0], int(changed.sum())), np.int64)
                old_value_len = np.full_like(old_value_start, -1)
                for i, slot in enumerate(slots):
                    old_value_start[slot], old_value_len[slot] = old_start[i][changed], old_len[i][changed]
                return out_rows[changed], old_value_start, old_value_len
        return None

    def _refuse_rekeyed_unchanged(self, relid: int, unknown: np.ndarray, lsns: np.ndarray) -> None:
        """An update that changed the key becomes an insert of the new key, which must carry every value: one the
        update left unchanged, and pgoutput did not send, is not known (the old row, under REPLICA IDENTITY FULL,
        carries it)."""
        if unknown.any():
            col, row = np.argwhere(unknown)[0]
            rel = self.relations[relid]
            raise UnchangedToastError(
                f"an UPDATE of {rel.name} (transaction committed at LSN {format_lsn(int(lsns[row]))}) changed the "
                f"row's primary key and left the large (TOASTed) column(s) {[rel.columns[col]]} unchanged, and "
                "PostgreSQL did not send their values: the row under its new key cannot be written whole. Run "
                f"ALTER TABLE {rel.name} REPLICA IDENTITY FULL so such updates carry the old row, then restart the "
                "query")

    def _key_changed(self, data: np.ndarray, rel: Relation, marker: np.ndarray, updates_with_old: np.ndarray,
                     old_start: np.ndarray, old_len: np.ndarray, v_start: np.ndarray, v_len: np.ndarray) -> np.ndarray:
        """Which updates changed the row's key. An old key (K) comes only when the update changed it; an old row
        (O, REPLICA IDENTITY FULL) always: then the key changed if a primary key column's value differs."""
        changed = updates_with_old & (marker == 0x4B)
        full = updates_with_old & (marker == 0x4F)
        if full.any():
            for col in [rel.columns.index(c) for c in self.keys.get(rel.name, ()) if c in rel.columns]:
                old = pc.fill_null(_gather(data, old_start[col], old_len[col]), "\0null")
                new = pc.fill_null(_gather(data, v_start[col], v_len[col]), "\0null")
                changed |= full & ~pc.equal(old, new).to_numpy(zero_copy_only=False)
        return changed

    def _relation(self, msg: bytes) -> None:
        relid = _I32.unpack_from(msg, 1)[0]
        pos = 5
        nsp_end = msg.index(b"\0", pos)
        rel_end = msg.index(b"\0", nsp_end + 1)
        name = f"{msg[pos:nsp_end].decode()}.{msg[nsp_end + 1:rel_end].decode()}"
        pos = rel_end + 1
        natts = _I16.unpack_from(msg, pos + 1)[0]  # after the replica identity setting (one byte)
        pos += 3
        columns, types = [], []
        for _ in range(natts):
            end = msg.index(b"\0", pos + 1)
            columns.append(msg[pos + 1:end].decode())
            types.append((_U32.unpack_from(msg, end + 1)[0], _I32.unpack_from(msg, end + 5)[0]))
            pos = end + 1 + 8  # type oid, typmod
        if name in self.renames:
            columns = self.renames[name].under_new_names(columns)
        self.relations[relid] = Relation(relid, name, columns)
        if name in self.tables:
            unknown = [c for c in columns if c not in self._index]
            gone = self.gone_columns(name, unknown) if unknown and self.gone_columns is not None else []
            new = [c for c in unknown if c not in gone]
            at = f"the transaction committed at LSN {format_lsn(self.txn[0])}"
            if new:
                raise SchemaChangedError(
                    f"table {name} has column(s) {new} that the stream's schema does not (added or renamed by ALTER "
                    f"TABLE, {at}); restart the query with the same checkpoint: it reads the new schema and goes on "
                    "from where it stopped")
            if gone:  # changes from before a DROP or RENAME COLUMN, read by a query restarted after it
                _warn_once(name, gone, f"table {name}: changes up to {at} carry column(s) {gone}, which the table no "
                           "longer has (dropped or renamed) and the stream's schema, read when the query started, "
                           "does not: their values are left out (a renamed column's new name is null in them)")
            self._check_types(name, dict(zip(columns, types, strict=True)), at)
            missing = [c for c in self.tables[name] if c not in columns]
            dropped = self.gone_columns(name, missing) if missing and self.gone_columns is not None else []
            if dropped:
                raise SchemaChangedError(
                    f"table {name} no longer has column(s) {dropped} (dropped by ALTER TABLE, {at}); restart the "
                    "query with the same checkpoint: it streams the table's current columns from where it stopped")
            if missing:
                _warn_once(name, missing, f"table {name}: its changes from {at} on no longer carry column(s) "
                           f"{missing}, which the table still has (a publication's column list changed?): they come "
                           "as null; restart the query to stream the columns the publication sends")
            self._slots[relid] = [self._index.get(c, self._discard) for c in columns]
        elif self.whole_publication is not None:
            raise SchemaChangedError(
                f"table {name} joined publication '{self.whole_publication}' after the query started (its changes "
                f"from the transaction committed at LSN {format_lsn(self.txn[0])} on would be left out); restart the "
                "query with the same checkpoint to stream it too. Its rows from before it joined are not changes: "
                "read them with format('postgres')")

    def _check_types(self, table: str, sent: dict[str, tuple[int, int]], at: str) -> None:
        """A Relation message whose column has another type than when the query started (ALTER COLUMN ... TYPE)
        stops the query when the table has that type now: the schema's type is the stale one. A restarted query
        replaying changes from before it reads their old type's text into the new type."""
        expected = self.types.get(table, {})
        changed = [c for c, t in sent.items() if c in expected and expected[c] != t]
        if not changed or self.current_types is None:
            return
        now = self.current_types(table)
        stale = [c for c in changed if now.get(c) == sent[c]]
        if stale:
            raise SchemaChangedError(
                f"column(s) {stale} of table {table} changed type (ALTER COLUMN ... TYPE, {at}); restart the query "
                "with the same checkpoint: it reads the new types and goes on from where it stopped")

    def _truncate(self, msg: bytes) -> pa.RecordBatch | None:
        """A TRUNCATE of streamed tables: one event per table, in its place among the changes (emit_truncates), else
        the failure that stops the query (option truncate=fail). The message ('T', count, options, relation ids)
        lists every table it emptied, those a CASCADE reached included; its options (CASCADE, RESTART IDENTITY)
        are not carried: a target's sequences and other tables are its own."""
        count = _I32.unpack_from(msg, 1)[0]
        relids = [_I32.unpack_from(msg, 6 + 4 * i)[0] for i in range(count)]
        hit = [self.relations[r].name for r in relids if r in self._slots]
        if not hit:
            return None
        lsn, commit_us, xid = self.txn
        if not self.emit_truncates:
            raise PostgresError(
                f"TRUNCATE of {hit} (transaction committed at LSN {format_lsn(lsn)}), and option truncate=fail. "
                f"Set truncate=emit to stream it as an event (_op = '{TRUNCATE_OP}'), which the postgres and "
                "tablestore sinks apply; or reload the table: drop the slot (sluice postgres drop-slot), clear the "
                "target and start the query with a new checkpoint (snapshot=true reads the table again)")
        n = len(hit)
        meta = {OP: pa.array([TRUNCATE_OP] * n, pa.string()), LSN: pa.array([lsn] * n, pa.int64()),
                COMMIT_TIME: pa.array([commit_us] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                XID: pa.array([xid] * n, pa.int64()), TABLE: pa.array(hit, pa.string()), UNCHANGED: none_unchanged(n)}
        return pa.RecordBatch.from_arrays([meta.get(f.name, pa.nulls(n, f.type)) for f in self.schema],
                                          schema=self.schema)


def message_bytes(messages: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """A chunk of pgoutput messages as binary, the bytes of all of them and where each starts and the last ends in
    those bytes (numpy, over the Arrow buffers: the decoders read every message's fields at once)."""
    messages = messages.cast(pa.binary()) if not pa.types.is_binary(messages.type) else messages
    buffers = messages.buffers()
    offsets = np.frombuffer(buffers[1], np.int32)[messages.offset:messages.offset + len(messages) + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return messages, data, offsets.astype(np.int64)


@functools.cache
def _ops() -> pa.Array:
    """The op column's values, taken by index. Built on first use: pa.array imports pandas (1 s), which Spark's
    one-shot planning workers, importing this module to unpickle the data source, would pay on every call."""
    return pa.array(["insert", "update", "delete"], pa.string())
_UNCHANGED = -2  # value length of an unchanged TOASTed value ('u')


def none_unchanged(n: int) -> pa.Array:
    """The UNCHANGED column of `n` rows that left nothing unchanged: empty lists, never nulls. Spark hands a column
    of null lists from a Python source to a Python writer about 5x slower than one of empty lists (its Arrow batch's
    size check, `ArrowWriter.sizeInBytes`, walks the null list vector again as each row is added; docs/postgres.md,
    throughput), and almost every change has nothing unchanged."""
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()))


def _unchanged_lists(unchanged: np.ndarray, names: list[str]) -> pa.Array:
    """The UNCHANGED column: per row (columns of `unchanged`), the names of the columns marked in it, in schema
    order; an empty list for a row without any (none_unchanged)."""
    per_row = unchanged.sum(axis=0)
    if not per_row.any():
        return none_unchanged(unchanged.shape[1])
    _, cols = np.nonzero(unchanged.T)  # row-major: each row's columns in order
    offsets = np.zeros(len(per_row) + 1, np.int32)
    np.cumsum(per_row, out=offsets[1:])
    values = pa.array(names, pa.string()).take(pa.array(cols))
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _be(data: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Big-endian signed integers of `width` bytes at each position."""
    raw = data[pos[:, None] + np.arange(width)]
    return np.ascontiguousarray(raw).view(f">i{width}").ravel().astype(np.int64)


def _tuples(data: np.ndarray, pos: np.ndarray, ncols: int, which: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                        np.ndarray]:
    """TupleData at `pos` of the messages in `which`: (value start, value length or -1 null / -2 unchanged) per
    column x message, and the position after each tuple. Positions of other messages are left as they are."""
    count = len(pos)
    starts = np.zeros((ncols, count), np.int64)
    lengths = np.full((ncols, count), -1, np.int64)
    at = np.flatnonzero(which)
    sent = _be(data, pos[at], 2)
    if len(at) and (sent != ncols).any():
        raise PostgresError(f"pgoutput sent a tuple of {int(sent[sent != ncols][0])} columns for a relation of "
                            f"{ncols}; restart the query")
    p = pos[at] + 2
    for i in range(ncols):
        kind = data[p]
        text = np.flatnonzero(kind == 0x74)  # t
        if ((kind != 0x74) & (kind != 0x6E) & (kind != 0x75)).any():
            raise PostgresError("pgoutput sent a tuple value that is not text, null or unchanged; sluice reads text")
        n = _be(data, p[text] + 1, 4)
        starts[i, at[text]] = p[text] + 5
        lengths[i, at[text]] = n
        lengths[i, at[kind == 0x75]] = _UNCHANGED
        step = np.ones(len(p), np.int64)
        step[text] = 5 + n
        p = p + step
    after = pos.copy()
    after[at] = p
    return starts, lengths, after


def _gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """An Arrow string array of the byte ranges (start, length); length < 0 is null."""
    valid = lengths >= 0
    sizes = np.where(valid, lengths, 0)
    offsets = np.zeros(len(sizes) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        index = np.repeat(starts - offsets[:-1], sizes) + np.arange(total)
        values = data[index]
    else:
        values = np.zeros(0, np.uint8)
    mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.StringArray.from_buffers(len(sizes), pa.py_buffer(offsets), pa.py_buffer(values), mask,
                                       null_count=int((~valid).sum()))
