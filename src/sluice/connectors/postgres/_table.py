"""The target table: create it from a Spark schema, check that a DataFrame fits it, and the SQL of each write path.

Every check runs on the driver before any task starts. Whether a column fits is decided by PostgreSQL itself:
the DataFrame's Arrow schema is loaded (empty) into a temporary table with the same types the write path
uses, and `PREPARE ... AS INSERT INTO target SELECT ... FROM that table` must parse and type-check, i.e. every
column has an assignment cast (not EXPLAIN: ADBC wraps statements that return rows in COPY). The server's
message names the column and both types when it does not.

One module past ~400 lines on purpose: the driver's checks (`prepare_target`) build the `TablePlan` whose per-chunk
checks and statements (deletes, truncates, columns left unchanged) the tasks and the commit run; both read the same
column facts (types, NOT NULLs, the key), learnt once on the driver.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sluice.connector import (
    DELETE_OPS_SQL,
    FULL,
    TRUNCATE_OP,
    OptionError,
    RecordError,
    check_key_columns,
    check_unchanged_column,
    delete_mask,
    marked_columns,
    marked_rows,
    new_columns,
)
from sluice.connectors.postgres._client import (
    Connection,
    PostgresError,
    qualified,
    quote_ident,
    quote_literal,
    split_qualified,
)
from sluice.connectors.postgres._evolve import full_statements
from sluice.connectors.postgres._options import WriteOptions
from sluice.connectors.postgres._stage import give_checks, prepare_stage, target_checks

# Spark type -> PostgreSQL type used by create-table=true (documented in docs/postgres.md).
TYPE_MAP: tuple[tuple[type[DataType], str], ...] = (
    (BooleanType, "boolean"),
    (ByteType, "smallint"),
    (ShortType, "smallint"),
    (IntegerType, "integer"),
    (LongType, "bigint"),
    (FloatType, "real"),
    (DoubleType, "double precision"),
    (StringType, "text"),
    (BinaryType, "bytea"),
    (DateType, "date"),
    (TimestampType, "timestamp with time zone"),
    (TimestampNTZType, "timestamp without time zone"),
)

# Types whose pyarrow CSV text (strings always quoted, NULL as an empty unquoted field, floats in shortest
# round-trip form, ISO dates and timestamps) PostgreSQL parses back to the same value. COPY in CSV measured
# faster than COPY BINARY through ADBC here (bench/stores/postgres_write_read.py); other types (arrays, bytea) go
# binary.
CSV_TYPES = frozenset({"smallint", "integer", "bigint", "real", "double precision", "text", "boolean", "date",
                       "timestamp with time zone", "timestamp without time zone", "numeric"})


def pg_type(field_name: str, dtype: DataType) -> str:
    for spark_type, name in TYPE_MAP:
        if isinstance(dtype, spark_type):
            return name
    if isinstance(dtype, DecimalType):
        return f"numeric({dtype.precision},{dtype.scale})"
    if isinstance(dtype, ArrayType) and not isinstance(dtype.elementType, ArrayType):
        return pg_type(field_name, dtype.elementType) + "[]"
    raise OptionError(
        f"column '{field_name}' has Spark type {dtype.simpleString()}, which create-table cannot map to a PostgreSQL "
        "type; convert it first (e.g. F.to_json(col) for maps and structs, written to a jsonb column)."
    )


def create_table_sql(schema: str, table: str, spark_schema: StructType, primary_key: tuple[str, ...]) -> str:
    cols = [f"{quote_ident(f.name)} {pg_type(f.name, f.dataType)}" + ("" if f.nullable or f.name in primary_key
                                                                      else " NOT NULL")
            for f in spark_schema.fields]
    if primary_key:
        cols.append(f"PRIMARY KEY ({', '.join(quote_ident(c) for c in primary_key)})")
    return f"CREATE TABLE IF NOT EXISTS {qualified(schema, table)} ({', '.join(cols)})"


def add_column_sql(schema: str, table: str, field: StructField) -> str:
    """schema.evolution=add-columns: the column as create-table would make it, nullable (the table's rows have
    none); IF NOT EXISTS, so a replayed write or a second writer finds it done."""
    return (f"ALTER TABLE {qualified(schema, table)} ADD COLUMN IF NOT EXISTS {quote_ident(field.name)} "
            f"{pg_type(field.name, field.dataType)}")


@dataclass(frozen=True)
class TableColumn:
    name: str
    type: str
    not_null: bool
    has_default: bool


def table_columns(cur: Any, schema: str, table: str) -> list[TableColumn] | None:
    """The table's columns in order, or None when it does not exist."""
    cur.execute("SELECT to_regclass($1)::oid::bigint", parameters=(qualified(schema, table),))
    oid = cur.fetchone()[0]
    if oid is None:
        return None
    cur.execute(
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull, "
        "atthasdef OR attidentity <> '' OR attgenerated <> '' FROM pg_attribute "
        "WHERE attrelid = $1::bigint::oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        parameters=(oid,),
    )
    return [TableColumn(*row) for row in cur.fetchall()]


