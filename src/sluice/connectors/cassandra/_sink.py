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

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from sluice.connector import (
    Batch,
    Encoded,
    OptionError,
    ReplayGuard,
    SinkError,
    Store,
    TaskWriter,
    ThrottledError,
    WriteContext,
    WritePlan,
    delete_mask,
    first_null,
    micro_batch_numbers,
)
from sluice.connectors.cassandra._client import (
    Connection,
    classify,
    quote_ident,
    while_overloaded,
)
from sluice.connectors.cassandra._options import WriteOptions
from sluice.connectors.cassandra._replay import KeyspaceReplayGuard
from sluice.connectors.cassandra._types import CQLType, python_values

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

    def statements(self, conn: Connection) -> Statements:
        names = ", ".join(quote_ident(c) for c in self.columns)
        marks = ", ".join("?" for _ in self.columns)
        insert = f"INSERT INTO {conn.target} ({names}) VALUES ({marks}) USING TIMESTAMP ? AND TTL ?"
        delete = None
        if self.op_column is not None:
            where = " AND ".join(f"{quote_ident(c)} = ?" for c in self.primary_key)
            delete = f"DELETE FROM {conn.target} USING TIMESTAMP ? WHERE {where}"
        return Statements(insert, delete)


def _row_key(batch: pa.RecordBatch, keys: Sequence[str], row: int) -> str:
    values = {k: batch.column(k)[row].as_py() for k in keys if k in batch.schema.names}
    return f"the row with primary key {values}"


class RowEncoder:
    """One task's encoder: Arrow chunk -> bound statements (serialized here, so a bad value fails with its row)."""

    def __init__(self, plan: RowPlan, prepared: tuple[PreparedStatement, PreparedStatement | None],
                 context: WriteContext, table: str) -> None:
        self.plan, self.insert, self.delete, self.table = plan, prepared[0], prepared[1], table
        self.context = context
        self.rows_seen = 0
        self.last_timestamp = 0

    def _timestamps(self, batch: pa.RecordBatch) -> np.ndarray:
        n = batch.num_rows
        if self.plan.timestamp == "column":
            column = batch.column(self.plan.timestamp_column)
            if column.null_count:
                row = first_null(column)
                raise OptionError(f"write.timestamp-column '{self.plan.timestamp_column}' is null for "
                                  f"{_row_key(batch, self.plan.primary_key, row)}; every row needs a timestamp.")
            if pa.types.is_timestamp(column.type):
                column = column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64())
            return column.cast(pa.int64()).to_numpy()
        if self.plan.timestamp == "micro-batch":
            return micro_batch_numbers(self.context.epoch, self.rows_seen, n, per_task=MICRO_BATCH_ROWS,
                                       option="write.timestamp",
                                       instead="write.timestamp=client or write.timestamp-column")
        start = max(time.time_ns() // 1000, self.last_timestamp + 1)
        return start + np.arange(n, dtype=np.int64)

    def _check_keys(self, batch: pa.RecordBatch) -> None:
        for name in self.plan.primary_key:
            column = batch.column(name)
            if column.null_count:
                row = first_null(column)
                others = [k for k in self.plan.primary_key if k != name]
                raise OptionError(f"primary key column '{name}' is null in row {self.rows_seen + row} of this task "
                                  f"({_row_key(batch, others, row) if others else 'no other key columns'}) writing "
                                  f"into {self.table}: Cassandra has no null keys. Filter such rows out or fill "
                                  "them in.")

    def __call__(self, batch: pa.RecordBatch) -> Encoded:
        from cassandra.query import UNSET_VALUE

        plan = self.plan
        self._check_keys(batch)
        stamps = self._timestamps(batch)
        n = batch.num_rows
        if plan.ttl_column:
            ttls = batch.column(plan.ttl_column).fill_null(0).cast(pa.int32()).to_pylist()
        else:
            ttls = [plan.ttl] * n
        deletes = np.zeros(n, dtype=bool)
        if plan.op_column:
            deletes = delete_mask(batch.column(plan.op_column)).to_numpy(zero_copy_only=False)
        values = {c: python_values(batch.column(c), plan.types[c]) for c in plan.columns}
        if plan.ignore_nulls:
            for c in plan.columns:
                if c not in plan.primary_key:
                    values[c] = [UNSET_VALUE if v is None else v for v in values[c]]
        stamp_list = stamps.tolist()
        upsert_rows = list(zip(*(values[c] for c in plan.columns), stamp_list, ttls, strict=True))
        delete, key_rows = self.delete, []
        if deletes.any():
            if delete is None:  # deletes come from plan.op_column, for which RowPlan.statements prepares a DELETE
                raise SinkError(f"rows to delete from {self.table} but no DELETE statement was prepared")
            key_rows = list(zip(*(values[c] for c in plan.primary_key), strict=True))
        statements, sizes = [], []
        for i in range(n):
            try:
                if deletes[i] and delete is not None:  # (delete is set whenever a row is one: checked above)
                    bound = delete.bind((stamp_list[i], *key_rows[i]))
                else:
                    bound = self.insert.bind(upsert_rows[i])
            except (TypeError, ValueError, OverflowError) as e:
                raise OptionError(f"{_row_key(batch, plan.primary_key, i)} cannot be written into {self.table}: "
                                  f"{e}") from None
            statements.append(bound)
            sizes.append(sum(len(v) for v in bound.values if isinstance(v, bytes)) + 16)
        self.rows_seen += n
        self.last_timestamp = int(stamps[-1]) if plan.timestamp == "client" and n else self.last_timestamp
        return Encoded(statements, sizes)


class CassandraStore(Store):
    """One task's writer: each engine batch is one request (an UNLOGGED batch, or one statement), or with
    batch.grouping=none as many concurrent statements as it has rows."""

    name = "cassandra"

    def __init__(self, conn: Connection, grouping: str, consistency: int) -> None:
        self.conn, self.grouping, self.consistency = conn, grouping, consistency
        self.session = conn.session()

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

    def _execute(self, statement: Any, rows: int) -> Future[None]:
        done: Future[None] = Future()
        response = self.session.execute_async(statement)
        response.add_callbacks(lambda _: done.set_result(None),
                               lambda error: done.set_exception(classify(error, self.conn, rows)))
        return done

    def submit(self, batch: Batch) -> Future[None]:
        from cassandra.query import BatchStatement, BatchType

        statements = batch.entries
        if self.grouping != "none" and len(statements) > 1:
            request = BatchStatement(BatchType.UNLOGGED, consistency_level=self.consistency)
            for statement in statements:
                request.add(statement)
            return self._execute(request, len(statements))
        if len(statements) == 1:
            return self._execute(statements[0], 1)
        return _all_of([self._execute(s, 1) for s in statements])


def _all_of(futures: list[Future[None]]) -> Future[None]:
    """A future that completes when all of `futures` have, with the first failure if any failed."""
    done: Future[None] = Future()
    remaining = [len(futures)]
    failures: list[BaseException] = []
    lock = threading.Lock()

    def finished(future: Future[None]) -> None:
        with lock:
            error = future.exception()
            if error is not None:
                failures.append(error)
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            if failures:
                done.set_exception(failures[0])
            else:
                done.set_result(None)

    for future in futures:
        future.add_done_callback(finished)
    return done


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
        encoder = RowEncoder(self.rows, (insert, delete), context, self.conn.target)
        return TaskWriter(encoder, CassandraStore(self.conn, self.write.batch_grouping, consistency))
