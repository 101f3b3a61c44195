"""`spark.readStream.format("postgres")`: a table or query streamed by a tracking column, for databases without
logical replication (read replicas, managed services that forbid it); the mechanism is sluice's tracking-column
stream (docs/tracking.md), the tie-breaker the table's primary key.

The tracking column is an integer (smallint, integer, bigint: an identity or serial id) or a timestamp (with or
without time zone, in microseconds). Every position is compared by the server as a row value,
`(tracking column, key...) > (value, key...)`, so an index on (tracking column, primary key) makes each
micro-batch one index range scan. Keys travel as their text and come back cast to their column's type.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from sluice.connector import (
    DeadLetterWriter,
    Split,
    SqlTrackingEnumerator,
    TrackingPosition,
    TrackingReader,
    TrackingSettings,
    conform_or_aside,
    read_with_letters,
    tracking_column_kind,
)
from sluice.connectors.postgres._client import (
    Connection,
    PostgresError,
    is_connection_error,
    quote_ident,
    quote_literal,
)
from sluice.connectors.postgres._options import ReadOptions
from sluice.connectors.postgres._source import YIELD_ROWS, PostgresSplitReader, _source_sql, finite_times

_PRECISION = re.compile(r"\(\d+\)")
_KINDS = {"smallint": "int", "integer": "int", "bigint": "int",
          "timestamp with time zone": "timestamp", "timestamp without time zone": "timestamp"}


def tracking_kind(columns: list[tuple[str, str]], settings: TrackingSettings, source: str) -> tuple[str, str]:
    """(kind, PostgreSQL type) of the tracking column (`tracking_column_kind`'s checks, by PostgreSQL's types)."""
    types = dict(columns)
    kind = tracking_column_kind(settings, types, lambda pg: _KINDS.get(_PRECISION.sub("", pg)), source=source,
                                where="the source",
                                works="an integer (smallint, integer, bigint) or a timestamp (with or without time "
                                      "zone) whose values grow as rows are written")
    return kind, _PRECISION.sub("", types[settings.column])  # timestamp(3) with time zone is a timestamp


class PostgresTrackingSql:
    """The SQL of positions: the tracking column and the key, as the server compares and hands them over."""

    def __init__(self, options: ReadOptions, column: str, pg_type: str, kind: str,
                 key: list[tuple[str, str]]) -> None:
        self.source = _source_sql(options)[0]
        self.column, self.pg_type, self.kind, self.key = f"q.{quote_ident(column)}", pg_type, kind, key
        self.key_columns = [f"q.{quote_ident(name)}" for name, _ in key]
        self.not_null = f"{self.column} IS NOT NULL"

    def number(self) -> str:
        """The tracking value as a bigint (timestamps: microseconds since the epoch, exactly)."""
        if self.kind == "int":
            return f"{self.column}::bigint"
        c = self.column
        return (f"(extract(epoch from date_trunc('second', {c}))::bigint * 1000000 + "
                f"extract(microseconds from {c})::bigint % 1000000)")

    def literal(self, value: int) -> str:
        if self.kind == "int":
            return f"{int(value)}::{self.pg_type}"
        seconds, micros = divmod(int(value), 1_000_000)
        moment = f"(to_timestamp({seconds}) + {micros} * interval '1 microsecond')"
        return moment if self.pg_type == "timestamp with time zone" else f"({moment} AT TIME ZONE 'UTC')"

    def after(self, at: TrackingPosition) -> str:
        """Rows past `at`."""
        if at.value is None:
            return self.not_null
        if at.key is None:
            return f"{self.column} >= {self.literal(at.value)}"
        return f"{self._row()} > {self._row_of(at)}"

    def upto(self, at: TrackingPosition) -> str:
        """Rows up to `at`, `at` included (a head, always a whole position)."""
        return f"{self._row()} <= {self._row_of(at)}"

    def _row(self) -> str:
        return f"({', '.join([self.column, *self.key_columns])})" if self.key else f"({self.column})"

    def _row_of(self, at: TrackingPosition) -> str:
        assert at.value is not None and at.key is not None
        keys = [f"{quote_literal(text)}::{pg}" for text, (_, pg) in zip(at.key, self.key, strict=True)]
        return f"({', '.join([self.literal(at.value), *keys])})" if keys else f"({self.literal(at.value)})"

    def order(self, descending: bool = False) -> str:
        way = " DESC" if descending else ""
        return ", ".join(f"{c}{way}" for c in [self.column, *self.key_columns])

    def position_list(self) -> str:
        return ", ".join([self.number(), *(f"{c}::text" for c in self.key_columns)])

    def range(self, after: TrackingPosition, upto: TrackingPosition) -> str:
        return f"{self.after(after)} AND {self.upto(upto)}"


class PostgresTrackingEnumerator(SqlTrackingEnumerator):
    """Driver side: the head and the ends of capped ranges, on one connection kept between micro-batches."""

    def __init__(self, conn_info: Connection, sql: PostgresTrackingSql, column: str) -> None:
        self.conn_info, self.sql, self.column, self.kind = conn_info, sql, column, sql.kind
        self.source = sql.source
        self._conn: Any = None

    def rows(self, query: str) -> list[tuple[Any, ...]]:
        for attempt in (1, 2):  # a connection the server ended between micro-batches is opened again, once
            try:
                if self._conn is None:
                    self._conn = self.conn_info.connect_psycopg(autocommit=True)
                return self._conn.execute(query).fetchall()
            except Exception as e:
                self.close()
                if attempt == 2 or not is_connection_error(e):
                    raise PostgresError(f"tracking query on {self.conn_info.describe()} failed: "
                                        f"{self.conn_info.scrub(e)}") from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class PostgresTrackingReader(TrackingReader):
    """Executor side: one range of rows over COPY BINARY (ADBC), as the batch read's splits are read."""

    def __init__(self, rows: PostgresSplitReader, sql: PostgresTrackingSql) -> None:
        """`rows`: the batch read's split reader, whose select list, schema and dead-letter route it reads with."""
        self.rows = rows
        self.conn_info, self.sql = rows.conn_info, sql

    def read(self, split: Split, after: TrackingPosition, upto: TrackingPosition) -> Iterator[pa.RecordBatch]:
        r = self.rows
        return read_with_letters(r.dead_letters, r.read_id, r.streaming, r.described(),
                                 lambda letters: self._read(split, after, upto, letters))

    def _read(self, split: Split, after: TrackingPosition, upto: TrackingPosition,
              letters: DeadLetterWriter | None) -> Iterator[pa.RecordBatch]:
        s = self.sql
        query = f"SELECT {self.rows.select_list()} FROM {s.source} WHERE {s.range(after, upto)} ORDER BY {s.order()}"
        with self.conn_info.reading(f"{split.split_id} ({after} - {upto})") as (_, cur):
            cur.execute(query)
            for batch in cur.fetch_record_batch():
                batch = finite_times(batch)
                for start in range(0, batch.num_rows, YIELD_ROWS):
                    yield conform_or_aside(batch.slice(start, YIELD_ROWS), self.rows.arrow_schema, letters,
                                           f"{self.rows.described()}, {split.split_id} ({after} - {upto})")