def unique_keys(cur: Any, schema: str, table: str) -> list[set[str]]:
    cur.execute(
        "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL GROUP BY i.indexrelid",
        parameters=(qualified(schema, table),),
    )
    return [set(row[0]) for row in cur.fetchall()]


def is_delete_sql(op_column: str, alias: str = "s") -> str:
    return f"COALESCE({alias}.{quote_ident(op_column)} IN {DELETE_OPS_SQL}, false)"


@dataclass(frozen=True)
class TablePlan:
    """What every task and the committer need to know about the target; decided on the driver."""

    schema: str
    table: str
    columns: tuple[str, ...]  # DataFrame columns written to the table (the op and unchanged columns are not)
    target_types: tuple[str, ...]  # their PostgreSQL types in the table
    primary_key: tuple[str, ...] = ()
    op_column: str | None = None
    unchanged_column: str | None = None  # upsert.unchanged-column
    direct: bool = False  # COPY straight into the table (CSV, or BINARY when the Arrow types are exactly its types)
    csv: bool = False  # direct, and every type's CSV text parses back to the same value: COPY ... (FORMAT csv)
    stage_table: str | None = None  # staged (transactional / overwrite) writes
    add_columns: tuple[str, ...] = ()  # staged writes: schema.evolution's ALTER TABLEs, run in the commit's transaction
    overwrite: bool = False
    # What PostgreSQL would refuse mid-COPY (after part of the chunk went in): checked per chunk in the task.
    not_null: tuple[str, ...] = ()
    int_ranges: tuple[tuple[str, int, int], ...] = ()  # (column, lowest, highest) for narrower integer columns
    max_lengths: tuple[tuple[str, int], ...] = ()  # (column, n) for varchar(n) / char(n) columns
    numeric_limits: tuple[tuple[str, int, int], ...] = ()  # (column, precision, scale) for numeric(p,s) columns
    # Distinguishes this run's staged rows from an earlier run of the same sink.write-id: Spark's task attempt
    # ids start again at 0 in every application.
    run: int = 0

    def attempt_tag(self, task_attempt_id: int) -> int:
        return (self.run << 32) | task_attempt_id

    def check_chunk(self, batch: pa.RecordBatch) -> None:
        """Refuse a chunk with a NULL for a NOT NULL column, an integer out of its column's range, a string longer
        than its varchar(n), or a number too large for its numeric(p,s), naming the column and the row's key,
        before any row of it is sent: a RecordError with the rows of the first check that fails (with
        errors.tolerance=all they go aside and the rest of the chunk is checked again)."""
        import pyarrow.compute as pc

        truncates = self.truncates(batch)
        for name in self.not_null:
            column = batch.column(name)
            if column.null_count:
                nulls = pc.is_null(column)
                if truncates is not None:  # a truncate (upsert.op-column) has no values
                    nulls = pc.and_not(nulls, truncates)
                if self.op_column:  # a delete writes no value (as the staging table's checks have it)
                    nulls = pc.and_(nulls, pc.invert(delete_mask(batch.column(self.op_column).cast(pa.string()))))
                if self.unchanged_column:  # a row that leaves the column unchanged keeps the table's value
                    nulls = pc.and_(nulls, pa.array(~marked_rows(batch.column(self.unchanged_column), name)))
                if pc.any(nulls).as_py():
                    self._refuse(batch, nulls, f"column '{name}' is NOT NULL in {self.display}, but "
                                               f"{pc.sum(nulls).as_py()} row(s) have no value for it")
        for name, low, high in self.int_ranges:
            column = batch.column(name)
            outside = pc.or_(pc.less(column, low), pc.greater(column, high))
            if pc.any(outside).as_py():
                first = pc.index(outside, True).as_py()
                self._refuse(batch, outside, f"value {column[first].as_py()} of column '{name}' is outside "
                                             f"{low}..{high}, the range of its type in {self.display}")
        for name, limit in self.max_lengths:
            column = batch.column(name)
            longer = pc.greater(pc.utf8_length(column), limit)
            if pc.any(longer).as_py():
                first = pc.index(longer, True).as_py()
                self._refuse(batch, longer, f"a value of column '{name}' has {len(column[first].as_py())} "
                                            f"characters; the column is varchar({limit}) in {self.display}")
        for name, precision, scale in self.numeric_limits:
            # PostgreSQL rounds to the scale, then refuses |value| >= 10^(precision - scale). Checked in float64:
            # exact far from the limit, and within a rounding step of it PostgreSQL's own check still applies.
            column = pc.cast(batch.column(name), pa.float64())
            bound = 10.0 ** (precision - scale) - 0.5 * 10.0 ** -scale
            over = pc.greater_equal(pc.abs(column), bound)
            if pc.any(over).as_py():
                first = pc.index(over, True).as_py()
                self._refuse(batch, over, f"value {batch.column(name)[first].as_py()} of column '{name}' does not "
                                          f"fit numeric({precision},{scale}) in {self.display} (absolute values must "
                                          f"round to less than 10^{precision - scale})")

    def truncates(self, batch: pa.RecordBatch | pa.Table) -> pa.Array | None:
        """Which rows upsert.op-column marks as a truncate (TRUNCATE_OP); None when there is none."""
        if not self.op_column:
            return None
        import pyarrow.compute as pc

        mask = pc.fill_null(pc.equal(batch.column(self.op_column), TRUNCATE_OP), False)
        return mask if pc.any(mask).as_py() else None

    def _refuse(self, batch: pa.RecordBatch, mask: pa.Array, what: str) -> None:
        """Raise RecordError for the rows where `mask` is true, naming the first by its key (else its position)."""
        import pyarrow.compute as pc

        rows = pc.indices_nonzero(mask).to_pylist()
        row = rows[0]
        keys = {k: batch.column(k)[row].as_py() for k in self.primary_key if k in batch.schema.names}
        where = f"the row with key {keys}" if keys else f"row {row} of a chunk of {batch.num_rows}"
        more = f", and {len(rows) - 1} more row(s) of the chunk" if len(rows) > 1 else ""
        raise RecordError(f"{what} ({where}{more}). Refused before anything of its chunk was sent: fix or filter such "
                          "rows (or widen the column), or set errors.tolerance=all to send them to a dead-letter "
                          "target.", rows=rows)

    @property
    def target(self) -> str:
        return qualified(self.schema, self.table)

    @property
    def display(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def upsert(self) -> bool:
        return bool(self.primary_key)

    def _value(self, column: str, pg: str, alias: str) -> str:
        ref = f"{alias}.{quote_ident(column)}"
        return f"{ref}::{pg}" if pg in ("json", "jsonb") else ref

    def marked(self, names: list[str]) -> tuple[str, ...]:
        """Of the columns a batch's rows name unchanged (`names`), those the upsert must keep: written, not the key."""
        return tuple(c for c in self.columns if c in names and c not in self.primary_key)

    def marked_in(self, table: pa.Table) -> tuple[str, ...]:
        """The columns rows of `table` leave unchanged (upsert.unchanged-column) that the upsert must keep."""
        return self.marked(marked_columns(table.column(self.unchanged_column))) if self.unchanged_column else ()

    def move_sql(self, source: str, order: str, marked: tuple[str, ...] = (), truncates: bool = False) -> list[str]:
        """Statements that apply the rows of `source` (a relation, aliased s) to the target, in `order` (columns of
        s). `marked`: the columns some row leaves unchanged (marked_in), whose stored values the upsert keeps.
        `truncates`: `source` may hold a truncate (upsert.op-column): the target is emptied, and only the rows
        after the last one are applied."""
        statements = []
        if self.op_column and truncates:
            op, t_order = quote_ident(self.op_column), order.replace("s.", "t.")
            statements.append(f"DELETE FROM {self.target} WHERE EXISTS (SELECT FROM {source} s WHERE s.{op} = "
                              f"'{TRUNCATE_OP}')")
            # Uncorrelated, so PostgreSQL reads the truncates once (a materialized subplan), not per row.
            source = (f"(SELECT * FROM {source} s WHERE ROW({order}) > ALL (SELECT {t_order} FROM {source} t "
                      f"WHERE t.{op} = '{TRUNCATE_OP}'))")
        cols = ", ".join(quote_ident(c) for c in self.columns)
        values = ", ".join(self._value(c, t, "s") for c, t in zip(self.columns, self.target_types, strict=True))
        if not self.upsert:
            return [f"INSERT INTO {self.target} ({cols}) SELECT {values} FROM {source} s ORDER BY {order}"]
        if marked:
            return statements + self._move_keeping(source, order, marked)
        key = ", ".join(f"s.{quote_ident(c)}" for c in self.primary_key)
        last = f"(SELECT DISTINCT ON ({key}) * FROM {source} s ORDER BY {key}, {order.replace(',', ' DESC,')} DESC)"
        keep = f"NOT {is_delete_sql(self.op_column)}" if self.op_column else "true"
        rest = [c for c in self.columns if c not in self.primary_key]
        conflict = ", ".join(quote_ident(c) for c in self.primary_key)
        action = ("DO UPDATE SET " + ", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in rest)
                  if rest else "DO NOTHING")
        statements.append(f"INSERT INTO {self.target} ({cols}) SELECT {values} FROM {last} s WHERE {keep} "
                          f"ON CONFLICT ({conflict}) {action}")
        if self.op_column:
            statements.append(self._delete_sql(last))
        return statements

    def _delete_sql(self, last: str) -> str:
        assert self.op_column is not None
        types = dict(zip(self.columns, self.target_types, strict=True))
        match = " AND ".join(f"t.{quote_ident(c)} = s.{quote_ident(c)}::{types[c]}" for c in self.primary_key)
        return f"DELETE FROM {self.target} t USING {last} s WHERE {match} AND {is_delete_sql(self.op_column)}"

    def _move_keeping(self, source: str, order: str, marked: tuple[str, ...]) -> list[str]:
        """move_sql when rows leave `marked` columns unchanged. Per key, the last row wins as ever, but each marked
        column takes the value of the last row that set it (the `_sluice_g<i>`-th: rows that set it, counted in
        order), and where no row of the key set it the table keeps its value: an UPDATE that keeps them for those
        keys, an INSERT of keys the table lacks (the value unknown: null), and the plain upsert for the other keys."""
        assert self.unchanged_column is not None
        key = ", ".join(f"s.{quote_ident(c)}" for c in self.primary_key)
        flag = quote_ident(self.unchanged_column)
        counts = ", ".join(
            f"count(*) FILTER (WHERE NOT COALESCE({quote_literal(c)} = ANY(s.{flag}), false)) OVER (PARTITION BY "
            f"{key} ORDER BY {order}) AS _sluice_g{i}" for i, c in enumerate(marked))
        firsts = ", ".join(f"first_value(s.{quote_ident(c)}) OVER (PARTITION BY {key}, s._sluice_g{i} ORDER BY "
                           f"{order}) AS _sluice_v{i}" for i, c in enumerate(marked))
        filled = f"(SELECT s.*, {firsts} FROM (SELECT s.*, {counts} FROM {source} s) s)"
        last = f"(SELECT DISTINCT ON ({key}) * FROM {filled} s ORDER BY {key}, {order.replace(',', ' DESC,')} DESC)"
        index = {c: i for i, c in enumerate(marked)}
        types = dict(zip(self.columns, self.target_types, strict=True))

        def value(c: str) -> str:
            return self._value(f"_sluice_v{index[c]}", types[c], "s") if c in index else self._value(c, types[c], "s")

        cols = ", ".join(quote_ident(c) for c in self.columns)
        values = ", ".join(value(c) for c in self.columns)
        live = f"NOT {is_delete_sql(self.op_column)}" if self.op_column else "true"
        kept = " OR ".join(f"s._sluice_g{i} = 0" for i in range(len(marked)))
        rest = [c for c in self.columns if c not in self.primary_key]
        conflict = ", ".join(quote_ident(c) for c in self.primary_key)
        sets = ", ".join(f"{quote_ident(c)} = CASE WHEN s._sluice_g{index[c]} = 0 THEN t.{quote_ident(c)} "
                         f"ELSE {value(c)} END" if c in index else f"{quote_ident(c)} = {value(c)}" for c in rest)
        match = " AND ".join(f"t.{quote_ident(c)} = s.{quote_ident(c)}::{types[c]}" for c in self.primary_key)
        action = "DO UPDATE SET " + ", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in rest)
        statements = [
            f"UPDATE {self.target} t SET {sets} FROM {last} s WHERE {match} AND {live} AND ({kept})",
            f"INSERT INTO {self.target} ({cols}) SELECT {values} FROM {last} s WHERE {live} AND ({kept}) "
            f"ON CONFLICT ({conflict}) DO NOTHING",
            f"INSERT INTO {self.target} ({cols}) SELECT {values} FROM {last} s WHERE {live} AND NOT ({kept}) "
            f"ON CONFLICT ({conflict}) {action}"]
        if self.op_column:
            statements.append(self._delete_sql(last))
        return statements


def _base(pg: str) -> str:
    return re.sub(r"\(.*?\)", "", pg)


def schema_digest(schema: str, table: str, arrow_schema: pa.Schema) -> str:
    """Names a staging or temporary table after its target and columns (a new schema gets a new table)."""
    return hashlib.sha1(f"{schema}.{table}|{arrow_schema}".encode()).hexdigest()[:12]


VARCHAR_RE = re.compile(r"(?:character varying|character)\((\d+)\)")
NUMERIC_RE = re.compile(r"numeric\((\d+)(?:,(\d+))?\)")
INT_RANGES = {"smallint": (-2**15, 2**15 - 1), "integer": (-2**31, 2**31 - 1)}


def _chunk_checks(columns: tuple[str, ...], target_types: tuple[str, ...], existing: dict[str, Any],
                  data_schema: pa.Schema) -> dict[str, Any]:
    """The per-chunk checks a plan needs: NOT NULL columns, integer columns narrower than their Arrow type,
    length-limited strings and numeric(p,s) columns fed by numbers that may not fit."""
    not_null = tuple(c for c in columns if existing[c].not_null)
    ranges, lengths, numerics = [], [], []
    for name, pg in zip(columns, target_types, strict=True):
        arrow_type = data_schema.field(name).type
        if pg in INT_RANGES and pa.types.is_integer(arrow_type):
            low, high = INT_RANGES[pg]
            if arrow_type.bit_width > (16 if pg == "smallint" else 32):
                ranges.append((name, low, high))
        declared = existing[name].type
        if (m := VARCHAR_RE.fullmatch(declared)) and (pa.types.is_string(arrow_type)
                                                      or pa.types.is_large_string(arrow_type)):
            lengths.append((name, int(m.group(1))))
        elif (m := NUMERIC_RE.fullmatch(declared)) and (pa.types.is_decimal(arrow_type)
                                                        or pa.types.is_floating(arrow_type)
                                                        or pa.types.is_integer(arrow_type)):
            precision, scale = int(m.group(1)), int(m.group(2) or 0)
            fits = (pa.types.is_decimal(arrow_type)
                    and arrow_type.precision - arrow_type.scale <= precision - scale and arrow_type.scale <= scale)
            if not fits:
                numerics.append((name, precision, scale))
    return {"not_null": not_null, "int_ranges": tuple(ranges), "max_lengths": tuple(lengths),
            "numeric_limits": tuple(numerics)}


def _probe_types(cur: Any, arrow_schema: pa.Schema) -> list[str]:
    """The PostgreSQL types the Arrow columns load as (ADBC's mapping), read off an empty temporary table."""
    cur.execute("DROP TABLE IF EXISTS pg_temp.sluice_probe")
    cur.adbc_ingest("sluice_probe", arrow_schema.empty_table(), mode="create", temporary=True)
    cur.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'pg_temp.sluice_probe'"
                "::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum")
    return [row[0] for row in cur.fetchall()]


