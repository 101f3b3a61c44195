"""`format("cassandra")` writes: upserts and deletes by primary key, every statement with its own write timestamp,
grouped into UNLOGGED batches of one partition each (FLIP-509's Cassandra case).

- Timestamps: every row carries `USING TIMESTAMP`, fixed when the row is encoded, so a retried batch or a
  replayed micro-batch writes the same cells with the same timestamps (Cassandra keeps the highest timestamp per
  cell: a retry is a no-op, and a replay never wins over a newer write). `client` numbers rows from the executor's
  clock, strictly increasing within a task; `micro-batch` derives them from the batch id and the row's position
  (a replay of batch n always loses to batch n+1); `write.timestamp-column` takes them from the data.
- Replays long after: a tombstone lasts gc_grace_seconds, so a streaming write keeps the last micro-batch
  committed (write.replay-guard, _replay.py) and writes nothing for an older one replayed.
- Batching (`batch.grouping`): `partition` makes each engine batch one partition key's rows (the engine's
  partition-ordered mode with sink.batch-by=key), sent as one UNLOGGED batch, which the token-aware driver routes
  to a replica of that partition: the coordinator applies it as one mutation. `mixed` sends batches of rows of any
  partitions (the coordinator fans out), `none` sends every row as its own statement, concurrently.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from sluice.connector import (
    ArrowRows,
    Batch,
    Encoded,
    RecordError,
    RefusedRecords,
    ReplayGuard,
    RetryableError,
    RetryEntries,
    SinkError,
    Store,
    TaskWriter,
    ThrottledError,
    WriteContext,
    WritePlan,
    delete_mask,
    marked_columns,
    marked_rows,
    micro_batch_numbers,
    refuse_truncate,
)
from sluice.connectors.cassandra._client import (
    Connection,
    classify,
    quote_ident,
    while_overloaded,
)
from sluice.connectors.cassandra._options import WriteOptions
from sluice.connectors.cassandra._refusals import bind_refusal, check_rows, column_values
from sluice.connectors.cassandra._replay import KeyspaceReplayGuard
from sluice.connectors.cassandra._types import CQLType

if TYPE_CHECKING:
    from cassandra.query import PreparedStatement

MICRO_BATCH_ROWS = 1 << 32  # rows one task may write in one micro-batch under write.timestamp=micro-batch


@dataclass(frozen=True)
class Statements:
    """The two statements a write runs, as CQL: the upsert and (with upsert.op-column) the delete."""

    insert: str
    delete: str | None


@dataclass(frozen=True)
class RowPlan:
    """How a DataFrame row becomes a statement's values, decided on the driver."""

    columns: tuple[str, ...]  # the table columns written, in the DataFrame's order
    types: dict[str, CQLType]
    primary_key: tuple[str, ...]
    op_column: str | None
    timestamp: str  # client | micro-batch | column
    timestamp_column: str | None
    ttl: int
    ttl_column: str | None
    ignore_nulls: bool
    unchanged_column: str | None = None  # upsert.unchanged-column: the columns a row names are left unset

    def statements(self, conn: Connection) -> Statements:
        names = ", ".join(quote_ident(c) for c in self.columns)
        marks = ", ".join("?" for _ in self.columns)
        insert = f"INSERT INTO {conn.target} ({names}) VALUES ({marks}) USING TIMESTAMP ? AND TTL ?"
        delete = None
        if self.op_column is not None:
            where = " AND ".join(f"{quote_ident(c)} = ?" for c in self.primary_key)
            delete = f"DELETE FROM {conn.target} USING TIMESTAMP ? WHERE {where}"
        return Statements(insert, delete)


