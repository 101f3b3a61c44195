"""Lookup joins on ClickHouse (`sluice.lookup(df, "clickhouse", ...)`, docs/lookup.md): a `LookupReader` whose
queries find an Arrow batch's keys, `lookup.max-keys-per-request` a query, up to `lookup.max-concurrent-requests` in
flight at once (run_requests).

One key column: `SELECT ... FROM db.t WHERE k IN (SELECT arrayJoin({k0:Array(T)}))`; several: `WHERE (a, b) IN
(SELECT arrayJoin(arrayZip({k0:Array(Ta)}, {k1:Array(Tb)})))`. The keys travel as ClickHouse query parameters
(`param_k0`), typed by the key column's own type and parsed by the server, never pasted into the SQL. An `IN` on a
set serves itself from the primary index when the key leads the sorting key; on another column each query reads the
table's granules (ClickHouse has no secondary unique index). Columns are cast as the batch read casts them
(_types.read_type) and come back as `FORMAT ArrowStream`, so a looked-up row is typed as
`spark.read.format("clickhouse")` types it.

What a lookup reads: the parts inserted (an INSERT is visible once its part is written; ClickHouse has no
transactions, so a query sees every part committed when it starts). A ReplacingMergeTree table is read with FINAL,
as the batch read does (option `final`), so a key's replaced rows and, with an is_deleted column, its deleted ones
never show; without FINAL the rows of a key not yet merged would each come back. A key with several rows in a
MergeTree table gives each of them.

The HTTP client is the process's pool (_client.py), shared by a worker's tasks. A server that cannot be reached,
or answers that it is overloaded, is retried `lookup.max-retries` times (backoff from 0.5 s), then fails the task naming
the table and the server; a lookup never returns no rows for a key it could not ask about.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from sluice.connector import (
    LookupReader,
    OptionError,
    Options,
    from_arrow_schema,
    lookup_retry_pause,
    require_name,
    run_requests,
    slices,
    to_arrow_schema,
)
from sluice.connectors.clickhouse._client import ClickHouseError, ClickHouseRetryableError, Connection, quote_ident
from sluice.connectors.clickhouse._options import LookupOptions
from sluice.connectors.clickhouse._source import check_final, read_schema
from sluice.connectors.clickhouse._table import describe
from sluice.connectors.clickhouse._types import SIGNED, UNSIGNED, CHType, read_type

STRINGS = ("String", "UUID")
DATES = ("Date", "Date32")
DATE_RANGES = {"Date": (dt.date(1970, 1, 1), dt.date(2149, 6, 6)),
               "Date32": (dt.date(1900, 1, 1), dt.date(2299, 12, 31))}
KEY_TYPES = "Int8..Int64, UInt8..UInt64, String, UUID, Date or Date32 (or Nullable/LowCardinality of them)"
# Query parameters travel in the URL: ClickHouse takes 1 MiB (http_max_uri_size), common proxies and the test
# stand-in 64 KiB. Keys beyond this many URL bytes go in a further query of the same batch.
URL_BUDGET = 48 * 1024


def _range(kind: str) -> tuple[int, int]:
    if kind in SIGNED:
        bits = SIGNED[kind]
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << UNSIGNED[kind]) - 1


def _in_range(column: pa.ChunkedArray | pa.Array, kind: CHType) -> pa.Array | None:
    """Which keys the column's type can hold (None: all): an integer or date out of its range cannot be in the
    table, and the server would refuse it as a parameter of that type, or, for a date, clamp it into the range
    and match the first or last day's rows."""
    if kind.name in DATE_RANGES:
        first, last = (pa.scalar(day, pa.date32()) for day in DATE_RANGES[kind.name])
        return pc.and_(pc.greater_equal(column, first), pc.less_equal(column, last))
    if kind.name not in SIGNED and kind.name not in UNSIGNED:
        return None
    low, high = _range(kind.name)
    as_decimal = pa.types.is_decimal(column.type)  # UInt64 reads as decimal(20, 0)
    lo = pa.scalar(low, column.type) if as_decimal else low
    hi = pa.scalar(high, column.type) if as_decimal else high
    return pc.and_(pc.greater_equal(column, lo), pc.less_equal(column, hi))


def _elements(column: pa.ChunkedArray | pa.Array, kind: CHType) -> pa.Array:
    """Each key as an element of a ClickHouse array literal in the parameter's text: numbers as they are, strings
    and dates quoted, with `\\` and `'` escaped (the server parses the parameter as `Array(kind)`)."""
    text = pc.cast(column, pa.string())
    if kind.name in SIGNED or kind.name in UNSIGNED:
        return text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
    escaped = pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), "'", "\\'")
    quoted = pc.binary_join_element_wise("'", escaped, "'", "")
    return quoted.combine_chunks() if isinstance(quoted, pa.ChunkedArray) else quoted


