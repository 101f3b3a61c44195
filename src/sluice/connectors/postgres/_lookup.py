"""Lookup joins on PostgreSQL (`sluice.lookup(df, "postgres", ...)`, docs/lookup.md): a `LookupReader` whose
statements find an Arrow batch's keys, `lookup.max-keys-per-request` a statement, several in flight at once.

One key column: `SELECT ... FROM t q WHERE q.k = ANY($1::type[])`; several: `WHERE (q.a, q.b) IN (SELECT * FROM
unnest($1::ta[], $2::tb[]))`. Either is prepared once per connection (psycopg's `prepare=True`), so the server
plans it once, and an index on the key serves it. Columns are selected as the batch read selects them (text forms,
numeric(p,s)), so a looked-up row is typed as `spark.read.format("postgres")` types it.

What a lookup reads: committed rows only, one snapshot per Arrow batch. A batch of no more than
`lookup.max-keys-per-request` keys is one statement in autocommit (READ COMMITTED: one statement, one snapshot). A
larger batch's statements, up to `lookup.max-concurrent-requests` at once (run_requests: threads of the worker
process), each on a connection of its own, share one snapshot (_Snapshot): the first connection opens a REPEATABLE
READ READ ONLY transaction and exports its snapshot (`pg_export_snapshot()`); every other connection that serves
the batch opens one too and imports it (`SET TRANSACTION SNAPSHOT`) before its first statement, and a connection
serves the batch's later statements in the same transaction. The transactions end (COMMIT) only once every
statement has answered or, on a failure, once none still runs, so the exporting one outlives every import; a
connection leaves the batch outside any transaction, or is closed.

The connections come from the process's pool (_pool.py) and serve the task's batches; they go back to the pool when
the task ends cleanly, so the worker's next task, of this micro-batch or the next, reuses them with their prepared
statement.

A server that cannot be reached is retried as connecting is (connect.retries, backoff from 0.5 s), then fails the
task naming the table and the server: a lost connection sends its statement again on another connection, or, in a
batch that shares a snapshot, the whole batch again in a new one. A lookup never returns no rows for a key it could
not ask about.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.types import ArrayType, DataType, DateType, StructField, StructType, TimestampNTZType, TimestampType

from sluice.connector import (
    LookupReader,
    OptionError,
    Options,
    require_name,
    run_requests,
    slices,
    to_arrow_schema,
)
from sluice.connectors.postgres._client import (
    Connection,
    PostgresError,
    is_connection_error,
    qualified,
    quote_ident,
    quote_literal,
    split_qualified,
)
from sluice.connectors.postgres._options import LookupOptions
from sluice.connectors.postgres._pool import Lease
from sluice.connectors.postgres._source import spark_type

R = TypeVar("R")
_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_INVALID_SNAPSHOT = "22023"  # SET TRANSACTION SNAPSHOT of a snapshot whose exporting transaction has ended


class _Snapshot:
    """One batch's snapshot: its exported id and the connections in a transaction on it (the exporter first)."""

    def __init__(self) -> None:
        self.id = ""
        self.joined: list[Lease] = []

    def holds(self, lease: Lease) -> bool:
        return any(joined is lease for joined in self.joined)


class _Failed(Exception):
    """A statement's failure, named (`error`), and whether it lost its connection (then worth another attempt)."""

    def __init__(self, error: PostgresError, lost: bool) -> None:
        super().__init__(str(error))
        self.error, self.lost = error, lost