class RowEncoder:
    """One task's encoder: Arrow chunk -> bound statements (serialized here, so a bad value fails with its row)."""

    def __init__(self, plan: RowPlan, prepared: tuple[PreparedStatement, PreparedStatement | None],
                 context: WriteContext, table: str, rows: ArrowRows | None = None) -> None:
        self.plan, self.insert, self.delete, self.table = plan, prepared[0], prepared[1], table
        self.context = context
        # errors.tolerance=all: the rows statements came from, so refused ones go aside as the user's columns.
        self.rows = rows
        self.rows_seen = 0
        self.last_timestamp = 0

    def _timestamps(self, batch: pa.RecordBatch) -> np.ndarray:
        n = batch.num_rows
        if self.plan.timestamp == "column":
            column = batch.column(self.plan.timestamp_column)  # no nulls: check_rows refused them
            if pa.types.is_timestamp(column.type):
                column = column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64())
            return column.cast(pa.int64()).to_numpy()
        if self.plan.timestamp == "micro-batch":
            return micro_batch_numbers(self.context.epoch, self.rows_seen, n, per_task=MICRO_BATCH_ROWS,
                                       option="write.timestamp",
                                       instead="write.timestamp=client or write.timestamp-column")
        start = max(time.time_ns() // 1000, self.last_timestamp + 1)
        return start + np.arange(n, dtype=np.int64)

    def __call__(self, batch: pa.RecordBatch) -> Encoded:
        from cassandra.query import UNSET_VALUE

        plan = self.plan
        if plan.op_column:
            refuse_truncate(batch.column(plan.op_column), plan.op_column, "cassandra")
        # Rows Cassandra cannot take go aside (errors.tolerance=all) before anything of the batch changes state.
        check_rows(batch, plan.primary_key, plan.timestamp_column if plan.timestamp == "column" else None,
                   self.table, self.rows_seen)
        values = {c: column_values(batch, c, plan.types[c], plan.primary_key, self.table) for c in plan.columns}
        stamps = self._timestamps(batch)
        n = batch.num_rows
        if plan.ttl_column:
            ttls = batch.column(plan.ttl_column).fill_null(0).cast(pa.int32()).to_pylist()
        else:
            ttls = [plan.ttl] * n
        deletes = np.zeros(n, dtype=bool)
        if plan.op_column:
            deletes = delete_mask(batch.column(plan.op_column)).to_numpy(zero_copy_only=False)
        if plan.ignore_nulls:
            for c in plan.columns:
                if c not in plan.primary_key:
                    values[c] = [UNSET_VALUE if v is None else v for v in values[c]]
        if plan.unchanged_column:  # an unset value writes no cell: the stored one stays
            marker = batch.column(plan.unchanged_column)
            for c in marked_columns(marker):
                if c in values and c not in plan.primary_key:
                    hit = marked_rows(marker, c).tolist()
                    values[c] = [UNSET_VALUE if h else v for v, h in zip(values[c], hit, strict=True)]
        stamp_list = stamps.tolist()
        upsert_rows = list(zip(*(values[c] for c in plan.columns), stamp_list, ttls, strict=True))
        delete, key_rows = self.delete, []
        if deletes.any():
            if delete is None:  # deletes come from plan.op_column, for which RowPlan.statements prepares a DELETE
                raise SinkError(f"rows to delete from {self.table} but no DELETE statement was prepared")
            key_rows = list(zip(*(values[c] for c in plan.primary_key), strict=True))
        statements, sizes = [], []
        failures: dict[int, BaseException] = {}
        for i in range(n):
            try:
                if deletes[i] and delete is not None:  # (delete is set whenever a row is one: checked above)
                    bound = delete.bind((stamp_list[i], *key_rows[i]))
                else:
                    bound = self.insert.bind(upsert_rows[i])
            except (TypeError, ValueError, OverflowError) as e:
                failures[i] = e
                continue
            statements.append(bound)
            sizes.append(sum(len(v) for v in bound.values if isinstance(v, bytes)) + 16)
        if failures:
            raise bind_refusal(batch, plan.primary_key, self.table, failures)
        if self.rows is not None:
            numbers, _ = self.rows.add(batch)
            for statement, number in zip(statements, numbers, strict=True):
                statement.sluice_row = number  # BoundStatement takes attributes: the row refused_rows gives back
        self.rows_seen += n
        self.last_timestamp = int(stamps[-1]) if plan.timestamp == "client" and n else self.last_timestamp
        return Encoded(statements, sizes)


class CassandraStore(Store):
    """One task's writer: each engine batch is one request (an UNLOGGED batch, or one statement), or with
    batch.grouping=none as many concurrent statements as it has rows."""

    name = "cassandra"

    def __init__(self, conn: Connection, grouping: str, consistency: int, rows: ArrowRows | None = None) -> None:
        self.conn, self.grouping, self.consistency = conn, grouping, consistency
        self.session = conn.session()
        self.rows = rows  # errors.tolerance=all: the rows of statements not yet acknowledged (RowEncoder.rows)

    @property
    def target(self) -> str:
        return self.conn.display

    def explain(self, error: SinkError) -> SinkError:
        if not isinstance(error.cause, ThrottledError):
            return error
        return SinkError(f"{error} The node refused requests as overloaded (its native-transport rate limit or "
                         "in-flight byte limit): let the write ride it out with a higher sink.max-retries and "
                         "sink.retry-delay-ms, or lower sink.requests.max-inflight.", store=error.store,
                         target=error.target, batch_records=error.batch_records, cause=error.cause)

    def refused_rows(self, entries: Sequence[Any]) -> pa.Table | Sequence[Mapping[str, object]]:
        if self.rows is None:
            return super().refused_rows(entries)
        return self.rows.take([statement.sluice_row for statement in entries])

    def _stored(self, statements: Sequence[Any]) -> None:
        if self.rows is not None and statements:
            self.rows.release([statement.sluice_row for statement in statements])

    def _execute(self, statement: Any, rows: int, stored: Sequence[Any] = ()) -> Future[None]:
        done: Future[None] = Future()
        response = self.session.execute_async(statement)

        def succeeded(_: object) -> None:
            self._stored(stored)
            done.set_result(None)

        response.add_callbacks(succeeded, lambda error: done.set_exception(classify(error, self.conn, rows)))
        return done

    def submit(self, batch: Batch) -> Future[None]:
        from cassandra.query import BatchStatement, BatchType

        statements = batch.entries
        if self.grouping != "none" and len(statements) > 1:
            request = BatchStatement(BatchType.UNLOGGED, consistency_level=self.consistency)
            for statement in statements:
                request.add(statement)
            return self._execute(request, len(statements), statements)
        if len(statements) == 1:
            return self._execute(statements[0], 1, statements)
        return self._each_of(statements, [self._execute(s, 1) for s in statements])

    def _each_of(self, statements: Sequence[Any], futures: list[Future[None]]) -> Future[None]:
        """A future that completes when all of `futures` (one per statement, in order) have: acknowledged when all
        were; else failed with the first failure that is neither per record nor passing, or with the statements
        refused for what they hold (RefusedRecords) and those that failed for a passing reason (RetryEntries):
        the others were stored and do not go again."""
        done: Future[None] = Future()
        outcomes: list[BaseException | None] = [None] * len(futures)
        remaining = [len(futures)]
        lock = threading.Lock()

        def finished(position: int, future: Future[None]) -> None:
            with lock:
                outcomes[position] = future.exception()
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                self._stored([s for s, error in zip(statements, outcomes, strict=True) if error is None])
                error = _outcome(outcomes)
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

        for position, future in enumerate(futures):
            future.add_done_callback(functools.partial(finished, position))
        return done


def _outcome(outcomes: list[BaseException | None]) -> BaseException | None:
    """What the statements of one request that ran one by one come to (CassandraStore._each_of)."""
    refused = [(i, e) for i, e in enumerate(outcomes) if isinstance(e, RecordError)]
    passing = [(i, e) for i, e in enumerate(outcomes) if isinstance(e, RetryableError)]
    other = [e for e in outcomes if e is not None and not isinstance(e, RecordError | RetryableError)]
    if other:
        return other[0]
    retry = None
    if passing:
        cause = passing[0][1]
        assert isinstance(cause, RetryableError)
        retry = RetryEntries(f"{len(passing)} of {len(outcomes)} statements failed for a passing reason: {cause}",
                             [i for i, _ in passing], cause)
    if refused:
        return RefusedRecords(f"{len(refused)} of {len(outcomes)} statements were refused: {refused[0][1]}",
                              [i for i, _ in refused], [e for _, e in refused], retry)
    return retry


_PREPARED: dict[tuple[int, str], PreparedStatement] = {}


def prepared(conn: Connection, cql: str, consistency: int) -> PreparedStatement:
    """`cql` prepared once per process and session (a prepare is a round trip to every node)."""
    session = conn.session()
    key = (id(session), cql)
    statement = _PREPARED.get(key)
    if statement is None:
        statement = while_overloaded(lambda: session.prepare(cql), conn, "prepare a statement")
        statement.consistency_level = consistency
        statement.is_idempotent = True  # every statement carries its own timestamp: repeating it changes nothing
        _PREPARED[key] = statement
    return statement


@dataclass(frozen=True)
class CassandraWritePlan(WritePlan):
    conn: Connection
    rows: RowPlan
    write: WriteOptions

    def replay_guard(self) -> ReplayGuard | None:
        return KeyspaceReplayGuard(self.conn, self.write.write_replay_guard_table) if self.write.write_replay_guard \
            else None

    def open_task(self, context: WriteContext) -> TaskWriter:
        from cassandra import ConsistencyLevel

        consistency = ConsistencyLevel.name_to_value[self.write.consistency]
        statements = self.rows.statements(self.conn)
        insert = prepared(self.conn, statements.insert, consistency)
        delete = prepared(self.conn, statements.delete, consistency) if statements.delete else None
        rows = ArrowRows() if self.config.errors.tolerates else None
        encoder = RowEncoder(self.rows, (insert, delete), context, self.conn.target, rows)
        return TaskWriter(encoder, CassandraStore(self.conn, self.write.batch_grouping, consistency, rows))
