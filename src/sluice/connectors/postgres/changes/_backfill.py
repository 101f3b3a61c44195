"""Snapshots on demand while a change stream runs: a table is read in primary-key chunks, one chunk per micro-batch,
each in a snapshot taken when its batch is planned (the watermark idea of DBLog, behind Debezium's incremental
snapshots and Flink CDC's). Requests: a table of the publication the checkpoint did not stream yet (at the next
start, option snapshot.new-tables), and `execute-snapshot` rows in a signal table (option signal.table, Debezium's
shape), polled on the driver.

Where a chunk goes: first in its micro-batch, before the batch's changes, as `_op = 'read'` rows with `_lsn` = the
batch's start. The batch ends at or after the WAL insert position read once the snapshot was taken, so every
transaction the snapshot sees has its commit record before the batch's end: in an earlier batch, applied already,
or in this one, after the chunk. A change the snapshot does not see comes after the chunk too. Applied in order, a
key's last row is its state at the batch's end, never a chunk's stale value. (DBLog puts a chunk at its high
watermark and drops the keys that changed between its low and high watermarks; with the batch as the window the
chunk can go first and drop nothing, so a TOASTed value the chunk carries survives a later update that leaves it
unchanged.)

A gap DBLog leaves open is closed: a transaction whose commit record is already in the WAL but that the snapshot
does not see yet (its backend is between writing the commit record and ending the transaction, as under synchronous
replication) may have been applied in an earlier batch; the chunk's older row would then overwrite it. Such a
transaction's session waits for its standby (wait event SyncRep) from before the snapshot is taken on: a snapshot
that does not see one of those is let go, and the chunk waits for the next micro-batch (late_transactions). Seeing
other roles' wait events takes pg_read_all_stats (a warning says so when synchronous_standby_names is set and the
role lacks it). Not caught: a backend stalled for other reasons between writing its commit record and ending its
transaction, from before the batch's start until the snapshot.

State that crosses micro-batches (what is queued, how far the table being read is done, the chunk of the batch that
ends at an offset, which signals were taken) lives in the offsets (Backfill), so a restarted query resumes at the
last chunk Spark committed. A batch replayed after its snapshot is gone (the driver died with the process holding
it) reads its chunk in a new snapshot: a key's state then runs ahead of the stream until the stream reaches that
snapshot's position, and from there on is exact again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sluice.connector import OptionError, SluiceError
from sluice.connectors.postgres._client import Connection, quote_ident, quote_literal, split_qualified
from sluice.connectors.postgres._pgoutput import parse_lsn
from sluice.connectors.postgres._snapshot import SnapshotHolder

log = logging.getLogger("sluice.postgres")

NEW_TABLE = "new-table"  # TableRequest.request of a table the checkpoint did not stream yet
FLUSH_WAIT_S = 10.0  # the longest a planning waits for the server to flush the WAL up to a chunk's batch end


@dataclass(frozen=True)
class TableRequest:
    """A table to read in chunks: one of the stream's tables, with an optional SQL condition on its columns."""

    table: str  # schema.name
    filter: str | None
    request: str  # the signal's id, or NEW_TABLE


@dataclass(frozen=True)
class Chunk:
    """One chunk: the rows of `table` with a primary key in (after, upto], read in the exported `snapshot`."""

    table: str
    after: tuple[str, ...] | None  # exclusive lower bound (the primary key's values as text); None: the first row on
    upto: tuple[str, ...] | None  # inclusive upper bound; None: up to the last row
    filter: str | None
    snapshot: str
    channel: str  # the snapshot holder's notify channel


@dataclass(frozen=True)
class Backfill:
    """Where the snapshots on demand stand at one offset."""

    queue: tuple[TableRequest, ...] = ()  # tables still to read, the first one being read
    after: tuple[str, ...] | None = None  # the first table's primary key up to which earlier chunks read it
    chunk: Chunk | None = None  # the chunk of the micro-batch that ends at this offset
    signals: tuple[str, ...] = ()  # ids of signal rows taken, kept until the rows are deleted

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"queue": [[r.table, r.filter, r.request] for r in self.queue],
                               "after": None if self.after is None else list(self.after), "signals": list(self.signals)}
        if self.chunk is not None:
            c = self.chunk
            out["chunk"] = {"table": c.table, "after": None if c.after is None else list(c.after),
                            "upto": None if c.upto is None else list(c.upto), "filter": c.filter,
                            "snapshot": c.snapshot, "channel": c.channel}
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Backfill:
        c = raw.get("chunk")
        chunk = None if c is None else Chunk(c["table"], _key(c["after"]), _key(c["upto"]), c["filter"],
                                             c["snapshot"], c["channel"])
        return cls(tuple(TableRequest(t, f, r) for t, f, r in raw.get("queue", ())), _key(raw.get("after")), chunk,
                   tuple(raw.get("signals", ())))


