"""The staging table of staged writes (sink.transactional, overwrite): created from the Arrow schema, so that COPY
BINARY loads it as it is, and given the target's CHECK constraints and NOT NULLs, so that a row the table would refuse
is refused when its task stages it (a RecordError: errors.tolerance=all sends it aside) rather than when the driver
commits the epoch, which would fail whole.

The constraints are evaluated on the staged values, in the types the DataFrame loads as; a CHECK that cannot be
(its expression does not apply to those types, or it reads a column the DataFrame does not write) is left to the
commit and named in the log. So are UNIQUE, PRIMARY KEY, FOREIGN KEY and EXCLUDE constraints, triggers, domains'
checks and the casts into the target's types: what they refuse still fails the commit, which then commits nothing.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pyarrow as pa

from sluice.connector import VALUELESS_OPS_SQL
from sluice.connectors.postgres._client import qualified, quote_ident, quote_literal, server_words

log = logging.getLogger("sluice.postgres")

TAGS = pa.schema([("_sluice_write", pa.string()), ("_sluice_epoch", pa.int64()), ("_sluice_task", pa.int32()),
                  ("_sluice_attempt", pa.int64()), ("_sluice_seq", pa.int64())])
Check = tuple[str, str, bool]  # a CHECK constraint for the staging table: name, clause, usable there
_MARK = "sluice checks "  # the staging table's comment: which checks it carries (a digest), so they are set once


def target_checks(cur: Any, schema: str, table: str, columns: tuple[str, ...], not_null: tuple[str, ...],
                  op_column: str | None, unchanged_column: str | None = None) -> list[Check]:
    """(name, CHECK clause, usable) for the staging table: the target's CHECK constraints, then a CHECK per NOT NULL
    column; one that reads a column the DataFrame does not write is not usable (its clause says why). With an op
    column, a delete or a truncate is not checked (it inserts nothing); with an unchanged column, a NOT NULL column a
    row names is not either (the table keeps its value)."""
    cur.execute(
        "SELECT c.conname::text, pg_get_expr(c.conbin, c.conrelid), "
        "(SELECT array_agg(a.attname::text) FROM pg_attribute a WHERE a.attrelid = c.conrelid "
        "AND a.attnum = ANY(c.conkey)) FROM pg_constraint c WHERE c.conrelid = to_regclass($1) AND c.contype = 'c' "
        "ORDER BY c.conname",
        parameters=(qualified(schema, table),),
    )
    written = set(columns)
    is_delete = f"COALESCE({quote_ident(op_column)} IN {VALUELESS_OPS_SQL}, false)" if op_column else None

    def clause(expr: str) -> str:
        return f"({is_delete} OR {expr})" if is_delete else expr

    checks: list[Check] = []
    for name, expr, used in cur.fetchall():
        missing = ", ".join(sorted(set(used or ()) - written))
        if missing:
            checks.append((name, f"reads columns the DataFrame does not write ({missing})", False))
        else:
            checks.append((name, clause(expr), True))
    taken = {name for name, _, _ in checks}
    for column in not_null:
        name = f"{table}_{column}_not_null"
        if name not in taken:
            kept = (f" OR COALESCE({quote_literal(column)} = ANY({quote_ident(unchanged_column)}), false)"
                    if unchanged_column else "")
            checks.append((name, clause(f"({quote_ident(column)} IS NOT NULL{kept})"), True))
    return checks


def prepare_stage(cur: Any, schema: str, stage: str, arrow_schema: pa.Schema, checks: list[Check]) -> bool:
    """Create (or find) the staging table `stage`, its index and the commit log; the caller commits. True when the
    staging table does not carry `checks` yet (then `give_checks`)."""
    target = qualified(schema, stage)
    cur.adbc_ingest(stage, pa.schema([*arrow_schema, *TAGS]).empty_table(), mode="create_append",
                    db_schema_name=schema)
    cur.execute(f"CREATE INDEX IF NOT EXISTS {quote_ident(stage + '_epoch')} ON {target} "
                "(_sluice_write, _sluice_epoch)")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {qualified(schema, 'sluice_commit_log')} (target text NOT NULL, "
                "write_id text NOT NULL, epoch bigint NOT NULL, rows bigint NOT NULL, "
                "committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (target, write_id, epoch))")
    # Every micro-batch of a stream plans its write: one query when nothing changed.
    cur.execute("SELECT obj_description(to_regclass($1), 'pg_class')", parameters=(target,))
    return bool(cur.fetchone()[0] != _mark(checks))


def _mark(checks: list[Check]) -> str:
    return _MARK + hashlib.sha1(repr(checks).encode()).hexdigest()[:16]


def give_checks(conn: Any, schema: str, stage: str, checks: list[Check], display: str) -> None:
    """Replace the staging table's CHECK constraints by `checks`, in one transaction of `conn` (psycopg: a CHECK that
    fails to apply is rolled back to its savepoint, which ADBC's connection does not allow)."""
    target = qualified(schema, stage)
    with conn.transaction():
        cur = conn.cursor()
        cur.execute(f"SELECT conname::text FROM pg_constraint WHERE conrelid = to_regclass({quote_literal(target)}) "
                    "AND contype = 'c'")
        for (old,) in cur.fetchall():
            cur.execute(f"ALTER TABLE {target} DROP CONSTRAINT {quote_ident(old)}")
        for name, expr, usable in checks:
            if not usable:
                log.warning("postgres: CHECK constraint %s of %s %s: it applies at the commit only, where a row that "
                            "violates it fails the whole epoch", name, display, expr)
                continue
            # NOT VALID: rows already staged (an attempt that died) are not checked again, new rows are. A CHECK
            # whose expression does not apply to the staged types is left to the commit.
            try:
                with conn.transaction():
                    cur.execute(f"ALTER TABLE {target} ADD CONSTRAINT {quote_ident(name)} CHECK ({expr}) NOT VALID")
            except Exception as e:
                log.warning("postgres: CHECK constraint %s of %s cannot be evaluated on the staged types (%s): it "
                            "applies at the commit only, where a row that violates it fails the whole epoch", name,
                            display, server_words(e) or type(e).__name__)
        cur.execute(f"COMMENT ON TABLE {target} IS {quote_literal(_mark(checks))}")
