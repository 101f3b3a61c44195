"""`format("postgres")` writes: the three modes of the sink-modes design on one transactional store.

- unordered: each engine batch is one COPY BINARY (ADBC, Arrow in) straight into the table when the Arrow
  types are exactly the table's, else into a per-connection temporary table and INSERT ... SELECT.
  At-least-once: a retried task writes its rows again.
- partition-ordered (with primary-key): each batch goes to a temporary table and is applied in one
  transaction: INSERT ... ON CONFLICT DO UPDATE for the last change of each key, DELETE for keys whose last
  change is a delete (upsert.op-column). The engine never has two batches of one key in flight, so per-key
  order holds. A truncate (upsert.op-column TRUNCATE_OP) empties the table in the transaction of its batch, which
  then applies only the changes after it; it needs one order across keys, so global-ordered mode (one batch in
  flight; staged or not), and partition-ordered and unordered modes refuse it.
- global-ordered + sink.transactional (and every mode(\"overwrite\")): tasks COPY into a staging table,
  tagged (write, epoch, task, attempt, row number), which carries the table's CHECK constraints and NOT NULLs
  (_stage.py: a row they refuse is refused by its task); the driver's commit moves the epoch's rows of the
  successful attempts into the table in one transaction, ordered by task then row, and records
  (table, write id, epoch) in `sluice_commit_log` in that same transaction. A replayed epoch finds its log
  row and only clears its staged rows. Overwrite deletes the old rows in the same transaction, so readers
  see the old table until the new one is committed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluice.connector import (
    GLOBAL_ORDERED,
    TRUNCATE_OP,
    ArrowRows,
    Batch,
    BlockingStore,
    Committer,
    Encoded,
    RecordError,
    TaskWriter,
    TruncateRefusedError,
    WriteContext,
    WritePlan,
)
from sluice.connectors.postgres._client import (
    Connection,
    PostgresError,
    classify,
    is_connection_error,
    qualified,
    quote_ident,
    quote_literal,
    refuses_record,
    sqlstate_of,
)
from sluice.connectors.postgres._options import WriteOptions
from sluice.connectors.postgres._pool import Lease
from sluice.connectors.postgres._table import TablePlan, schema_digest

log = logging.getLogger("sluice.postgres")

class PostgresStore(BlockingStore):
    """One task's writer: a connection per I/O thread, one COPY (plus SQL) per engine batch."""

    name = "postgres"
    supports_transactions = True

    def __init__(self, conn_info: Connection, plan: TablePlan, rows: ArrowRows, context: WriteContext,
                 connections: int, pooled: bool = False) -> None:
        super().__init__()
        self.conn_info = conn_info
        self.plan = plan
        self.rows = rows
        self.context = context
        self.io_threads = connections
        self._local = threading.local()
        self._all: list[Lease] = []
        self._lock = threading.Lock()
        self._written = 0
        self._truncates = False  # a staged batch held a truncate (upsert.op-column): the commit applies it
        # Staged and direct appends are single COPYs (autocommit); the temp-table path is a transaction.
        self._autocommit = bool(plan.stage_table) or plan.direct
        self._pool_key = conn_info.pool_key("psycopg" if plan.csv else "adbc", autocommit=self._autocommit)
        self._pooled = pooled  # a streaming query's micro-batches: the next task in this process reuses them

    @property
    def target(self) -> str:
        return f"{self.conn_info.host}:{self.conn_info.port}/{self.conn_info.dbname} {self.plan.display}"

    def _conn(self) -> Any:
        lease = getattr(self._local, "lease", None)
        if lease is None:
            lease = self.conn_info.lease(self._pool_key, pooled=self._pooled)
            self._local.lease = lease
            with self._lock:
                self._all.append(lease)
        return lease.conn

    def _drop_conn(self) -> None:
        lease = getattr(self._local, "lease", None)
        self._local.lease = None
        if lease is not None:
            with self._lock:
                if lease in self._all:
                    self._all.remove(lease)
            lease.release(clean=False)

    def write_batch(self, batch: Batch) -> None:
        table = self.rows.table(batch.entries)
        conn = self._conn()
        try:
            if self.plan.csv:
                self._copy_csv(conn, table)
            else:
                with conn.cursor() as cur:
                    self._ingest(conn, cur, table, batch.entries)
        except Exception as e:
            if is_connection_error(e):
                self._drop_conn()
            elif not self._autocommit:
                try:
                    conn.rollback()
                except Exception:
                    self._drop_conn()
            wrapped = classify(e)
            if wrapped is e and refuses_record(e):
                staged = (f" (staged in {self.plan.stage_table}, which carries the table's CHECK constraints)"
                          if self.plan.stage_table else "")
                raise RecordError(f"writing {batch.record_count} row(s) to {self.plan.display}: a row was refused"
                                  f"{staged} (SQLSTATE {sqlstate_of(e)}): {self.conn_info.scrub(e)}") from None
            if wrapped is e:
                raise PostgresError(f"writing {batch.record_count} row(s) to {self.plan.display} failed: "
                                    f"{self.conn_info.scrub(e)}", sqlstate=getattr(e, "sqlstate", None)) from None
            raise wrapped from None
        self._done(batch)

    def _ingest(self, conn: Any, cur: Any, table: pa.Table, entries: Sequence[int]) -> None:
        """COPY BINARY (ADBC) into the staging table, the table itself, or a temporary table applied by SQL."""
        plan = self.plan
        if plan.stage_table:
            cur.adbc_ingest(plan.stage_table, self._tagged(table, entries), mode="append", db_schema_name=plan.schema)
            if plan.truncates(table) is not None:
                self._truncates = True
        elif plan.direct:
            cur.adbc_ingest(plan.table, table, mode="append", db_schema_name=plan.schema)
        else:
            tmp = "sluice_tmp_" + schema_digest(plan.schema, plan.table, table.schema)
            seq = pa.array(entries, pa.int64())
            cur.adbc_ingest(tmp, table.append_column("_sluice_seq", seq), mode="create_append", temporary=True)
            for sql in plan.move_sql(f"pg_temp.{tmp}", "s._sluice_seq", plan.marked_in(table),
                                     truncates=plan.truncates(table) is not None):
                cur.execute(sql)
            cur.execute(f"TRUNCATE pg_temp.{tmp}")
            conn.commit()

    def _done(self, batch: Batch) -> None:
        self.rows.release(batch.entries)
        with self._lock:
            self._written += batch.record_count

    def _copy_csv(self, conn: Any, table: pa.Table) -> None:
        import pyarrow.csv as pacsv

        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False, batch_size=65536))
        cols = ", ".join(quote_ident(c) for c in table.column_names)
        with conn.cursor() as cur, cur.copy(f"COPY {self.plan.target} ({cols}) FROM STDIN (FORMAT csv)") as copy:
            copy.write(sink.getvalue())

    def _tagged(self, table: pa.Table, entries: Sequence[int]) -> pa.Table:
        n = table.num_rows
        ctx = self.context
        epoch = ctx.epoch if ctx.epoch is not None else -1
        return (table.append_column("_sluice_write", pa.repeat(pa.scalar(ctx.write_id, pa.string()), n))
                .append_column("_sluice_epoch", pa.repeat(pa.scalar(epoch, pa.int64()), n))
                .append_column("_sluice_task", pa.repeat(pa.scalar(ctx.partition_id, pa.int32()), n))
                .append_column("_sluice_attempt",
                               pa.repeat(pa.scalar(self.plan.attempt_tag(ctx.task_attempt_id), pa.int64()), n))
                .append_column("_sluice_seq", pa.array(entries, pa.int64())))

    def refused_rows(self, entries: Sequence[int]) -> pa.Table:
        return self.rows.take(entries)

    def pre_commit(self) -> Any:
        if not self.plan.stage_table:
            return None
        return {"task": self.context.partition_id, "attempt": self.plan.attempt_tag(self.context.task_attempt_id),
                "rows": self._written, "truncates": self._truncates}

    def close(self) -> None:
        super().close()
        with self._lock:
            leases, self._all = self._all, []
        # Every write_batch has returned (the I/O threads are joined): a connection still here is clean (a failed
        # statement rolled back, a broken connection dropped), so the process's next task may use it.
        for lease in leases:
            lease.release(clean=True)


