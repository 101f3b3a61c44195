"""Lookup joins on Cassandra (`sluice.lookup(df, "cassandra", ...)`, docs/lookup.md): a `LookupReader` that reads
an Arrow batch's distinct keys by prepared, token-aware SELECTs, many in flight at once.

`on` is the table's whole partition key, optionally followed by a prefix of its clustering columns. When it is
exactly a single-column partition key, the keys are grouped by the node that holds them (each key's token against
the ring of the worker's session, _tokens.py) and each group of at most `lookup.max-keys-per-request` keys is one
`SELECT ... FROM ks.t WHERE pk IN ?`, its routing key set to a key of the group, so the driver's
`TokenAwarePolicy` (the session _client.py builds for every read and write) sends it to that node, which reads every
partition of the group itself. Otherwise (a composite partition key: CQL's IN over several columns is their
cartesian product; a clustering prefix; `lookup.max-keys-per-request=1`) each key is one
`SELECT ... WHERE pk = ? [AND ck1 = ?]`, whose bound values carry its routing key. Statements are prepared once per
task; a batch's run through the driver's `execute_concurrent`, up to `lookup.max-concurrent-requests` in flight, on
the worker process's one session per cluster (`session_for`), which the worker's later tasks reuse; a result of more
than a page (FETCH_SIZE rows: a wide partition, or a group's many rows) pages on. With
`lookup.repartition-by-replica`, `placement()` shuffles the rows by the node holding each key first (_tokens.py),
so a task's statements go to one node. Columns are typed as `spark.read.format("cassandra")` types them
(_types.py).

What a lookup reads: each SELECT at `read.consistency` (LOCAL_QUORUM unless set), each partition as the replicas
answer it then; Cassandra has no snapshot spanning partitions. A failure that passes (timeouts, unavailable
replicas, no node reachable) retries the batch `lookup.max-retries` times, backing off; then the task fails naming
keyspace.table. A lookup never returns no rows for a key it could not ask about.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql.types import StructField, StructType

from sluice.connector import (
    KeyPlacement,
    LookupReader,
    OptionError,
    Options,
    RetryableError,
    ThrottledError,
    lookup_retry_pause,
    require_name,
    to_arrow_schema,
)
from sluice.connectors.cassandra._client import TUPLES, CassandraError, Connection, classify, quote_ident
from sluice.connectors.cassandra._options import LookupOptions
from sluice.connectors.cassandra._table import TableInfo, describe
from sluice.connectors.cassandra._tokens import ReplicaPlacement, TokenRing, partition_tokens, read_ring
from sluice.connectors.cassandra._types import CQLType, arrow_column, python_values, spark_type

if TYPE_CHECKING:
    from cassandra.query import BoundStatement, PreparedStatement

FETCH_SIZE = 5000  # rows per page of a SELECT (a wider partition, or a group's partitions, page on)


class CassandraLookupReader(LookupReader):
    """Rows of one table by partition key (and clustering prefix): see the module's docstring. Made by
    `plan_lookup` on the driver."""

    def __init__(self, conn: Connection, cql: str, on: tuple[str, ...], kinds: dict[str, CQLType],
                 schema: StructType, options: LookupOptions, keys_per_request: int = 1) -> None:
        """`cql` binds the key by `pk IN ?` when keys_per_request > 1 (a single-column partition key), else by
        `pk = ? [AND ck1 = ?]`."""
        self.conn, self.cql, self.on, self.kinds = conn, cql, on, kinds
        self._schema = schema
        self.arrow = to_arrow_schema(schema)
        self.consistency = options.read_consistency
        self.concurrency = options.lookup_max_concurrent_requests
        self.retries = options.lookup_max_retries
        self.keys_per_request = keys_per_request
        self.fetch_size = FETCH_SIZE
        self._prepared: PreparedStatement | None = None
        self._ring: TokenRing | None = None  # the worker's session's, read at a task's first group
        self._placement: ReplicaPlacement | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_prepared": None, "_ring": None}  # per task, from the worker's session

    @property
    def schema(self) -> StructType:
        return self._schema

    @property
    def described(self) -> str:
        return f"table {self.conn.keyspace}.{self.conn.table} on {self.conn.display}"

    def placement(self) -> KeyPlacement | None:
        return self._placement

    def lookup(self, keys: pa.Table) -> pa.Table:
        try:
            values = [python_values(keys.column(name).combine_chunks(), self.kinds[name]) for name in self.on]
        except ValueError as e:  # a string key that is no UUID for a uuid column
            raise CassandraError(f"a key looked up in {self.described} does not fit its column's CQL type: {e}",
                                 store="cassandra", target=self.conn.display) from None
        rows = self._rows(list(zip(*values, strict=True)), keys)
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in self.arrow]
        try:
            arrays = [arrow_column(list(cells), self.kinds[field.name], field.type)
                      for cells, field in zip(columns, self.arrow, strict=True)]
        except (ValueError, TypeError, ArithmeticError) as e:
            raise CassandraError(f"a row looked up in {self.described} has a value with no form in its column's "
                                 f"Spark type: {e}. Leave that column out with columns=[...].",
                                 store="cassandra", target=self.conn.display) from None
        return pa.Table.from_arrays(arrays, schema=self.arrow)

    def _rows(self, params: list[tuple[Any, ...]], keys: pa.Table) -> list[tuple[Any, ...]]:
        """Every row of the batch's SELECTs, run concurrently; the whole batch again on a failure that passes."""
        from cassandra.concurrent import execute_concurrent, execute_concurrent_with_args

        for attempt in range(self.retries + 1):
            error: BaseException
            try:
                session = self.conn.session()
            except CassandraError as e:  # no node reachable (a wrong password passes no better the next time)
                error, passes = e, "authentication failed" not in str(e)
            else:
                try:
                    statement = self._statement(session)
                    if self.keys_per_request > 1:
                        results = execute_concurrent(session, self._groups(statement, params, keys),
                                                     concurrency=self.concurrency, raise_on_first_error=True,
                                                     execution_profile=TUPLES)
                    else:
                        results = execute_concurrent_with_args(session, statement, params,
                                                               concurrency=self.concurrency, raise_on_first_error=True,
                                                               execution_profile=TUPLES)
                    # A ResultSet iterates every page: the next ones are fetched as the rows are read.
                    return [tuple(row) for result in results for row in result.result_or_exc]
                except Exception as e:
                    if self.keys_per_request > 1 and "partition_keys_in_select" in str(e):
                        # the cluster's guardrail (cassandra.yaml partition_keys_in_select_fail_threshold): no retry
                        # passes it, a smaller IN does
                        raise CassandraError(
                            f"looking up keys in {self.described}: the cluster refused an IN of up to "
                            f"{self.keys_per_request} partition keys (lookup.max-keys-per-request="
                            f"{self.keys_per_request}) by its guardrail partition_keys_in_select_fail_threshold: {e}. "
                            "Set lookup.max-keys-per-request below that threshold, or ask the operator to raise it.",
                            store="cassandra", target=self.conn.display) from None
                    error = classify(e, self.conn, len(params))
                    passes = isinstance(error, RetryableError | ThrottledError)
                    self._prepared = self._ring = None  # the next session (a restarted cluster's) starts anew
            if attempt == self.retries or not passes:
                raise CassandraError(f"looking up {len(params)} key(s) in {self.described} failed after "
                                     f"{attempt + 1} attempt(s) (lookup.max-retries={self.retries}): {error}",
                                     store="cassandra", target=self.conn.display) from None
            lookup_retry_pause(self.described, len(params), attempt, self.retries, error)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _groups(self, prepared: PreparedStatement, params: list[tuple[Any, ...]],
                keys: pa.Table) -> list[tuple[BoundStatement, None]]:
        """One `pk IN ?` statement per group of at most keys_per_request keys with one first replica (the ring of the
        worker's session), its routing key a key of the group's: the token-aware policy sends it to that replica."""
        if self._ring is None:
            self._ring = read_ring(self.conn, "a lookup by a single-column partition key",
                                   "set lookup.max-keys-per-request=1 (a SELECT per key)")
        owners = self._ring.owner_of(partition_tokens(keys, self.on, self.kinds))
        order = np.argsort(owners, kind="stable")
        runs = np.split(order, np.flatnonzero(np.diff(owners[order])) + 1) if len(order) else []
        key_type = prepared.column_metadata[0].type.subtypes[0]  # the IN marker's list<key type>
        routed = _routed_statement()
        statements: list[tuple[BoundStatement, None]] = []
        for run in runs:
            for start in range(0, len(run), self.keys_per_request):
                group = [params[i][0] for i in run[start:start + self.keys_per_request]]
                routing_key = key_type.serialize(group[0], prepared.protocol_version)
                statements.append((routed(prepared, group, routing_key), None))
        return statements

    def _statement(self, session: Any) -> PreparedStatement:
        from cassandra import ConsistencyLevel

        if self._prepared is None:
            prepared = session.prepare(self.cql)
            prepared.consistency_level = ConsistencyLevel.name_to_value[self.consistency]
            prepared.fetch_size = self.fetch_size
            self._prepared = prepared
        return self._prepared