def prepare_target(conn_info: Connection, options: WriteOptions, spark_schema: StructType,
                   arrow_schema: pa.Schema, *, overwrite: bool, staged: bool, pooled: bool = False) -> TablePlan:
    """On the driver: create or check the table and return the plan. Raises before anything is written. `pooled`:
    a streaming query's plan, made every micro-batch (and again for its commit): from the process's pool, it
    costs a few round trips rather than an ADBC connection (~40 ms)."""
    schema, table = split_qualified(options.table)
    pk = options.primary_key
    op_column = options.upsert_op_column
    unchanged = options.upsert_unchanged_column
    check_key_columns(spark_schema.fieldNames(), pk, op_column)
    if op_column and not pk:
        raise OptionError("upsert.op-column needs primary-key: deletes find their row by key")
    check_unchanged_column(arrow_schema, unchanged, pk)
    data_fields = [f for f in spark_schema.fields if f.name not in (op_column, unchanged)]
    columns = tuple(f.name for f in data_fields)
    lease = conn_info.lease(conn_info.pool_key("adbc", autocommit=False), pooled=pooled)
    conn = lease.conn
    finished = False
    try:
        cur = conn.cursor()
        existing = table_columns(cur, schema, table)
        if existing is None:
            if not options.create_table:
                raise OptionError(f"table {schema}.{table} does not exist; create it, or set create-table=true to "
                                  "create it from the DataFrame's schema")
            cur.execute(create_table_sql(schema, table, StructType(data_fields), pk))
            conn.commit()
            existing = table_columns(cur, schema, table)
            assert existing is not None
        by_name = {c.name: c for c in existing}
        fields = {f.name: f for f in data_fields}
        # schema.evolution=add-columns: the checks below run on the table with its new columns, in a transaction
        # rolled back after them; the columns are added for good before any row is written (or in the commit).
        new = new_columns(columns, by_name, f"{schema}.{table}", options.schema_evolution)
        if options.schema_evolution == FULL:  # renames, drops and widened types too (_evolve.py)
            added = full_statements(cur, schema, table, {c.name: c.type for c in existing}, data_fields,
                                    lambda f: add_column_sql(schema, table, f), pg_type)
        else:
            added = tuple(add_column_sql(schema, table, fields[name]) for name in new)
        for statement in added:
            cur.execute(statement)
        if added:
            existing = table_columns(cur, schema, table) or []
            by_name = {c.name: c for c in existing}
        for col in existing:
            if col.name not in columns and col.not_null and not col.has_default:
                raise OptionError(f"column '{col.name}' of table {schema}.{table} is NOT NULL without a default, and "
                                  "the DataFrame has no such column; add it to the DataFrame.")
        if pk and set(pk) not in unique_keys(cur, schema, table):
            raise OptionError(f"primary-key {list(pk)}: table {schema}.{table} has no primary key or unique index on "
                              f"exactly these columns, which INSERT ... ON CONFLICT needs. Add one, e.g. ALTER TABLE "
                              f"... ADD PRIMARY KEY ({', '.join(pk)}).")
        target_types = tuple(by_name[c].type for c in columns)
        data_schema = pa.schema([arrow_schema.field(c) for c in columns])
        loaded_types = _probe_types(cur, data_schema)
        direct = list(loaded_types) == list(target_types) and not pk
        # CSV text parses by the target's own input function, so only the base type must agree
        # (numeric into numeric(11,3) is fine; text into varchar(10) goes through the server's casts instead).
        csv = not pk and all(_base(a) == _base(b) and _base(b) in CSV_TYPES
                             for a, b in zip(loaded_types, target_types, strict=True))
        checks = _chunk_checks(columns, target_types, by_name, data_schema)
        plan = TablePlan(schema, table, columns, target_types, pk, op_column, unchanged, direct=direct or csv,
                         csv=csv, **checks)
        try:
            values = ", ".join(plan._value(c, t, "s") for c, t in zip(columns, target_types, strict=True))
            # PREPARE parses and type-checks the INSERT exactly as the writes will run it, without running it.
            names = ", ".join(quote_ident(c) for c in columns)
            cur.execute(f"PREPARE sluice_fit AS INSERT INTO {plan.target} ({names}) "
                        f"SELECT {values} FROM pg_temp.sluice_probe s")
            cur.execute("DEALLOCATE sluice_fit")
        except Exception as e:
            raise OptionError(f"the DataFrame does not fit table {schema}.{table}: {conn_info.scrub(e)} Cast the "
                              "column in Spark or change the table; nothing was written.") from None
        conn.rollback()
        if added and not staged:
            for statement in added:
                cur.execute(statement)
            conn.commit()
        if staged:
            stage = "sluice_stage_" + schema_digest(schema, table, arrow_schema)
            stage_checks = target_checks(cur, schema, table, columns, plan.not_null, op_column, unchanged)
            unchecked = prepare_stage(cur, schema, stage, arrow_schema, stage_checks)
            conn.commit()
            if unchecked:
                with conn_info.pooled(autocommit=False, pooled=pooled) as sql:
                    give_checks(sql, schema, stage, stage_checks, plan.display)
            plan = TablePlan(schema, table, columns, target_types, pk, op_column, unchanged, stage_table=stage,
                             add_columns=added, overwrite=overwrite, run=secrets.randbits(30), **checks)
        cur.close()
        finished = True
        return plan
    except (OptionError, PostgresError):
        raise
    except Exception as e:
        raise PostgresError(f"preparing the write to {schema}.{table} failed: {conn_info.scrub(e)}") from None
    finally:
        lease.release(clean=finished)
