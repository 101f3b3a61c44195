"""The executors' side of a change stream: a snapshot split read in the slot's exported snapshot, or a WAL range's
changes fetched from the slot (or a copy of it) and decoded (_pgoutput.py)."""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from sluice.connector import (
    DataLossError,
    DeadLetterRoute,
    DeadLetterWriter,
    Split,
    read_with_letters,
    to_arrow_schema,
)
from sluice.connectors.postgres._client import PostgresError, quote_literal, sqlstate_of
from sluice.connectors.postgres._pgmessages import MessageDecoder
from sluice.connectors.postgres._pgoutput import (
    COMMIT_TIME,
    LSN,
    OP,
    TABLE,
    UNCHANGED,
    XID,
    ChangeDecoder,
    format_lsn,
    none_unchanged,
    parse_lsn,
)
from sluice.connectors.postgres._pool import Lease
from sluice.connectors.postgres._source import PostgresSplitReader, describe_columns
from sluice.connectors.postgres.changes._backfill import Chunk, chunk_where
from sluice.connectors.postgres.changes._columns import Renamed, column_rows
from sluice.connectors.postgres.changes._options import ChangeOptions
from sluice.connectors.postgres.changes._publication import ChangeStream
from sluice.connectors.postgres.changes._slot import DECODING_SESSION, NO_FREE_SLOT, busy_retry

log = logging.getLogger("sluice.postgres")

DECODE_SLICE = 65_536  # messages decoded at a time
# A fetch range smaller than this is not worth a copied slot: copying and advancing one costs ~0.1 s, and the copy
# decodes (without sending) everything from the slot's restart point up to the range again.
FETCH_RANGE_MIN_WAL = 16 << 20


# ------------------------------------------------------------------------------------------------ partitions
@dataclass
class SnapshotPartition(InputPartition):
    table: str
    split: Split
    lsn: int

    def __init__(self, table: str, split: Split, lsn: int) -> None:
        super().__init__(f"snapshot:{table}:{split.split_id}")
        self.table, self.split, self.lsn = table, split, lsn


@dataclass
class ChangesPartition(InputPartition):
    start: int
    end: int
    chunk: Chunk | None  # a chunk of a snapshot on demand, read before the changes (_backfill.py)
    renames: dict[str, Renamed]  # columns renamed since the batch's start offset was written (_columns.py)

    def __init__(self, start: int, end: int, chunk: Chunk | None = None,
                 renames: dict[str, Renamed] | None = None) -> None:
        super().__init__(f"changes:{format_lsn(start)}-{format_lsn(end)}")
        self.start, self.end, self.chunk, self.renames = start, end, chunk, renames or {}