@functools.cache
def _routed_statement() -> type[BoundStatement]:
    """A BoundStatement whose routing key is the one given: the driver derives a bound statement's routing key only
    from the prepared statement's partition-key markers, and an IN list's marker is none (the driver is imported
    where a lookup runs, not with this module)."""
    from cassandra.query import BoundStatement

    class RoutedStatement(BoundStatement):
        def __init__(self, prepared: PreparedStatement, keys: list[Any], routing_key: bytes) -> None:
            super().__init__(prepared)
            self.bind((keys,))
            self._routing_key = routing_key

        @property
        def routing_key(self) -> bytes:
            return self._routing_key

    return RoutedStatement


def key_columns(on: tuple[str, ...], info: TableInfo, target: str) -> tuple[str, ...]:
    """`on` in the table's key order, refused unless it is the whole partition key plus a prefix of the clustering
    columns (a lookup reads a partition, or a slice of one, by equality)."""
    for key in on:
        require_name(key, info.columns, "key column", f"table {target}",
                     advice="Name the table's key columns in on=, as the DataFrame names them.")
    missing = [c for c in info.partition_key if c not in on]
    rest = [c for c in on if c not in info.partition_key]
    prefix = info.clustering[:len(rest)]
    if missing or set(rest) != set(prefix):
        raise OptionError(
            f"on={list(on)} is not a key of table {target} Cassandra can look up: its {info.key_description()}. "
            f"A lookup reads whole partitions by the partition key {list(info.partition_key)} (every column of it), "
            f"optionally narrowed by a prefix of the clustering columns {list(info.clustering)} in their order"
            f"{f'; missing: {missing}' if missing else ''}.")
    for key in on:
        kind = info.columns[key]
        if kind.args or kind.fields:
            raise OptionError(f"key column '{key}' of table {target} is CQL {kind}: a lookup takes keys of scalar "
                              "types only")
    return (*info.partition_key, *prefix)