class PostgresCommitter(Committer):
    """Driver side of staged writes: one transaction per write or micro-batch, guarded by the commit log."""

    def __init__(self, conn_info: Connection, plan: TablePlan, pooled: bool = False) -> None:
        self.conn_info = conn_info
        self.plan = plan
        self.pooled = pooled  # a streaming query's: the next micro-batch's commit reuses the connection

    def _where(self, context: WriteContext) -> str:
        epoch = context.epoch if context.epoch is not None else -1
        return f"_sluice_write = {quote_literal(context.write_id)} AND _sluice_epoch = {int(epoch)}"

    def commit(self, messages: list[Any], context: WriteContext) -> None:
        # SQL only, so psycopg (connects ~8x faster than ADBC). Statements with bind parameters double a '%' in
        # identifiers (psycopg's placeholder syntax); statements without are sent as they are.
        with self.conn_info.pooled(autocommit=False, pooled=self.pooled) as conn:
            self._commit_on(conn, messages, context)

    def commit_with(self, messages: list[Any], context: WriteContext, companion: Committer,
                    companion_messages: list[Any]) -> bool:
        """A staged dead-letter table in the same database: its rows and the write's in one transaction, so that
        no reader ever sees a refused record aside while the write's other rows are not committed, or the reverse."""
        if not isinstance(companion, PostgresCommitter) or companion.plan.stage_table is None \
                or not self.conn_info.same_database(companion.conn_info):
            return False
        with self.conn_info.pooled(autocommit=False, pooled=self.pooled) as conn:
            companion._commit_on(conn, companion_messages, context, finish=False)
            self._commit_on(conn, messages, context)
        return True

    def _commit_on(self, conn: Any, messages: list[Any], context: WriteContext, finish: bool = True) -> None:
        """The epoch's staged rows moved into the table and its commit-log row, in `conn`'s transaction: committed
        when `finish`, else left open for another committer's part (commit_with), rolled back on failure."""
        plan = self.plan
        assert plan.stage_table is not None
        stage = qualified(plan.schema, plan.stage_table)
        epoch = context.epoch if context.epoch is not None else -1
        where = self._where(context)
        rows = sum(int(m["rows"]) for m in messages)
        try:
            cur = conn.cursor()
            log_table = qualified(plan.schema, "sluice_commit_log").replace("%", "%%")
            cur.execute(f"INSERT INTO {log_table} (target, write_id, epoch, rows) VALUES (%s, %s, %s, %s) "
                        "ON CONFLICT DO NOTHING RETURNING 1", (plan.display, context.write_id, epoch, rows))
            if not cur.fetchall():
                cur.execute(f"DELETE FROM {stage} WHERE {where}")
                if finish:
                    conn.commit()
                log.info("postgres: %s epoch %s of %s was committed before; replay is a no-op", plan.display, epoch,
                         context.write_id)
                return
            pairs = ", ".join(f"({int(m['task'])}, {int(m['attempt'])})" for m in messages)
            chosen = f"{where} AND (_sluice_task, _sluice_attempt) IN ({pairs})" if pairs else "false"
            cur.execute(f"SELECT count(DISTINCT (_sluice_task, _sluice_seq)) FROM {stage} WHERE {chosen}")
            staged = cur.fetchone()[0]
            if staged != rows:
                raise PostgresError(f"commit of {plan.display}: the tasks reported {rows} row(s) but {staged} are "
                                    "staged; nothing was committed. Was the staging table truncated? Re-run the write.")
            for statement in plan.add_columns:  # schema.evolution: in the transaction of the rows that carry them
                cur.execute(statement)
            if plan.overwrite:
                cur.execute(f"DELETE FROM {plan.target}")
            source = f"(SELECT DISTINCT ON (_sluice_task, _sluice_seq) * FROM {stage} WHERE {chosen})"
            truncates = any(m.get("truncates", False) for m in messages)
            marked: tuple[str, ...] = ()
            if plan.unchanged_column:
                cur.execute(f"SELECT DISTINCT unnest({quote_ident(plan.unchanged_column)})::text FROM {stage} "
                            f"WHERE {chosen}")
                marked = plan.marked([row[0] for row in cur.fetchall()])
            for sql in plan.move_sql(source, "s._sluice_task, s._sluice_seq", marked, truncates=truncates):
                cur.execute(sql)
            cur.execute(f"DELETE FROM {stage} WHERE {where}")
            if finish:
                conn.commit()
        except PostgresError:
            conn.rollback()
            raise
        except Exception as e:
            conn.rollback()
            raise PostgresError(f"commit of {plan.display} (write {context.write_id}, epoch {epoch}) failed and was "
                                f"rolled back; nothing of it is visible: {self.conn_info.scrub(e)}") from None

    def abort(self, messages: list[Any], context: WriteContext) -> None:
        if self.plan.stage_table is None:
            return
        with self.conn_info.pooled(pooled=self.pooled) as conn:
            conn.execute(f"DELETE FROM {qualified(self.plan.schema, self.plan.stage_table)} "
                         f"WHERE {self._where(context)}")


