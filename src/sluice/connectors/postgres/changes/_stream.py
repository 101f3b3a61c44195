"""The driver's side of a change stream: where micro-batches start and end (offsets are LSNs, with the snapshot's
splits while micro-batch 0's snapshot is read), the slot moved as Spark commits, and the partitions of a batch."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from sluice.connector import (
    DataLossError,
    DeadLetterRoute,
    HoldingHeartbeat,
    OptionError,
    ReadLimit,
    ReadObserver,
    SluiceError,
    SourceReport,
    Split,
    StreamReaderCore,
)
from sluice.connectors.postgres._client import PostgresError, qualified, sqlstate_of
from sluice.connectors.postgres._options import ReadOptions
from sluice.connectors.postgres._pgoutput import format_lsn, parse_lsn
from sluice.connectors.postgres._snapshot import SharedSnapshot, SnapshotHolder
from sluice.connectors.postgres._source import PostgresEnumerator
from sluice.connectors.postgres.changes._backfill import Backfill, Backfiller
from sluice.connectors.postgres.changes._columns import renamed
from sluice.connectors.postgres.changes._messages import cut_messages, whole_units
from sluice.connectors.postgres.changes._offset import ChangeOffset, SnapshotSplit
from sluice.connectors.postgres.changes._options import ChangeOptions
from sluice.connectors.postgres.changes._publication import ChangeStream, table_opts
from sluice.connectors.postgres.changes._read import ChangeReader, ChangesPartition, SnapshotPartition, snapshot_gone
from sluice.connectors.postgres.changes._slot import SlotGuard, busy_retry, holder_of, slot_lag, slot_state

log = logging.getLogger("sluice.postgres")

# Most snapshot splits per table when max-changes-per-trigger cuts the snapshot: every snapshot offset carries them.
MAX_SNAPSHOT_SPLITS = 1_000


class ChangeStreamReader(StreamReaderCore[ChangeOffset, InputPartition]):
    """The reader Spark drives: offsets and micro-batch planning on the driver; ChangeReader reads on the executors.
    The lag reported after each commit is the slot's against the server's WAL."""

    cap_options = ("max-changes-per-trigger",)

    def __init__(self, stream: ChangeStream, options: ChangeOptions, schema: StructType,
                 reads: ReadObserver | None = None, dead_letters: DeadLetterRoute | None = None) -> None:
        """`reads`: where read tasks report what they fetch (sluice.metrics); None: nowhere. `dead_letters`: where
        changes with a value that cannot be typed go (errors.tolerance=all); None: they fail the read."""
        super().__init__(source=("postgres_changes", stream.slot), max_rows=options.max_changes_per_trigger,
                         reads=reads)
        self.stream = stream
        self.options = options
        self.schema = schema
        self._reader = ChangeReader(stream, options, schema, dead_letters)  # pickled with this reader to the executors
        self._holder: SnapshotHolder | None = None
        self._reported: dict[str, Any] | None = None
        self._initial: ChangeOffset | None = None
        self._guard = SlotGuard(stream.conn, stream.slot)  # held from the first offset on, released by stop()
        self._log_restart_points = options.slot_log_restart_point  # off when the server cannot
        self._nothing_before: int | None = None  # the WAL position up to which the last peek found no change
        # The slot recorded as the MetaService job's (option 'job'), for `sluice doctor`: at the start and while
        # micro-batches commit.
        self._owner = (HoldingHeartbeat(options.meta, options.job, "postgres-slot", stream.conn.dbname, stream.slot)
                       if options.job else None)
        # Snapshots on demand (_backfill.py); a stream of messages reads no table.
        self._backfill = None if stream.messages else Backfiller(
            stream.conn, stream.tables, stream.table_columns, stream.primary_keys,
            chunk_size=options.snapshot_chunk_size, signal_table=options.signal_table,
            new_tables=options.snapshot_new_tables == "incremental", timeout_s=options.snapshot_timeout_s,
            slot=stream.slot)

    # ------------------------------------------------------------------ driver
    def parse_offset(self, raw: dict) -> ChangeOffset:
        return ChangeOffset.from_json(raw)

    def spark_end(self, end: ChangeOffset, start: ChangeOffset) -> dict:
        """Spark's own `start` back when the position did not move, except inside the snapshot (the same LSN, a
        snapshot batch further), when moving past WAL the publication did not write (a quiet batch) and when a chunk
        of a snapshot on demand is read (json_or)."""
        return end.to_json() if start.in_snapshot or end.quiet else end.json_or(start)

    def first_offset(self) -> ChangeOffset:
        """Where micro-batch 0 starts. Spark asks again when it replays micro-batch 0 (same run or a restart), so
        an existing slot whose snapshot is still held gives the same answer."""
        self._guard.hold()
        if self._owner is not None:
            try:
                self._owner.beat(force=True)
            except SluiceError as e:
                raise OptionError(f"option 'job' ({self._owner.job_id}): {e}") from None
        if self._initial is None:
            self._initial = replace(self._start(), tables=self.stream.tables, columns=self.stream.identities or None)
        return self._initial

    def _start(self) -> ChangeOffset:
        s = self.stream
        with s.conn.connect_psycopg() as pg:
            state = slot_state(pg, s.slot)
            snapshot = self.options.snapshot and not s.messages  # a stream of messages reads no table
            if state is not None:
                if not snapshot:
                    return ChangeOffset(state.confirmed)
                held = holder_of(pg, s.slot)
                if held is None:
                    raise OptionError(
                        f"replication slot '{s.slot}' exists already and holds no snapshot: a first start with "
                        "snapshot=true needs a new slot (its exported snapshot is where the changes begin), and a "
                        "query that stopped before micro-batch 0 committed cannot replay it any more. Drop the slot "
                        f"(sluice postgres drop-slot {s.slot} --url ...) and the checkpoint, or set snapshot=false "
                        f"to stream from the slot's position {format_lsn(state.confirmed)}")
                return ChangeOffset(state.confirmed, snapshot=held[0], channel=held[1])
            if not snapshot:
                return ChangeOffset(parse_lsn(self._create_slot(pg)))
        holder = SnapshotHolder(s.conn, self.options.snapshot_timeout_s, slot=s.slot,
                                failover=self.options.slot_failover)
        holder.release_pipes()
        self._holder = holder
        shared = holder.shared
        if shared.lsn is None:  # a holder given `slot` creates it and prints its consistent point after the snapshot
            raise PostgresError(f"the snapshot holder of replication slot '{s.slot}' reported no consistent point "
                                "for the slot it created")
        return ChangeOffset(parse_lsn(shared.lsn), snapshot=shared.snapshot_id, channel=shared.channel)

    def _create_slot(self, pg: Any) -> str:
        try:
            # (name, plugin, temporary, two-phase, failover): the fifth argument exists from PostgreSQL 17 on.
            failover = ", false, false, true" if self.options.slot_failover else ""
            lsn = pg.execute(f"SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput'{failover})",
                             (self.stream.slot,)).fetchone()[0]
        except Exception as e:
            raise PostgresError(f"could not create replication slot '{self.stream.slot}' on "
                                f"{self.stream.conn.describe()}: {self.stream.conn.scrub(e)}", sqlstate_of(e)) from None
        log.info("created replication slot %s at %s", self.stream.slot, lsn)
        return lsn

    def available_now_end(self) -> ChangeOffset:
        with self.stream.conn.connect_psycopg() as pg:
            return ChangeOffset(parse_lsn(pg.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]))

    def next_end(self, at: ChangeOffset, limit: ReadLimit) -> ChangeOffset:
        pg = self._guard.hold()
        if at.in_snapshot:  # the snapshot alone, then changes from its LSN
            return replace(self._snapshot_end(at, self.rows_of(limit)), tables=self.stream.tables,
                           columns=self.stream.identities or None)
        begin = self._advance(pg, at.lsn)  # Spark committed every batch before `start`: the slot may move
        flush = parse_lsn(pg.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
        end, quiet = self._changes_end(pg, begin, flush, limit)
        backfill = self._requests(pg, at, flush)
        if backfill.queue and self._backfill is not None:
            taken = self._backfill.next_chunk(pg, backfill)
            if taken is not None:  # this batch reads a chunk, and reaches the WAL its snapshot saw
                backfill, high = taken
                self._backfill.wait_flushed(pg, high)
                end, quiet = max(end, high), False
        if self._reported is not None:
            self._reported["lsn"] = format_lsn(end)
        return ChangeOffset(end, quiet=quiet, tables=self.stream.tables, backfill=backfill,
                            columns=self.stream.identities or None)

    def _requests(self, pg: Any, at: ChangeOffset, wal: int) -> Backfill:
        """The snapshots on demand as `at` left them, with new tables (at a restart) and new signals taken."""
        state = replace(at.backfill, chunk=None)
        if self._backfill is None:
            return state
        if at.tables != self.stream.tables:  # the first planning after a (re)start
            state = self._backfill.at_start(state, at.tables)
        return self._backfill.poll(pg, state, wal)

    def _changes_end(self, pg: Any, begin: int, flush: int, limit: ReadLimit) -> tuple[int, bool]:
        """Where the batch's changes end, and whether it is quiet (no change, but past WAL of other tables)."""
        s = self.stream
        upto = flush if self.target is None else min(flush, self.target.lsn)
        if upto <= begin or upto == self._nothing_before:  # no WAL since the last look found no change
            return begin, False
        if s.messages:
            end = cut_messages(pg, s, begin, upto, self.rows_of(limit))
        else:
            end = self._cut(pg, begin, upto, self.rows_of(limit))
        if end == begin:
            self._nothing_before = upto  # Spark polls every few ms: peek again only once the WAL moved
        elif self._log_restart_points:  # a batch with changes (never an idle poll: the record is WAL too)
            self._log_restart_point(pg)
        quiet = end == begin and upto - begin >= self.options.quiet_advance_wal_bytes
        if quiet:  # the peek saw no transaction of the publication before `upto`: nothing to read up to there
            log.info("slot %s: no change of the publication's tables in %d bytes of WAL; moving on to %s", s.slot,
                     upto - begin, format_lsn(upto))
            end = upto
        return end, quiet

    def _log_restart_point(self, pg: Any) -> None:
        """Log a running-transactions record: where the slot can restart decoding. Every peek decodes from the slot's
        restart_lsn, which moves only past such records; the server logs one every 15 s, so without this a batch
        re-decoded up to 15 s of WAL before reaching its own (measured: docs/postgres.md, freshness)."""
        import psycopg

        if pg.info.server_version < 160000:  # pg_log_standby_snapshot() is PostgreSQL 16's
            self._log_restart_points = False
            return
        try:
            lsn = pg.execute("SELECT pg_log_standby_snapshot()::text").fetchone()[0]
        except psycopg.errors.InsufficientPrivilege:
            self._log_restart_points = False
            log.warning("slot %s: this role may not run pg_log_standby_snapshot(), so each micro-batch decodes from "
                        "the last running-transactions record the server logged (up to 15 s of WAL back). GRANT "
                        "EXECUTE ON FUNCTION pg_log_standby_snapshot() TO the role, or set "
                        "slot.log-restart-point=false to silence this.", self.stream.slot)
            return
        if self._reported is not None:
            self._reported["restart_point"] = lsn

    def _snapshot_end(self, start: ChangeOffset, budget: int | None) -> ChangeOffset:
        """Where a snapshot micro-batch ends: after the whole snapshot, or with a budget after the splits (planned
        once, then carried in the offsets) whose estimated rows fit it, at least one."""
        after = ChangeOffset(start.lsn)
        if budget is None:
            return after
        splits = start.splits if start.splits is not None else self._plan_snapshot(start, budget)
        taken, rows = start.done, 0
        while taken < len(splits) and (taken == start.done or rows + splits[taken].rows <= budget):
            rows += splits[taken].rows
            taken += 1
        if taken == len(splits):
            return after
        return ChangeOffset(start.lsn, start.snapshot, start.channel, splits, taken)

    def _plan_snapshot(self, start: ChangeOffset, budget: int) -> tuple[SnapshotSplit, ...]:
        """Every split of the snapshot, about `budget` rows each."""
        shared = start.shared_snapshot()
        out: list[SnapshotSplit] = []
        with self.stream.conn.connect_psycopg() as pg:
            for table in self.stream.tables:
                schema, name = table.split(".", 1)  # exact names, as resolve() joined them
                (rows,) = pg.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class c JOIN pg_namespace n "
                                     "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                                     (schema, name)).fetchone()
                if not rows:  # never analyzed (or empty): count, once
                    (rows,) = pg.execute(f"SELECT count(*) FROM {qualified(schema, name)}").fetchone()
                wanted = self.options.num_partitions or min(MAX_SNAPSHOT_SPLITS, max(1, -(-rows // budget)))
                splits = self._discover(table, table_opts(self.options, table, wanted), shared)
                out += [SnapshotSplit(table, split.info["where"], rows // len(splits)) for split in splits]
        return tuple(out)

    def _discover(self, table: str, read_opts: ReadOptions, shared: SharedSnapshot) -> list[Split]:
        """The snapshot splits of one table, cut as format("postgres")'s reader cuts them."""
        enumerator = PostgresEnumerator(self.stream.conn, read_opts, list(self.stream.table_columns[table]),
                                        list(self.stream.primary_keys[table]))
        try:
            return enumerator.discover_in(shared)
        except PostgresError as e:
            raise snapshot_gone(self.stream.slot, e) from None

    def _advance(self, pg: Any, begin: int) -> int:
        """Check the slot (data loss), move it to `begin`, report retained WAL; returns where reading begins."""
        s = self.stream
        state = slot_state(pg, s.slot)
        lost = None
        if state is None:
            lost = f"replication slot '{s.slot}' does not exist any more"
        elif state.invalidated:
            lost = f"replication slot '{s.slot}' was invalidated: {state.why_invalidated()}"
        elif state.confirmed > begin:
            lost = (f"replication slot '{s.slot}' is at {format_lsn(state.confirmed)}, past this query's position "
                    f"{format_lsn(begin)} (another consumer used it)")
        if lost:
            what = f"{lost}: the changes from {format_lsn(begin)} on cannot be read"
            if self.options.fail_on_data_loss:
                raise DataLossError(f"{what}. Set .option('failOnDataLoss', 'false') to go on from the slot's "
                                    "position (re-created if needed), or start over: drop the slot and the checkpoint "
                                    "and start with snapshot=true")
            log.warning("%s; going on from the slot's position (failOnDataLoss=false)", what)
            if state is None or state.invalidated:
                if state is not None:
                    pg.execute("SELECT pg_drop_replication_slot(%s)", (s.slot,))
                return parse_lsn(self._create_slot(pg))
            return state.confirmed
        assert state is not None
        if state.confirmed < begin:
            busy_retry(lambda: pg.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                                           (s.slot, format_lsn(begin))), f"advancing slot '{s.slot}'", s.conn)
        self._reported = {"lsn": format_lsn(begin), "slot": s.slot, "retained_wal_bytes": state.retained_bytes,
                          "wal_status": state.wal_status}
        log.info("slot %s: position %s, %d bytes of WAL retained (%s)", s.slot, format_lsn(begin),
                 state.retained_bytes, state.wal_status)
        if state.retained_bytes > self.options.retained_wal_warn_bytes:
            log.warning("replication slot %s holds back %d bytes of WAL on %s (more than retained-wal-warn-bytes=%d); "
                        "the query is behind, or stopped for long", s.slot, state.retained_bytes, s.conn.describe(),
                        self.options.retained_wal_warn_bytes)
        return begin

    def _cut(self, pg: Any, begin: int, upto: int, budget: int | None) -> int:
        """Where the next batch ends: `upto`, or after the last whole transaction within `budget` changes; `begin`
        when no transaction of the publication committed in between (no empty micro-batches)."""
        # A budget counts changes; the peek counts messages (a BEGIN and a COMMIT around each transaction's changes).
        # Without one, the first transaction tells whether there is anything new: only its BEGIN comes back.
        count = 1 if budget is None else 2 * budget + 16
        only_begins = " WHERE get_byte(data, 0) = 66" if budget is None else ""
        rows = busy_retry(lambda: pg.execute(
            "SELECT get_byte(data, 0), CASE WHEN get_byte(data, 0) = 66 THEN substring(data FROM 2 FOR 8) END "
            f"FROM {self.stream.peek(format_lsn(upto), count)}{only_begins}").fetchall(),
            f"peeking slot '{self.stream.slot}'", self.stream.conn)
        txns: list[list[int]] = []  # [commit LSN, changes] of each transaction from `begin` on
        for kind, final in rows:
            if kind == 66:  # B
                commit = int.from_bytes(final, "big")
                if commit >= begin:
                    txns.append([commit, 0])
            elif kind in (73, 85, 68, 84) and txns:  # I U D T
                txns[-1][1] += 1
        if not txns:
            return begin
        if budget is None:
            return upto
        taken = whole_units(txns, budget)
        if taken == len(txns) and len(rows) < count:
            return upto  # the peek saw everything before `upto`, and it all fits
        return txns[taken - 1][0] + 1

    def reportLatestOffset(self) -> dict | None:
        return self._reported

    def plan(self, first: ChangeOffset, last: ChangeOffset) -> Sequence[InputPartition]:
        begin, stop = first.lsn, last.lsn
        planned = first.splits if first.splits is not None else last.splits
        if first.in_snapshot and planned is not None:  # planned splits, some of them
            stop_at = last.done if last.splits is not None else len(planned)
            info = {"snapshot": first.snapshot, "channel": first.channel}
            return [SnapshotPartition(split.table, Split(f"split-{i}", {**info, "where": split.where}), begin)
                    for i, split in enumerate(planned[first.done:stop_at], first.done)]
        if first.in_snapshot:
            shared = first.shared_snapshot()
            return [SnapshotPartition(table, split, begin) for table in self.stream.tables
                    for split in self._discover(table, self.stream.table_options[table], shared)]
        # A chunk of a snapshot on demand goes with the batch whose end offset carries it.
        chunk = last.backfill.chunk if last.backfill.chunk != first.backfill.chunk else None
        if last.quiet and chunk is None:  # latestOffset saw no transaction of the publication in between
            return []
        if stop <= begin and chunk is None:
            return []
        renames = renamed(first.columns, self.stream.identities)
        for table, moved in renames.items():
            log.info("table %s: column(s) renamed since offset %s: %s; its changes from before come under the new "
                     "names", table, format_lsn(begin), moved.to)
        return [ChangesPartition(begin, stop, chunk, renames)]

    def committed(self, at: ChangeOffset) -> None:
        """Moves the slot to the committed position (the server may drop the WAL before it)."""
        if self._holder is not None and not at.in_snapshot:
            self._holder.cancel()  # micro-batch 0 is committed: the snapshot is not needed any more
            self._holder = None
        s = self.stream
        pg = self._guard.hold()
        state = slot_state(pg, s.slot)
        if state is not None and state.confirmed < at.lsn:
            busy_retry(lambda: pg.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                                          (s.slot, format_lsn(at.lsn))), f"advancing slot '{s.slot}'", s.conn)
        if self._backfill is not None:
            self._backfill.committed(pg, at.backfill)
        if self._owner is not None:
            try:
                self._owner.beat()
            except Exception as e:  # the query goes on; its slot then looks silent to sluice doctor
                log.warning("recording slot %s as job %s's in the MetaService failed: %s", s.slot,
                            self._owner.job_id, e)

    def lag(self, end: ChangeOffset) -> SourceReport | None:
        """The slot's against the server's WAL, on the session that holds the slot."""
        return slot_lag(self._guard.hold(), self.stream.slot)

    def close(self) -> None:
        if self._holder is not None:
            self._holder.release_pipes()
        if self._backfill is not None:
            self._backfill.close()
        self._guard.release()

    # ------------------------------------------------------------------ executors
    def read_partition(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._reader.read(partition)
