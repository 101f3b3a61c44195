"""`spark.read.format("postgres")`: a table or query read in parallel splits from one consistent snapshot.

Splits (on the split framework, sluice.source): ranges of an integer, date or timestamp column between its
min and max (the `partition-column` option, else a one-column primary key of such a type), or for tables
without one, ranges of heap pages (ctid), which PostgreSQL scans directly (TID range scans). A `query` without
`partition-column` is read as one split. Every split runs in a REPEATABLE READ transaction that adopts the same
exported snapshot (see _snapshot.py), so the splits together are one picture of the data, even while writers
commit. Rows come out of the server as Arrow over COPY BINARY (ADBC) and are cast to the declared schema.

With `pushdown=true`, filters Spark pushes (=, <=>, <, <=, >, >=, IN, IS [NOT] NULL, NOT, starts/ends with,
contains) become the WHERE clause when their value is a number, string, boolean, date or decimal; string
comparisons use COLLATE "C" so they order as Spark does (by code point). Others stay with Spark.
Pushdown is off by default because of a Spark 4.3 defect: the read planned with one query's pushed filters is
kept on the DataFrame's relation and reused by a later query on the same DataFrame that pushes nothing, which
then silently returns the earlier query's rows only (the plan is scoped per scan in Spark's main branch, not in
any release). With pushdown=true, load a new DataFrame for every query.

Kept in one module (past 400 lines): the type mapping, filter-to-SQL translation and split planning all serve
this one reader and change together with it; the change stream's snapshot reads through the same planner.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.types import ArrayType, ByteType, DataType, DecimalType, StringType, StructField, StructType

from sluice.connector import (
    HAS_FILTER_PUSHDOWN,
    DeadLetterRoute,
    DeadLetterWriter,
    Filter,
    OptionError,
    Split,
    SplitBatchReader,
    SplitEnumerator,
    SplitReader,
    conform_or_aside,
    read_with_letters,
    to_arrow_schema,
)
from sluice.connectors.postgres._client import (
    Connection,
    PostgresError,
    qualified,
    quote_ident,
    quote_literal,
    split_qualified,
)
from sluice.connectors.postgres._options import ReadOptions
from sluice.connectors.postgres._snapshot import SharedSnapshot, SnapshotHolder
from sluice.connectors.postgres._table import TYPE_MAP

if HAS_FILTER_PUSHDOWN:  # Spark 4.1+; on 4.0 option pushdown is refused and filter_sql never runs
    from pyspark.sql.datasource import (
        EqualNullSafe,
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        IsNull,
        LessThan,
        LessThanOrEqual,
        Not,
        StringContains,
        StringEndsWith,
        StringStartsWith,
    )

ROWS_PER_SPLIT = 250_000
YIELD_ROWS = 65_536
_INT_TYPES = frozenset({"smallint", "integer", "bigint"})
# PostgreSQL -> Spark: the inverse of create-table's mapping (smallint reads back as short, not byte).
_SIMPLE: dict[str, DataType] = {pg: spark_cls() for spark_cls, pg in TYPE_MAP if spark_cls is not ByteType}
_NUMERIC = re.compile(r"numeric(?:\((\d+),(\d+)\))?$")


# PostgreSQL's date and timestamp +-infinity, as ADBC hands them over (the server's extreme values shifted from
# 2000-01-01 to 1970-01-01, wrapping round), and the bounds Spark can hold, which they read as (Spark's own
# JDBC reader does the same, SPARK-44280 / SPARK-47501).
_DATE_INFINITY = {-2147472692: 2932896, -2147472691: -719162}  # +inf -> 9999-12-31, -inf -> 0001-01-01
_TIMESTAMP_INFINITY = {-9222425352054775809: 253402300799999999, -9222425352054775808: -62135596800000000}


def finite_times(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Date and timestamp columns (and arrays of them) with +-infinity read as Spark's last and first instant."""
    originals = batch.columns
    columns = [_finite(column) for column in originals]
    if all(fixed is column for fixed, column in zip(columns, originals, strict=True)):
        return batch
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def _finite(array: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    if pa.types.is_list(array.type):
        values = _finite(array.values)
        if values is array.values:
            return array
        return pa.ListArray.from_arrays(array.offsets, values, type=array.type, mask=array.is_null())
    if pa.types.is_date32(array.type):
        storage, sentinels, width = array.cast(pa.int32()), _DATE_INFINITY, pa.int32()
    elif pa.types.is_timestamp(array.type):
        storage, sentinels, width = array.cast(pa.int64()), _TIMESTAMP_INFINITY, pa.int64()
    else:
        return array
    if not pc.any(pc.less_equal(storage, max(sentinels))).as_py():  # no infinity in it: the common case
        return array
    for raw, bound in sentinels.items():
        storage = pc.if_else(pc.equal(storage, pa.scalar(raw, width)), pa.scalar(bound, width), storage)
    return storage.cast(array.type)


def spark_type(pg: str) -> tuple[DataType, str]:
    """(Spark type, how to select it: 'as is' | 'text' | 'numeric(p,s)') for a format_type() string."""
    if pg.endswith("[]"):
        inner, how = spark_type(pg[:-2])
        if how == "as is" and not isinstance(inner, ArrayType):
            return ArrayType(inner), "as is"
        return StringType(), "text"
    if pg in _SIMPLE:
        return _SIMPLE[pg], "as is"
    m = _NUMERIC.match(pg)
    if m:
        p, s = (int(m.group(1)), int(m.group(2))) if m.group(1) else (38, 18)
        if p > 38:
            return StringType(), "text"
        return DecimalType(p, s), f"numeric({p},{s})"
    return StringType(), "text"  # varchar, uuid, json, interval, ...: their text form


def _source_sql(options: ReadOptions) -> tuple[str, str | None]:
    """(FROM item aliased q, the table's quoted name or None for a query: ctid splits need a table)."""
    if options.table:
        rel = qualified(*split_qualified(options.table))
        return f"{rel} q", rel
    return f"({options.query}) q", None


def describe_columns(cur: Any, options: ReadOptions) -> list[tuple[str, str]]:
    """(name, format_type) of the table's or the query's columns, read off the catalog."""
    if options.table:
        schema, table = split_qualified(options.table)
        rel = qualified(schema, table)
        cur.execute("SELECT to_regclass(%s)::oid::bigint", (rel,))
        if cur.fetchone()[0] is None:
            raise OptionError(f"table {schema}.{table} does not exist (option 'table')")
    else:
        cur.execute(f"CREATE TEMP VIEW sluice_query AS {options.query}")
        rel = "pg_temp.sluice_query"
    cur.execute("SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                "to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (rel,))
    return [(r[0], r[1]) for r in cur.fetchall()]


# ------------------------------------------------------------------------------------------------ filters
_C = ' COLLATE "C"'  # byte order of UTF-8 = code point order, as Spark compares strings


def _literal(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else f"{value!r}::float8"
    if isinstance(value, decimal.Decimal):
        return None if not value.is_finite() else f"{quote_literal(str(value))}::numeric"
    if isinstance(value, str):
        return quote_literal(value)
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return f"{quote_literal(value.isoformat())}::date"
    return None  # timestamps (time zone of the value is ambiguous), bytes, ...: Spark evaluates them


def column_exprs(columns: list[tuple[str, str]]) -> dict[str, tuple[str, bool]]:
    """name -> (SQL for the value Spark sees, whether it is text): types read as text compare as text."""
    out = {}
    for name, pg in columns:
        col = f"q.{quote_ident(name)}"
        dtype, how = spark_type(pg)
        out[name] = (f"{col}::text" if how == "text" else col, isinstance(dtype, StringType))
    return out


def filter_sql(f: Filter, exprs: dict[str, tuple[str, bool]]) -> str | None:
    """The SQL of one pushed filter, or None if it stays with Spark."""
    if isinstance(f, Not):
        inner = filter_sql(f.child, exprs)
        return f"NOT ({inner})" if inner else None
    path = getattr(f, "attribute", None)
    if not path or len(path) != 1 or path[0] not in exprs:
        return None
    col, is_text = exprs[path[0]]
    if isinstance(f, IsNull):
        return f"{col} IS NULL"
    if isinstance(f, IsNotNull):
        return f"{col} IS NOT NULL"
    if isinstance(f, StringStartsWith | StringEndsWith | StringContains):
        if not is_text or not isinstance(f.value, str):
            return None
        lit = quote_literal(f.value)
        if isinstance(f, StringStartsWith):
            return f"starts_with({col}, {lit})"
        if isinstance(f, StringEndsWith):
            return f"right({col}, {len(f.value)}) = {lit}"
        return f"strpos({col}, {lit}) > 0"
    if isinstance(f, In):
        lits = [_literal(v) for v in f.value if v is not None]
        known = [x for x in lits if x is not None]
        if not known or len(known) < len(lits):
            return None
        return f"{col}{_C if is_text else ''} IN ({', '.join(known)})"
    ops = {EqualTo: "=", EqualNullSafe: "IS NOT DISTINCT FROM", GreaterThan: ">", GreaterThanOrEqual: ">=",
           LessThan: "<", LessThanOrEqual: "<="}
    op = ops.get(type(f))
    if op is None:
        return None
    literal = _literal(f.value)
    if literal is None:
        return None
    return f"{col}{_C if is_text else ''} {op} {literal}"


# ------------------------------------------------------------------------------------------------ splits
def _bounds_kind(pg: str) -> str | None:
    if pg in _INT_TYPES:
        return "int"
    if pg in ("date", "timestamp with time zone", "timestamp without time zone"):
        return pg
    return None


def _as_number(kind: str, col: str) -> str:
    if kind == "int":
        return col
    if kind == "date":
        return f"({col} - date '1970-01-01')"
    if kind == "timestamp with time zone":
        return f"(extract(epoch from {col}) * 1000000)::bigint"
    return f"(extract(epoch from {col} AT TIME ZONE 'UTC') * 1000000)::bigint"


def _from_number(kind: str, value: int) -> str:
    if kind == "int":
        return str(int(value))
    if kind == "date":
        return f"(date '1970-01-01' + {int(value)})"
    if kind == "timestamp with time zone":
        return f"to_timestamp({int(value)} / 1000000.0)"
    return f"(to_timestamp({int(value)} / 1000000.0) AT TIME ZONE 'UTC')"


class PostgresEnumerator(SplitEnumerator):
    """Driver side: exports the snapshot, finds the key range or page count in it, and cuts the splits."""

    def __init__(self, conn_info: Connection, options: ReadOptions, columns: list[tuple[str, str]],
                 primary_key: list[str]) -> None:
        self.conn_info = conn_info
        self.options = options
        self.columns = columns
        self.primary_key = primary_key
        self.where: list[str] = []

    def start_position(self, split: Split) -> int:
        return 0

    def end_position(self, split: Split) -> int:
        return 1

    def _split_column(self) -> tuple[str, str] | None:
        types = dict(self.columns)
        name = self.options.partition_column
        if name:
            if name not in types:
                raise OptionError(f"partition-column '{name}' is not a column of the source (columns: {list(types)})")
            kind = _bounds_kind(types[name])
            if kind is None:
                raise OptionError(f"partition-column '{name}' has type {types[name]}; use an integer, date or "
                                  "timestamp column")
            return name, kind
        if len(self.primary_key) == 1 and _bounds_kind(types.get(self.primary_key[0], "")):
            # return-value: _bounds_kind() is not None here, the condition above says so
            return self.primary_key[0], _bounds_kind(types[self.primary_key[0]])  # type: ignore[return-value]
        return None

    def discover(self) -> list[Split]:
        holder = SnapshotHolder(self.conn_info, self.options.snapshot_timeout_s) \
            if self.options.consistent_snapshot else None
        try:
            splits = self.discover_in(holder.shared if holder is not None else None)
        except BaseException:
            if holder is not None:
                holder.cancel()
            raise
        if holder is not None:
            holder.release_pipes()
        return splits

    def discover_in(self, shared: SharedSnapshot | None) -> list[Split]:
        """The splits of a read in `shared` (a snapshot someone else holds), or in no common snapshot."""
        conn = self.conn_info.connect_psycopg(autocommit=False)  # planning needs SQL, not Arrow
        try:
            cur = conn.cursor()
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            if shared is not None:
                cur.execute(f"SET TRANSACTION SNAPSHOT {quote_literal(shared.snapshot_id)}")
            wheres = self._cut(cur)
        finally:
            conn.rollback()
            conn.close()
        info: dict[str, Any] = {"snapshot": shared.snapshot_id, "channel": shared.channel} \
            if shared is not None else {}
        return [Split(f"split-{i}", {**info, "where": where}) for i, where in enumerate(wheres)]

    def _partitions_wanted(self, cur: Any, relation: str | None) -> int:
        if self.options.num_partitions:
            return self.options.num_partitions
        if relation is None:
            return 8
        cur.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass(%s)", (relation,))
        rows = cur.fetchone()[0] or 0
        return max(1, min(64, -(-rows // ROWS_PER_SPLIT)))

    def _cut(self, cur: Any) -> list[str]:
        source, relation = _source_sql(self.options)
        column = self._split_column()
        if column is None and (relation is None or self.options.num_partitions == 1):
            return ["true"]
        wanted = self._partitions_wanted(cur, relation)
        pushed = " AND ".join(self.where) or "true"
        if column is None:
            cur.execute("SELECT (pg_relation_size(to_regclass(%s)) / current_setting('block_size')::int)::bigint",
                        (relation,))
            pages = cur.fetchone()[0] or 0
            if wanted <= 1 or pages <= 1:
                return ["true"]
            step = max(1, -(-pages // wanted))
            edges = list(range(0, pages, step))[1:]
            wheres, lo = [], None
            for edge in [*edges, None]:
                parts = ([f"q.ctid >= '({lo},0)'::tid"] if lo is not None else []) + \
                        ([f"q.ctid < '({edge},0)'::tid"] if edge is not None else [])
                wheres.append(" AND ".join(parts) or "true")
                lo = edge
            return wheres
        name, kind = column
        col = f"q.{quote_ident(name)}"
        number = _as_number(kind, col)
        cur.execute(f"SELECT min({number}), max({number}) FROM {source} WHERE {pushed}")
        lo, hi = cur.fetchone()
        if lo is None or wanted <= 1 or hi <= lo:
            return ["true"]
        bounds = self._histogram(cur, relation, name, kind)
        if bounds is not None:
            edges = quantile_edges(bounds, lo, hi, wanted)
        else:  # never analyzed: the keys are taken as spread evenly
            wanted = min(wanted, int(hi - lo) + 1)
            step = (hi - lo + 1) / wanted
            edges = [int(lo + round(step * i)) for i in range(1, wanted)]
        if not edges:  # the histogram puts every row on one key
            return ["true"]
        wheres = []
        prev = None
        for edge in [*edges, None]:
            parts = []
            if prev is not None:
                parts.append(f"{col} >= {_from_number(kind, prev)}")
            if edge is not None:
                parts.append(f"{col} < {_from_number(kind, edge)}")
            clause = " AND ".join(parts)
            if prev is None:
                clause = f"({clause} OR {col} IS NULL)"  # NULL keys go to the first split
            wheres.append(clause)
            prev = edge
        return wheres

    def _histogram(self, cur: Any, relation: str | None, name: str, kind: str) -> list[int] | None:
        """The split column's histogram bounds from ANALYZE (pg_stats), as numbers; None without one."""
        if relation is None:
            return None
        pg_type = dict(self.columns)[name]
        cur.execute(f"SELECT {_as_number(kind, 'u.b')} FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = %s "
                    f"AND NOT s.inherited, unnest(s.histogram_bounds::text::{pg_type}[]) WITH ORDINALITY AS u(b, i) "
                    "WHERE c.oid = to_regclass(%s) ORDER BY u.i", (name, relation))
        bounds = [b for (b,) in cur.fetchall()]
        return bounds if len(bounds) >= 2 else None


def quantile_edges(bounds: list[int], lo: int, hi: int, wanted: int) -> list[int]:
    """Edges cutting the keys [lo, hi] into at most `wanted` splits of about equal rows, by an equi-depth histogram
    (each bucket between two bounds holds as many rows, spread evenly in it): gaps in the keys leave no split empty
    and none oversized. Keys outside the histogram (rows added since ANALYZE) get the histogram's mean density."""
    import numpy as np

    keys = np.asarray(bounds, dtype=np.float64)
    cumulative = np.arange(len(keys), dtype=np.float64)  # buckets below each bound
    density = (len(keys) - 1) / max(1.0, keys[-1] - keys[0])
    if lo < keys[0]:
        keys, cumulative = np.r_[lo, keys], np.r_[-(keys[0] - lo) * density, cumulative]
    if hi + 1 > keys[-1]:
        keys, cumulative = np.r_[keys, hi + 1], np.r_[cumulative, cumulative[-1] + (hi + 1 - keys[-1]) * density]
    first, last = np.interp([lo, hi + 1], keys, cumulative)
    targets = first + (last - first) * np.arange(1, wanted) / wanted
    edges: list[int] = []
    for edge in np.rint(np.interp(targets, cumulative, keys)).astype(np.int64).tolist():
        if lo < edge <= hi and (not edges or edge > edges[-1]):
            edges.append(edge)
    return edges


class PostgresSplitReader(SplitReader):
    """Executor side: one split's rows, in the shared snapshot, cast to the declared schema."""

    def __init__(self, conn_info: Connection, options: ReadOptions, columns: list[tuple[str, str]],
                 schema: StructType, dead_letters: DeadLetterRoute | None = None, read_id: str = "",
                 streaming: bool = False) -> None:
        """`dead_letters`: where rows with a value that does not convert to the schema go (errors.tolerance=all),
        named after the streaming query, else `read_id`."""
        self.dead_letters, self.read_id, self.streaming = dead_letters, read_id, streaming
        self.conn_info = conn_info
        self.options = options
        self.columns = columns
        self.schema = schema
        self.arrow_schema = to_arrow_schema(schema)
        self.where: list[str] = []

    def select_list(self) -> str:
        types = dict(self.columns)
        out = []
        for field in self.schema.fields:
            if field.name not in types:
                raise OptionError(f"column '{field.name}' of the given schema is not in the source "
                                  f"(columns: {list(types)})")
            col = f"q.{quote_ident(field.name)}"
            _, how = spark_type(types[field.name])
            if how == "text":
                col = f"{col}::text"
            elif how.startswith("numeric("):
                col = f"{col}::{how}::text"
            out.append(f"{col} AS {quote_ident(field.name)}")
        return ", ".join(out) or "1 AS _"

    def described(self) -> str:
        return f"table {self.options.table}" if self.options.table else "the query"

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        return read_with_letters(self.dead_letters, self.read_id, self.streaming, self.described(),
                                 lambda letters: self._read(split, letters))

    def _read(self, split: Split, letters: DeadLetterWriter | None) -> Iterator[pa.RecordBatch]:
        source, _ = _source_sql(self.options)
        where = " AND ".join([*self.where, split.info.get("where", "true")])
        sql = f"SELECT {self.select_list()} FROM {source} WHERE {where}"
        with self.conn_info.reading(split.split_id, autocommit=False) as (conn, cur):
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            snapshot = split.info.get("snapshot")
            if snapshot:
                try:
                    cur.execute(f"SET TRANSACTION SNAPSHOT {quote_literal(snapshot)}")
                except Exception as e:
                    raise PostgresError(
                        f"{split.split_id} could not adopt the read's shared snapshot ({self.conn_info.scrub(e)}); "
                        "the snapshot was released (snapshot.timeout-s passed without a split finishing). Load the "
                        "DataFrame again (spark.read...load()) for a fresh snapshot, raise snapshot.timeout-s, or "
                        "set consistent-snapshot=false.") from None
            cur.execute(sql)
            for batch in cur.fetch_record_batch():
                # ADBC hands over large batches; smaller ones let Spark convert while the next arrives.
                batch = finite_times(batch)
                for start in range(0, batch.num_rows, YIELD_ROWS):
                    yield conform_or_aside(batch.slice(start, YIELD_ROWS), self.arrow_schema, letters,
                                           f"{self.described()}, {split.split_id}")
            if snapshot:
                cur.execute("SELECT pg_notify($1, $2)", parameters=(split.info["channel"], split.split_id))
                cur.fetchall()
            conn.commit()


class PostgresBatchReader(SplitBatchReader):
    """The batch read, without filter pushdown (safe when a DataFrame serves several queries)."""

    enumerator: PostgresEnumerator
    reader: PostgresSplitReader


class PostgresPushdownReader(PostgresBatchReader):
    """pushdown=true: Spark's filters go into every split's WHERE clause (and the min/max of the split column)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        exprs = column_exprs(self.enumerator.columns)
        for f in filters:
            sql = filter_sql(f, exprs)
            if sql is None:
                yield f
            else:
                self.enumerator.where.append(sql)
                self.reader.where.append(sql)


def infer_schema(conn_info: Connection, options: ReadOptions) -> tuple[StructType, list[tuple[str, str]], list[str]]:
    """(Spark schema, (name, PostgreSQL type) columns, primary key) of the table or query."""
    conn = conn_info.connect_psycopg(autocommit=False)  # catalog queries only: psycopg connects ~8x faster
    try:
        cur = conn.cursor()
        columns = describe_columns(cur, options)
        pk: list[str] = []
        _, relation = _source_sql(options)
        if relation is not None:
            cur.execute("SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass(%s) AND i.indisprimary",
                        (relation,))
            pk = [r[0] for r in cur.fetchall()]
    except (OptionError, PostgresError):
        raise
    except Exception as e:
        raise PostgresError(f"could not describe the source on {conn_info.describe()}: {conn_info.scrub(e)}") \
            from None
    finally:
        conn.rollback()
        conn.close()
    fields = [StructField(name, spark_type(pg)[0], True) for name, pg in columns]
    return StructType(fields), columns, pk