@dataclass(frozen=True)
class PostgresWritePlan(WritePlan):
    """The target as the driver prepared it (table created, staging table ready, per-chunk checks decided)."""

    conn_info: Connection
    write: WriteOptions
    table: TablePlan
    overwrite: bool = False

    @property
    def commits_on_driver(self) -> bool:
        return self.config.transactional or self.overwrite  # overwrite is always staged and committed by the driver

    def open_task(self, context: WriteContext) -> TaskWriter:
        rows, table, mode = ArrowRows(), self.table, self.config.mode

        def encode(batch: pa.RecordBatch) -> Encoded:
            if mode != GLOBAL_ORDERED and table.truncates(batch) is not None:
                raise TruncateRefusedError(
                    f"upsert.op-column '{table.op_column}' has the value '{TRUNCATE_OP}' (a TRUNCATE), which empties "
                    f"{table.display} in order with the rows around it; sink.mode={mode} applies batches of "
                    "different keys at once, so it cannot. Set sink.mode=global-ordered (with "
                    "sink.transactional=true for exactly-once)")
            table.check_chunk(batch)  # before any row of this chunk is buffered, let alone sent
            return Encoded(*rows.add(batch))

        return TaskWriter(encode, PostgresStore(self.conn_info, table, rows, context,
                                                self.write.connections_per_task, self.config.streaming))

    def committer(self) -> Committer:
        return PostgresCommitter(self.conn_info, self.table, self.config.streaming)