class PostgresLookupReader(LookupReader):
    """Rows of one table by key: see the module's docstring. Made by `plan_lookup` on the driver."""

    _one_snapshot = True  # a split batch's statements share a snapshot (the tests' negative control turns it off)

    def __init__(self, conn_info: Connection, described: str, sql: str, on: tuple[str, ...],
                 schema: StructType, concurrency: int = 1, keys_per_request: int = 1_000) -> None:
        self.conn_info = conn_info
        self._described = described
        self.sql = sql
        self.on = on
        self._schema = schema
        self.arrow = to_arrow_schema(schema)
        self.concurrency, self.keys_per_request = concurrency, keys_per_request
        self._leases: list[Lease] = []  # the task's idle connections (one per request in flight, at most)
        self._held: list[Lease] = []  # every connection the task holds, idle or in use
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__, "_leases": [], "_held": []}  # a connection never travels
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    @property
    def schema(self) -> StructType:
        return self._schema

    @property
    def described(self) -> str:
        return self._described

    def lookup(self, keys: pa.Table) -> pa.Table:
        params = [keys.column(name).to_pylist() for name in self.on]
        requests = [[column[start:start + length] for column in params]
                    for start, length in slices(keys.num_rows, self.keys_per_request)]
        if len(requests) > 1 and self._one_snapshot:
            answers = self._retried(lambda: self._in_one_snapshot(requests))
        else:  # one pool of threads per worker process and server (run_requests); each request its own connection
            answers = run_requests(self._client(), self.concurrency,
                                   lambda request: self._retried(partial(self._request, None, request)), requests)
        rows = [row for answer in answers for row in answer]
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in self.arrow]
        arrays = [pa.array(values, type=field.type) for values, field in zip(columns, self.arrow, strict=True)]
        return pa.Table.from_arrays(arrays, schema=self.arrow)

    def _client(self) -> tuple[str, str]:
        return ("postgres", self.conn_info.describe())

    def _retried(self, attempt: Callable[[], R]) -> R:
        """`attempt()` again after a lost connection, connect.retries times (backoff from 0.5 s); its failure named."""
        delay = 0.5
        for n in range(self.conn_info.connect_retries + 1):
            try:
                return attempt()
            except _Failed as failed:
                if n == self.conn_info.connect_retries or not failed.lost:
                    raise failed.error from None
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _in_one_snapshot(self, requests: list[list[list[Any]]]) -> list[list[tuple[Any, ...]]]:
        """The requests' rows, every statement in one snapshot exported by the batch's first connection. Its
        transactions end once run_requests has returned or raised: then no statement of the batch still runs, so
        every import happened while the exporting transaction was open."""
        snapshot = _Snapshot()
        try:
            lease = self._take()
            try:
                cursor = lease.conn.execute(f"{_BEGIN}; SELECT pg_export_snapshot()")
                snapshot.joined.append(lease)  # in the transaction from here: _end ends it, whatever follows
                cursor.nextset()
                snapshot.id = cursor.fetchone()[0]
            except Exception as e:
                raise self._failed(lease, f"exporting a snapshot for {sum(len(r[0]) for r in requests)} key(s)",
                                   e, is_connection_error(e)) from None
            self._give(lease)
            answers = run_requests(self._client(), self.concurrency, partial(self._request, snapshot), requests)
        finally:
            self._end(snapshot)
        return answers

    def _request(self, snapshot: _Snapshot | None, params: list[list[Any]]) -> list[tuple[Any, ...]]:
        """One statement's rows on a connection of the task: in autocommit, or in `snapshot`'s transaction (joined
        first if the connection is not in it yet)."""
        lease = self._take(snapshot)
        what = f"looking up {len(params[0])} key(s)"
        if snapshot is not None and not snapshot.holds(lease):
            snapshot.joined.append(lease)
            try:
                lease.conn.execute(f"{_BEGIN}; SET TRANSACTION SNAPSHOT {quote_literal(snapshot.id)}")
            except Exception as e:  # an invalid snapshot: its exporter's connection was lost, so is the batch's
                raise self._failed(lease, what, e, is_connection_error(e) or
                                   getattr(e, "sqlstate", None) == _INVALID_SNAPSHOT) from None
        try:
            rows: list[tuple[Any, ...]] = lease.conn.execute(self.sql, params, prepare=True).fetchall()
        except Exception as e:
            raise self._failed(lease, what, e, is_connection_error(e)) from None
        self._give(lease)
        return rows

    def _failed(self, lease: Lease, what: str, error: Exception, lost: bool) -> _Failed:
        """The failure of `what` on `lease`, named, its connection closed."""
        self._drop(lease)
        return _Failed(PostgresError(f"{what} in {self.described} failed: {self.conn_info.scrub(error)}",
                                     getattr(error, "sqlstate", None)), lost)

    def _end(self, snapshot: _Snapshot) -> None:
        """End the batch's transactions: its connections are idle by now, or closed. COMMIT, never ROLLBACK, which
        makes psycopg forget (DEALLOCATE) the connection's prepared statements; a read-only transaction commits
        nothing. A connection that cannot end its transaction is closed, never kept in one."""
        for lease in snapshot.joined:
            with self._lock:
                if not any(held is lease for held in self._held):
                    continue  # closed by its failed statement
            try:
                lease.conn.execute("COMMIT")
            except Exception:
                self._drop(lease)

    def _take(self, snapshot: _Snapshot | None = None) -> Lease:
        """An idle connection of the task (one already in `snapshot`'s transaction first), or a new lease from the
        worker process's pool."""
        with self._lock:
            joined = [i for i, lease in enumerate(self._leases) if snapshot is not None and snapshot.holds(lease)]
            if joined or self._leases:
                return self._leases.pop(joined[-1] if joined else -1)
        try:
            lease = self.conn_info.lease(self.conn_info.pool_key("psycopg", autocommit=True))
        except PostgresError as e:
            raise PostgresError(f"looking up keys in {self.described}: {e}", e.sqlstate) from None
        with self._lock:
            self._held.append(lease)
        return lease

    def _give(self, lease: Lease) -> None:
        with self._lock:
            self._leases.append(lease)

    def _drop(self, lease: Lease) -> None:
        with self._lock:
            self._held = [held for held in self._held if held is not lease]
            self._leases = [idle for idle in self._leases if idle is not lease]
        lease.release(False)

    def close(self, clean: bool) -> None:
        with self._lock:
            held, self._held, self._leases = self._held, [], []
        for lease in held:
            lease.release(clean)