def _key(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


class SignalError(SluiceError):
    """A row of the signal table that cannot be carried out: it names the row's id and what to fix."""


def _row(columns: tuple[str, ...], key: tuple[str, ...], types: Mapping[str, str]) -> tuple[str, str]:
    """A primary key's columns and a key's values as SQL row expressions."""
    names = ", ".join(quote_ident(c) for c in columns)
    values = ", ".join(f"{quote_literal(v)}::{types[c]}" for c, v in zip(columns, key, strict=True))
    return f"ROW({names})", f"ROW({values})"


def chunk_where(chunk: Chunk, key: tuple[str, ...], types: Mapping[str, str]) -> str:
    """The chunk's rows as a WHERE condition on its table (`key`: the table's primary key; none: the whole table)."""
    parts = []
    if key and chunk.after is not None:
        columns, bound = _row(key, chunk.after, types)
        parts.append(f"{columns} > {bound}")
    if key and chunk.upto is not None:
        columns, bound = _row(key, chunk.upto, types)
        parts.append(f"{columns} <= {bound}")
    if chunk.filter:
        parts.append(f"({chunk.filter})")
    return " AND ".join(parts) or "true"


def committed_unseen(pg: Any) -> list[str]:
    """The transactions whose commit record is in the WAL while snapshots do not see them yet: those of sessions
    waiting for a synchronous standby (wait event SyncRep). Other roles' wait events need pg_read_all_stats."""
    (xids,) = pg.execute("SELECT coalesce(array_agg(backend_xid::text), '{}') FROM pg_stat_activity "
                         "WHERE wait_event = 'SyncRep' AND backend_xid IS NOT NULL").fetchone()
    return list(xids)


def late_transactions(pg: Any, snapshot: str, unseen_before: list[str]) -> int:
    """How many of `unseen_before` (committed_unseen before `snapshot` was taken) `snapshot` does not see either: a
    transaction whose commit record is before the micro-batch's start, applied already, is among them. One that
    commits while the snapshot is taken is not: it was not committed before."""
    if not unseen_before:
        return 0
    pg.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        pg.execute(f"SET TRANSACTION SNAPSHOT {quote_literal(snapshot)}")
        # xid8 in the snapshot, 32-bit xids in pg_stat_activity: compared modulo 2^32.
        (late,) = pg.execute("SELECT count(*) FROM pg_snapshot_xip(pg_current_snapshot()) AS x "
                             "WHERE (x::text::numeric %% 4294967296)::text = ANY(%s)", (unseen_before,)).fetchone()
    finally:
        pg.execute("ROLLBACK")
    return int(late)


class Backfiller:
    """The driver's side: takes requests, cuts the next chunk, holds its snapshot until its batch is committed."""

    def __init__(self, conn: Connection, tables: tuple[str, ...], table_columns: Mapping[str, tuple[tuple[str, str],
                 ...]], primary_keys: Mapping[str, tuple[str, ...]], *, chunk_size: int, signal_table: str | None,
                 new_tables: bool, timeout_s: int, slot: str) -> None:
        self.conn = conn
        self.tables = tables
        self.types = {t: dict(cols) for t, cols in table_columns.items()}
        self.primary_keys = primary_keys
        self.chunk_size = chunk_size
        self.signal_table = None if signal_table is None else ".".join(split_qualified(signal_table, "signal.table"))
        self.new_tables = new_tables
        self.timeout_s = timeout_s
        self.slot = slot
        self._holders: dict[str, SnapshotHolder] = {}  # snapshot id -> the process holding it
        self._polled_at: int | None = None  # the WAL position of the last look at the signal table
        self._rights_checked = False

    # ---------------------------------------------------------------------------------------------- requests
    def at_start(self, state: Backfill, streamed: tuple[str, ...] | None) -> Backfill:
        """`state` with the tables the checkpoint did not stream yet queued (`streamed`: the tables its offsets
        recorded; None: none recorded, nothing to add) and the tables the stream no longer has dropped."""
        gone = [r for r in state.queue if r.table not in self.tables]
        for request in gone:
            log.warning("slot %s: table %s is no longer streamed; its snapshot on demand (%s) is dropped", self.slot,
                        request.table, request.request)
        queue = tuple(r for r in state.queue if r.table in self.tables)
        after = state.after if queue and queue[0] == state.queue[0] else None  # the table being read stays
        if streamed is not None and self.new_tables:
            queued = {r.table for r in queue}
            added = [t for t in self.tables if t not in streamed and t not in queued]
            if added:
                log.info("slot %s: tables new to the stream, read in chunks of %d rows while it runs: %s", self.slot,
                         self.chunk_size, ", ".join(added))
            queue += tuple(TableRequest(t, None, NEW_TABLE) for t in added)
        return replace(state, queue=queue, after=after)

    def poll(self, pg: Any, state: Backfill, wal: int) -> Backfill:
        """`state` with the signal table's new `execute-snapshot` and `stop-snapshot` rows taken; looked at only when
        the WAL moved since the last look (a new signal row is WAL too)."""
        if self.signal_table is None or wal == self._polled_at:
            return state
        schema, name = self.signal_table.split(".", 1)
        try:
            rows = pg.execute(f"SELECT id::text, type::text, data::text FROM {quote_ident(schema)}."
                              f"{quote_ident(name)} ORDER BY id").fetchall()
        except Exception as e:
            raise OptionError(f"option 'signal.table': reading {self.signal_table} on {self.conn.describe()} failed "
                              f"({self.conn.scrub(e)}); it needs columns id, type and data (text or jsonb) and SELECT "
                              "and DELETE on it for the query's role") from None
        self._polled_at = wal
        present = {row[0] for row in rows}
        taken = [s for s in state.signals if s in present]  # a taken row's id, until the row is deleted
        queue = list(state.queue)
        after = state.after
        for sid, kind, data in rows:
            if sid in state.signals:
                continue
            taken.append(sid)
            requested = self._requested(sid, kind, data)
            if kind == "execute-snapshot":
                queued = {r.table for r in queue}
                queue += [r for r in requested if r.table not in queued]
                log.info("slot %s: signal %s: snapshot of %s on demand", self.slot, sid,
                         ", ".join(r.table for r in requested))
            else:  # stop-snapshot: the named tables (all when none) leave the queue
                names = {r.table for r in requested} or {r.table for r in queue}
                if queue and queue[0].table in names:
                    after = None
                queue = [r for r in queue if r.table not in names]
                log.info("slot %s: signal %s: snapshot on demand of %s stopped", self.slot, sid, ", ".join(names))
        return replace(state, queue=tuple(queue), after=after, signals=tuple(taken))

    def _requested(self, sid: str, kind: str, data: str | None) -> list[TableRequest]:
        where = f"signal table {self.signal_table}, row id '{sid}'"
        if kind not in ("execute-snapshot", "stop-snapshot"):
            raise SignalError(f"{where}: type '{kind}' is not a signal sluice carries out (execute-snapshot, "
                              "stop-snapshot); delete the row to go on")
        try:
            body = json.loads(data) if data else {}
        except ValueError as e:
            raise SignalError(f"{where}: data is not JSON ({e}); delete the row and insert it again") from None
        kind_of = body.get("type", "incremental")
        if str(kind_of).lower() != "incremental":
            raise SignalError(f"{where}: data's type '{kind_of}': sluice reads snapshots on demand incrementally "
                              "only; leave type out or set it to 'incremental'")
        tables = body.get("data-collections") or []
        if kind == "execute-snapshot" and not tables:
            raise SignalError(f"{where}: data names no table: give \"data-collections\": [\"schema.table\", ...]")
        filters = {}
        for condition in body.get("additional-conditions") or []:
            filters[self._streamed(where, condition.get("data-collection", ""))] = condition.get("filter")
        requested = []
        for table in tables:
            name = self._streamed(where, table)
            if name not in self.primary_keys or not self.primary_keys[name]:
                log.warning("slot %s: %s: table %s has no primary key; it is read as one chunk", self.slot, where,
                            name)
            requested.append(TableRequest(name, filters.get(name), sid))
        return requested

    def _streamed(self, where: str, table: str) -> str:
        schema, name = split_qualified(str(table), "data-collections")
        qualified = f"{schema}.{name}"
        if qualified not in self.tables:
            raise SignalError(f"{where}: table '{table}' is not one this query streams ({', '.join(self.tables)}); "
                              "add it to the publication (ALTER PUBLICATION ... ADD TABLE) and restart the query, "
                              "which reads it then, or delete the row")
        return qualified

    # ---------------------------------------------------------------------------------------------- chunks
    def next_chunk(self, pg: Any, state: Backfill) -> tuple[Backfill, int] | None:
        """The state at the end of a micro-batch that reads the queue's next chunk, and the WAL position the batch must
        reach; None when the queue is empty or the snapshot sees a transaction late (the chunk waits a batch)."""
        state = replace(state, chunk=None)
        if not state.queue:
            return None
        request = state.queue[0]
        upto = self._upper_bound(pg, request, state.after)
        self._check_visibility_rights(pg)
        unseen = committed_unseen(pg)
        holder = SnapshotHolder(self.conn, self.timeout_s)
        holder.release_pipes()
        snapshot = holder.shared.snapshot_id
        if late_transactions(pg, snapshot, unseen):
            holder.cancel()
            log.info("slot %s: a transaction committed but not yet visible (synchronous replication?); the next chunk "
                     "of %s waits for the next micro-batch", self.slot, request.table)
            return None
        (high,) = pg.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        self._holders[snapshot] = holder
        chunk = Chunk(request.table, state.after, upto, request.filter, snapshot, holder.shared.channel)
        if upto is None:  # the table's last chunk
            done = replace(state, queue=state.queue[1:], after=None, chunk=chunk)
            log.info("slot %s: snapshot on demand of %s: last chunk", self.slot, request.table)
        else:
            done = replace(state, after=upto, chunk=chunk)
        return done, parse_lsn(high)

    def _check_visibility_rights(self, pg: Any) -> None:
        """Once: warn when the server waits for synchronous standbys and this role cannot see other roles' waits."""
        if self._rights_checked:
            return
        self._rights_checked = True
        (blind,) = pg.execute("SELECT current_setting('synchronous_standby_names') <> '' AND NOT (pg_has_role("
                              "'pg_read_all_stats', 'MEMBER') OR (SELECT rolsuper FROM pg_roles WHERE rolname = "
                              "current_user))").fetchone()
        if blind:
            log.warning("slot %s: the server waits for synchronous standbys, and this role cannot see other roles' "
                        "sessions waiting for them: a chunk of a snapshot on demand could then overwrite a change "
                        "committed but not yet visible. GRANT pg_read_all_stats TO the role", self.slot)

    def _upper_bound(self, pg: Any, request: TableRequest, after: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """The primary key of the chunk's last row: `chunk_size` rows after `after`; None when fewer are left."""
        key = self.primary_keys.get(request.table) or ()
        if not key:
            return None
        schema, name = request.table.split(".", 1)
        probe = Chunk(request.table, after, None, request.filter, "", "")
        where = chunk_where(probe, key, self.types[request.table])
        order = ", ".join(quote_ident(c) for c in key)
        # Named k0, k1, ...: an output column named as the key column would make ORDER BY sort the text.
        texts = ", ".join(f"{quote_ident(c)}::text AS k{i}" for i, c in enumerate(key))
        row = pg.execute(f"SELECT {texts} FROM {quote_ident(schema)}.{quote_ident(name)} WHERE {where} "
                         f"ORDER BY {order} LIMIT 1 OFFSET {self.chunk_size - 1}").fetchone()
        return None if row is None else tuple(row)

    def wait_flushed(self, pg: Any, lsn: int) -> None:
        """Until the server flushed its WAL up to `lsn`: a batch is decoded from flushed WAL only."""
        deadline = time.monotonic() + FLUSH_WAIT_S
        while parse_lsn(pg.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]) < lsn:
            if time.monotonic() > deadline:
                raise SluiceError(f"slot {self.slot}: {self.conn.describe()} did not flush its WAL up to a chunk's "
                                  f"micro-batch end within {FLUSH_WAIT_S:.0f} s")
            time.sleep(0.01)

    # ---------------------------------------------------------------------------------------------- commits
    def committed(self, pg: Any, state: Backfill) -> None:
        """The batch that ends at `state` is committed: the snapshot of its chunk and those of earlier chunks are let
        go (a later batch's, planned already, is kept), and the signal rows it took are deleted."""
        if state.chunk is not None and state.chunk.snapshot in self._holders:
            for snapshot in list(self._holders):  # in the order the chunks were planned
                self._holders.pop(snapshot).cancel()
                if snapshot == state.chunk.snapshot:
                    break
        if state.signals and self.signal_table is not None:
            schema, name = self.signal_table.split(".", 1)
            try:
                pg.execute(f"DELETE FROM {quote_ident(schema)}.{quote_ident(name)} WHERE id::text = ANY(%s)",
                           (list(state.signals),))
            except Exception as e:  # the ids stay in the offsets, so the rows are not taken twice
                log.warning("slot %s: deleting signal rows %s from %s failed (%s); grant DELETE on it to the query's "
                            "role", self.slot, ", ".join(state.signals), self.signal_table, self.conn.scrub(e))

    def close(self) -> None:
        for holder in self._holders.values():
            holder.cancel()
        self._holders.clear()