def plan_lookup(opts: Options, on: tuple[str, ...], columns: tuple[str, ...] | None) -> CassandraLookupReader:
    """The reader of a lookup in the table the options name, its key and looked-up columns checked on the driver,
    and its SELECT prepared once, so that a statement the cluster refuses fails here, named."""
    options = LookupOptions.of(opts)
    conn = options.conn
    info = describe(conn)
    target = f"{conn.keyspace}.{conn.table}"
    ordered = key_columns(on, info, target)
    for name in columns or ():
        require_name(name, info.columns, "looked-up column", f"table {target}", advice="Leave it out of columns=[...].")
    wanted = list(dict.fromkeys([*on, *(columns if columns is not None else
                                        [n for n in info.columns if n not in on])]))
    fields = []
    for name in wanted:
        try:
            fields.append(StructField(name, spark_type(info.columns[name], name), True))
        except OptionError:
            raise OptionError(f"column '{name}' of table {target} is CQL {info.columns[name]}, which sluice does not "
                              "read; leave it out with columns=[...]") from None
    # Groups of keys in one IN only over exactly a single-column partition key (see the module's docstring).
    grouped = len(ordered) == 1 and ordered == info.partition_key and options.lookup_max_keys_per_request > 1
    where = f"{quote_ident(ordered[0])} IN ?" if grouped else " AND ".join(f"{quote_ident(c)} = ?" for c in ordered)
    cql = f"SELECT {', '.join(quote_ident(n) for n in wanted)} FROM {conn.target} WHERE {where}"
    # A bound statement binds by position, in WHERE's order: the reader's keys are given in that order.
    reader = CassandraLookupReader(conn, cql, ordered, dict(info.columns), StructType(fields), options,
                                   options.lookup_max_keys_per_request if grouped else 1)
    try:
        conn.session().prepare(cql)
    except Exception as e:
        raise CassandraError(f"the lookup of keys {list(on)} in {reader.described} cannot run: "
                             f"{type(e).__name__}: {e}", store="cassandra", target=conn.display) from None
    if options.lookup_repartition_by_replica:
        reader._placement = ReplicaPlacement(read_ring(conn), tuple(info.partition_key),
                                             {c: info.columns[c] for c in info.partition_key},
                                             options.lookup_partitions_per_host)
    return reader