# +-infinity as the batch read gives them (source/_source.py): Spark's last and first date and instant.
_INFINITY: dict[type[DataType], tuple[str, str]] = {DateType: ("'9999-12-31'", "'0001-01-01'"),
             TimestampNTZType: ("'9999-12-31 23:59:59.999999'", "'0001-01-01 00:00:00'"),
             TimestampType: ("'9999-12-31 23:59:59.999999+00'", "'0001-01-01 00:00:00+00'")}


def _select(name: str, pg_type: str) -> str:
    """How the batch read selects a column (source/_source.py's select_list): its text form, or numeric(p,s); a
    date or timestamp's +-infinity as the batch read maps it (psycopg has no Python value for it)."""
    col = f"q.{quote_ident(name)}"
    spark, how = spark_type(pg_type)
    if how == "text":
        col = f"{col}::text"
    elif how.startswith("numeric("):
        col = f"{col}::{how}"
    elif type(spark) in _INFINITY:
        last, first = _INFINITY[type(spark)]
        col = (f"CASE {col} WHEN 'infinity' THEN {last}::{pg_type} WHEN '-infinity' THEN {first}::{pg_type} "
               f"ELSE {col} END")
    return f"{col} AS {quote_ident(name)}"


def plan_lookup(opts: Options, on: tuple[str, ...], columns: tuple[str, ...] | None) -> PostgresLookupReader:
    """The reader of a lookup in the table the options name, its key and looked-up columns checked on the driver,
    and its statement run once on no keys, so that a key the server cannot compare fails here, named."""
    options = LookupOptions.of(opts)
    conn_info = options.conn
    schema_name, table = split_qualified(options.table)
    relation = qualified(schema_name, table)
    described = f"table {schema_name}.{table} on {conn_info.describe()}"
    conn = conn_info.connect_psycopg(autocommit=True)
    try:
        if conn.execute("SELECT to_regclass(%s)", (relation,)).fetchone()[0] is None:
            raise OptionError(f"table {schema_name}.{table} does not exist on {conn_info.describe()} (option 'table')")
        catalog = conn.execute(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), format('%%I.%%I', n.nspname, t.typname) "
            "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid JOIN pg_namespace n ON n.oid = t.typnamespace "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (relation,)).fetchall()
        types = {name: (pg_type, base) for name, pg_type, base in catalog}
        of = f"table {schema_name}.{table}"
        for key in on:
            require_name(key, types, "key column", of, advice="Name the table's key column in on=, as the "
                         "DataFrame names it (rename the DataFrame's column to match).")
            if isinstance(spark_type(types[key][0])[0], ArrayType):
                raise OptionError(f"key column '{key}' of {of} is an array ({types[key][0]}): look up by a "
                                  "scalar column")
        for name in columns or ():
            require_name(name, types, "looked-up column", of, advice="Leave it out of columns=[...].")
        wanted = [*on, *(columns if columns is not None else [n for n in types if n not in on])]
        selected = ", ".join(_select(name, types[name][0]) for name in dict.fromkeys(wanted))
        if len(on) == 1:
            where = f"q.{quote_ident(on[0])} = ANY(%s::{types[on[0]][1]}[])"
        else:
            unnest = ", ".join(f"%s::{types[key][1]}[]" for key in on)
            where = f"({', '.join(f'q.{quote_ident(key)}' for key in on)}) IN (SELECT * FROM unnest({unnest}))"
        sql = f"SELECT {selected} FROM {relation} q WHERE {where}"
        try:
            conn.execute(sql, [[] for _ in on]).fetchall()
        except Exception as e:
            raise PostgresError(f"the lookup of keys {list(on)} in {described} cannot run: "
                                f"{conn_info.scrub(e)}", getattr(e, "sqlstate", None)) from None
    finally:
        conn.close()
    schema = StructType([StructField(name, spark_type(types[name][0])[0], True) for name in dict.fromkeys(wanted)])
    return PostgresLookupReader(conn_info, described, sql, on, schema, options.lookup_max_concurrent_requests,
                                options.lookup_max_keys_per_request)