def wal_ranges(start: int, end: int, most: int) -> list[tuple[int, int]]:
    """[start, end) cut into at most `most` consecutive ranges of equal WAL bytes, none under FETCH_RANGE_MIN_WAL."""
    count = max(1, min(most, (end - start) // FETCH_RANGE_MIN_WAL))
    cuts = [start + (end - start) * i // count for i in range(count)] + [end]
    return list(itertools.pairwise(cuts))


def _close_fetched(done: Future[RangeFetch]) -> None:
    if not done.cancelled() and done.exception() is None:
        done.result().close()


class RangeFetch:
    """One fetch range's peek, executed: its first record batch in hand, the rest still streaming from the server on
    the ADBC session. Closing ends the session's use: a session that streamed to the end cleanly goes back to the
    process's pool, unless it must end (`reusable` false: it holds a temporary slot)."""

    def __init__(self, lease: Lease, cur: Any, batches: Any, first: pa.RecordBatch | None, reusable: bool) -> None:
        self._lease, self._cur, self._batches, self._first = lease, cur, batches, first
        self._reusable = reusable
        self._drained = False

    def arrays(self) -> Iterator[pa.Array]:
        """The messages (`data` bytea), batch by batch."""
        if self._first is not None:
            yield self._first.column(0)
            self._first = None
        for batch in self._batches:
            yield batch.column(0)
        self._drained = True

    def close(self, clean: bool = False) -> None:
        """End the fetch; `clean`: its user read it to the end without an error."""
        self._cur.close()
        self._lease.release(clean and self._drained and self._reusable)

    def __enter__(self) -> RangeFetch:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(clean=exc_type is None)


def snapshot_gone(slot: str, error: Exception) -> PostgresError:
    return PostgresError(
        f"the initial snapshot of slot '{slot}' is gone ({error}); it lives only until micro-batch 0 is committed (or "
        "snapshot.timeout-s after its last split), and the query stopped before that. Start over: drop the slot "
        f"(sluice postgres drop-slot {slot} --url ...) and the checkpoint")


class ChangeReader:
    """Reads one partition of a micro-batch on an executor: a snapshot split or a range of committed changes."""

    def __init__(self, stream: ChangeStream, options: ChangeOptions, schema: StructType,
                 dead_letters: DeadLetterRoute | None = None) -> None:
        """`dead_letters`: where changes with a value that cannot be typed go (errors.tolerance=all)."""
        self.stream = stream
        self.options = options
        self.schema = schema
        self.arrow_schema = to_arrow_schema(schema)
        self.dead_letters = dead_letters

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SnapshotPartition):
            return self._read_snapshot(partition)
        assert isinstance(partition, ChangesPartition)
        if self.stream.messages:  # no value to type: nothing is sent aside
            return self._read_messages(partition)
        # The dead letters' target names what the stream reads; each letter's record names its table.
        return read_with_letters(self.dead_letters, self.stream.slot, True, ", ".join(self.stream.tables),
                                 lambda letters: self._read_changes(partition, letters))

    def _read_snapshot(self, part: SnapshotPartition) -> Iterator[pa.RecordBatch]:
        try:
            yield from self._table_rows(part.table, part.split, "insert", part.lsn)
        except PostgresError as e:
            if "shared snapshot" in str(e):
                raise snapshot_gone(self.stream.slot, e) from None
            raise

    def _table_rows(self, table: str, split: Split, op: str, lsn: int) -> Iterator[pa.RecordBatch]:
        """A split of `table` read as format("postgres") reads it, as change rows: `op`, `_lsn` = `lsn`, no xid."""
        cols = self.stream.table_columns[table]
        table_schema = StructType([self.schema[name] for name, _ in cols])
        reader = PostgresSplitReader(self.stream.conn, self.stream.table_options[table], list(cols), table_schema)
        for batch in reader.read(split, 0, 1):
            n = batch.num_rows
            by_name = {name: batch.column(name) for name, _ in cols}
            by_name |= {OP: pa.array([op] * n, pa.string()), LSN: pa.array([lsn] * n, pa.int64()),
                        COMMIT_TIME: pa.nulls(n, pa.timestamp("us", tz="UTC")), XID: pa.nulls(n, pa.int64()),
                        TABLE: pa.array([table] * n, pa.string()), UNCHANGED: none_unchanged(n)}
            yield pa.RecordBatch.from_arrays(
                [by_name[f.name] if f.name in by_name else pa.nulls(n, f.type) for f in self.arrow_schema],
                schema=self.arrow_schema)

    def _read_chunk(self, chunk: Chunk, lsn: int) -> Iterator[pa.RecordBatch]:
        """A chunk of a snapshot on demand, as `read` rows at the batch's start `lsn`, in the snapshot taken when the
        batch was planned; when that is gone (the driver that held it died), in a new one (_backfill.py says what
        that changes)."""
        where = chunk_where(chunk, self.stream.primary_keys.get(chunk.table, ()),
                            dict(self.stream.table_columns[chunk.table]))
        held = Split(f"chunk of {chunk.table}", {"snapshot": chunk.snapshot, "channel": chunk.channel, "where": where})
        try:
            yield from self._table_rows(chunk.table, held, "read", lsn)
        except PostgresError as e:
            if "shared snapshot" not in str(e):
                raise
            log.warning("slot %s: the snapshot of a chunk of %s is gone (its driver stopped); the replayed micro-batch "
                        "reads the chunk in a new snapshot", self.stream.slot, chunk.table)
            yield from self._table_rows(chunk.table, Split(held.split_id, {"where": where}), "read", lsn)

    def _read_changes(self, part: ChangesPartition, letters: DeadLetterWriter | None) -> Iterator[pa.RecordBatch]:
        """The batch's changes, range by range (wal_ranges), each range's fetch running while the one before it is
        decoded and written. A range holds the transactions whose commit record starts in it: its decoder keeps only
        those, and its slot copy, advanced to the range's start, skips the ones before on the server."""
        s = self.stream
        ranges = wal_ranges(part.start, part.end, self.options.fetch_ranges)
        table_columns = {t: [c for c, _ in s.table_columns[t]] for t in s.tables}
        whole_publication = None if self.options.table else s.publication
        if part.chunk is not None:  # before every change of the batch: _backfill.py says why
            yield from self._read_chunk(part.chunk, part.start)
        pool = ThreadPoolExecutor(1, thread_name_prefix="sluice-fetch")
        ahead: Future[RangeFetch] | None = None
        try:
            for i, (low, high) in enumerate(ranges):
                fetch = ahead.result() if ahead is not None else self._fetch(low, high, copy=False)
                ahead = pool.submit(self._fetch, *ranges[i + 1], copy=True) if i + 1 < len(ranges) else None
                decoder = ChangeDecoder(self.arrow_schema, s.columns, low, high, table_columns, self._gone_columns,
                                        whole_publication, s.primary_keys, letters,
                                        emit_truncates=self.options.truncate == "emit", renames=part.renames,
                                        types=s.type_ids, current_types=self._current_types)
                with fetch:
                    for messages in fetch.arrays():
                        # Slices let Spark convert and write one while the next is decoded.
                        for first in range(0, len(messages), DECODE_SLICE):
                            yield from decoder.feed(messages.slice(first, DECODE_SLICE))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            if ahead is not None:  # the query stopped reading: close the next range's session when it is open
                ahead.add_done_callback(_close_fetched)

    def _read_messages(self, part: ChangesPartition) -> Iterator[pa.RecordBatch]:
        """A batch of logical decoding messages, in one fetch from the slot itself, moved to the batch's start first:
        the server sends a non-transactional message when the slot is at or before the start of its WAL record, so a
        slot behind would send again a message the batch before ended inside of (its LSN, the record's end, cannot
        tell). Spark runs a batch only once every batch before it is committed: the slot may move there."""
        s = self.stream
        at = format_lsn(part.start)
        with s.conn.pooled() as pg:
            busy_retry(lambda: pg.execute(
                "SELECT CASE WHEN confirmed_flush_lsn < %s::pg_lsn THEN (pg_replication_slot_advance(slot_name, "
                "%s::pg_lsn)).end_lsn::text END FROM pg_replication_slots WHERE slot_name = %s",
                (at, at, s.slot)).fetchall(), f"moving slot '{s.slot}' to {at}", s.conn)
        decoder = MessageDecoder(s.messages, part.start, part.end, s.publication)
        with self._fetch(part.start, part.end, copy=False) as fetch:
            for messages in fetch.arrays():
                for first in range(0, len(messages), DECODE_SLICE):
                    yield from decoder.feed(messages.slice(first, DECODE_SLICE))

    def _fetch(self, low: int, high: int, *, copy: bool) -> RangeFetch:
        """The pgoutput messages of the transactions committed before `high`, streaming in record batches (a large
        transaction never sits in memory whole); with `copy`, from a temporary copy of the slot advanced to `low`
        (dropped with the session), so the server sends only [low, high). Returns once the first batch is in, that
        is once the server finished the peek."""
        s = self.stream
        # A copy is a temporary slot, which lives as long as its session: that session ends with the fetch.
        lease = s.conn.lease(s.conn.pool_key("adbc", session=DECODING_SESSION))
        cur = lease.conn.cursor()
        try:
            slot = self._copy_slot(cur, low) if copy else s.slot
            busy_retry(lambda: cur.execute(f"SELECT data FROM {s.peek(format_lsn(high), None, slot)}"),
                        f"reading changes of slot '{slot}'", s.conn)
            batches = iter(cur.fetch_record_batch())
            first = next(batches, None)
            if slot == s.slot:
                # Checked after the peek (it computes its whole result before the first row), which starts at the
                # slot's position: moved past `low` by then, the peek missed the changes in between; moved later,
                # it had them all. The ADBC session is busy streaming: ask on another.
                with s.conn.pooled() as pg:
                    self._check_position(pg.cursor(), s.slot, low)
            return RangeFetch(lease, cur, batches, first, reusable=slot == s.slot)
        except BaseException:
            cur.close()
            lease.release(clean=False)
            raise

    def _gone_columns(self, table: str, names: list[str]) -> list[str]:
        """Which of `names` `table` no longer has (asked only when a change carries a column the schema lacks)."""
        with self.stream.conn.pooled() as pg:
            present = {name for name, _ in describe_columns(pg.cursor(), self.stream.table_options[table])}
        return [c for c in names if c not in present]

    def _current_types(self, table: str) -> dict[str, tuple[int, int]]:
        """`table`'s columns' (type oid, typmod) now (asked only when a Relation message differs from the schema)."""
        with self.stream.conn.pooled() as pg:
            return {col: (oid, mod) for _, _, col, gone, oid, mod in column_rows(pg, table) if not gone}

    def _copy_slot(self, cur: Any, low: int) -> str:
        """A temporary copy of the slot, at `low`; the slot itself when the server has no slot free for it."""
        s = self.stream
        copy = f"sluice_tmp_{uuid.uuid4().hex[:16]}"
        try:
            # ADBC reads a function's record result as a nested row it cannot convert: select a constant.
            cur.execute(f"SELECT 1 FROM pg_copy_logical_replication_slot({quote_literal(s.slot)}, "
                        f"{quote_literal(copy)}, true)")
            cur.fetchall()
        except Exception as e:
            if sqlstate_of(e) != NO_FREE_SLOT:
                raise PostgresError(f"copying slot '{s.slot}' on {s.conn.describe()} failed: {s.conn.scrub(e)}; "
                                    "set fetch-ranges=1 to read each micro-batch in one fetch, without copies",
                                    sqlstate_of(e)) from None
            log.warning("no replication slot free for a copy of slot %s on %s (max_replication_slots): the server "
                        "decodes this micro-batch from its start again for the range from %s; raise "
                        "max_replication_slots or set fetch-ranges=1", s.slot, s.conn.describe(), format_lsn(low))
            return s.slot
        if self._check_position(cur, copy, low):  # the copy starts where the slot was: before `low`, as it should
            cur.execute(f"SELECT 1 FROM pg_replication_slot_advance({quote_literal(copy)}, "
                        f"{quote_literal(format_lsn(low))}::pg_lsn)")
            cur.fetchall()
        return copy

    def _check_position(self, cur: Any, slot: str, low: int) -> bool:
        """Whether `slot` is still at or before `low` (else data loss: someone else moved the query's slot while a
        micro-batch was read; the planning checked it before)."""
        cur.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                    f"WHERE slot_name = {quote_literal(slot)}")
        rows = cur.fetchall()
        at = parse_lsn(rows[0][0]) if rows and rows[0][0] else None
        if at is not None and at <= low:
            return True
        where = "does not exist any more" if at is None else f"is at {format_lsn(at)}"
        what = (f"replication slot '{self.stream.slot}' {where}, past the start {format_lsn(low)} of the changes this "
                "micro-batch reads (another consumer moved it while the batch was read): the changes in between are "
                "gone for this query")
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{what}. Give each query its own slot; set .option('failOnDataLoss', 'false') to go "
                                "on without them")
        log.warning("%s; going on without them (failOnDataLoss=false)", what)
        return False