class ClickHouseLookupReader(LookupReader):
    """Rows of one table by key: see the module's docstring. Made by `plan_lookup` on the driver."""

    def __init__(self, conn: Connection, described: str, sql: str, on: tuple[str, ...], kinds: tuple[CHType, ...],
                 schema: StructType, retries: int, concurrency: int = 1, keys_per_request: int = 1_000) -> None:
        self.conn, self._described, self.sql, self.on, self.kinds = conn, described, sql, on, kinds
        self._schema, self.retries = schema, retries
        self.concurrency, self.keys_per_request = concurrency, keys_per_request
        self.arrow = to_arrow_schema(schema)

    @property
    def schema(self) -> StructType:
        return self._schema

    @property
    def described(self) -> str:
        return self._described

    def lookup(self, keys: pa.Table) -> pa.Table:
        for name, kind in zip(self.on, self.kinds, strict=True):
            inside = _in_range(keys.column(name), kind)
            if inside is not None:
                keys = keys.filter(inside)
        if keys.num_rows == 0:
            return self.arrow.empty_table()
        elements = [_elements(keys.column(name), kind) for name, kind in zip(self.on, self.kinds, strict=True)]
        requests = [chunk for start, length in slices(keys.num_rows, self.keys_per_request)
                    for chunk in _chunks([column.slice(start, length) for column in elements])]
        # Concurrent queries on the worker process's HTTP pool (urllib3's, thread-safe); results in requests' order.
        tables = run_requests(("clickhouse", self.conn.url), self.concurrency, self._query, requests)
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def _query(self, request: tuple[dict[str, str], int]) -> pa.Table:
        """The rows of one query, its keys given; a server that cannot answer is asked again, lookup.max-retries
        times."""
        params, count = request
        for attempt in range(self.retries + 1):
            try:
                batches = list(self.conn.arrow_batches(self.sql, **params))
                table = pa.Table.from_batches(batches) if batches else self.arrow.empty_table()
                return table.rename_columns(self.arrow.names).cast(self.arrow)
            except ClickHouseRetryableError as e:
                if attempt == self.retries:
                    raise ClickHouseError(f"looking up {count} key(s) in {self.described} failed after "
                                          f"{attempt + 1} attempt(s) (lookup.max-retries={self.retries}): {e}"
                                          ) from None
                lookup_retry_pause(self.described, count, attempt, self.retries, e)
            except ClickHouseError as e:
                raise ClickHouseError(f"looking up {count} key(s) in {self.described} failed: {e}", e.code) from None
        raise AssertionError("unreachable: the last attempt returns or raises")


def _chunks(elements: list[pa.Array]) -> Iterator[tuple[dict[str, str], int]]:
    """The query parameters of the keys (`param_k0` ... as `[e1,e2,...]`), in as many queries as URL_BUDGET needs."""
    count = len(elements[0])
    params = {f"param_k{i}": f"[{_joined(column)}]" for i, column in enumerate(elements)}
    if count > 1 and sum(len(quote(v)) for v in params.values()) > URL_BUDGET:
        half = count // 2
        yield from _chunks([column.slice(0, half) for column in elements])
        yield from _chunks([column.slice(half) for column in elements])
        return
    yield params, count


def _joined(column: pa.Array) -> str:
    """The elements joined by commas, in Arrow (one list of them, joined once)."""
    one = pa.ListArray.from_arrays(pa.array([0, len(column)], pa.int32()), column)
    return str(pc.binary_join(one, ",")[0].as_py())


def _select(name: str, kind: CHType) -> str:
    """How the batch read selects a column (_source.py's select_sql): cast to its read type when that differs."""
    target = read_type(kind)
    column = quote_ident(name)
    return column if target == kind else f"CAST({column} AS {target}) AS {column}"


def plan_lookup(opts: Options, on: tuple[str, ...], columns: tuple[str, ...] | None) -> ClickHouseLookupReader:
    """The reader of a lookup in the table the options name, its key and looked-up columns checked on the driver,
    and its query run once on no keys, so that a key the server cannot take fails here, named."""
    options = LookupOptions.of(opts)
    conn = options.conn
    info = describe(conn)  # refuses a missing table by name, with a case hint
    of = f"table {conn.database}.{conn.table}"
    described = f"{of} on ClickHouse at {conn.url}"
    for key in on:
        require_name(key, info.spelled, "key column", of, advice="Name the table's key column in on=, as the "
                     "DataFrame names it (rename the DataFrame's column to match).")
    for name in columns or ():
        require_name(name, info.spelled, "looked-up column", of, advice="Leave it out of columns=[...].")
    wanted = list(dict.fromkeys([*on, *(columns if columns is not None else
                                        [n for n in info.spelled if n not in on])]))
    types, arrow = read_schema(info)
    kinds = tuple(types[key].base for key in on)
    for key, kind in zip(on, kinds, strict=True):
        if not (kind.name in SIGNED or kind.name in UNSIGNED or kind.name in STRINGS or kind.name in DATES):
            raise OptionError(f"key column '{key}' of {of} is {info.spelled[key]}: a lookup takes keys of type "
                              f"{KEY_TYPES}; look up by such a column")
    params = [f"{{k{i}:Array({kind})}}" for i, kind in enumerate(kinds)]
    if len(on) == 1:
        where = f"{quote_ident(on[0])} IN (SELECT arrayJoin({params[0]}))"
    else:
        where = (f"({', '.join(quote_ident(k) for k in on)}) IN (SELECT arrayJoin(arrayZip({', '.join(params)})))")
    final = " FINAL" if check_final(info, options.final) else ""
    sql = f"SELECT {', '.join(_select(n, types[n]) for n in wanted)} FROM {conn.target}{final} WHERE {where}"
    try:
        list(conn.arrow_batches(sql, **{f"param_k{i}": "[]" for i in range(len(on))}))
    except ClickHouseError as e:
        raise ClickHouseError(f"the lookup of keys {list(on)} in {described} cannot run: {e}", e.code) from None
    schema = from_arrow_schema(pa.schema([arrow.field(n) for n in wanted]))
    return ClickHouseLookupReader(conn, described, sql, on, kinds, schema, options.lookup_max_retries,
                                  options.lookup_max_concurrent_requests, options.lookup_max_keys_per_request)
