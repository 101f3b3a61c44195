"""PostgreSQL: logical replication slots (the WAL each holds back) and staged rows of unfinished transactional writes
(format("postgres") with sink.transactional or overwrite stages rows in sluice_stage_<digest> tables, tagged with
their write id: a streaming query's id, or a batch write's)."""

from __future__ import annotations

from typing import Any

from psycopg import sql

from sluice.connectors.postgres import Connection
from sluice.connectors.postgres.changes import drop_slot, list_slots
from sluice.doctor._model import PG_SLOT, PG_STAGED, Finding, Verdict
from sluice.doctor._owners import Owners
from sluice.meta import MetaService

SLOT_PREFIX = "sluice_"  # sluice's default slot names; slots a job recorded as its own are found by name too


def examine(conn: Connection, meta: MetaService, owners: Owners) -> list[Finding]:
    found = _slots(conn, meta, owners)
    with conn.connect_psycopg() as pg:
        return found + _staged(pg, conn, owners)


def _slots(conn: Connection, meta: MetaService, owners: Owners) -> list[Finding]:
    held = {h.name: h.job_id for h in meta.holdings() if h.kind == PG_SLOT and h.location == conn.dbname}
    found = []
    for slot in list_slots(conn, prefix=""):
        if slot.database != conn.dbname or (slot.name not in held and not slot.name.startswith(SLOT_PREFIX)):
            continue
        owner = owners.by_job.get(held[slot.name]) if slot.name in held else None
        if slot.query is not None or slot.active:
            verdict = Verdict(False, f"a running query holds it ({slot.query or 'a session decodes it now'})")
        else:
            verdict = owners.verdict(owner)
        since = f", inactive since {slot.inactive_since}" if slot.inactive_since else ""
        found.append(Finding(PG_SLOT, conn.describe(), slot.name,
                             f"retains {slot.retained_bytes:,} bytes of WAL (wal_status {slot.wal_status}){since}",
                             owner, verdict, {"retained_bytes": float(slot.retained_bytes)}, (slot.name,)))
    return found


def _staged(pg: Any, conn: Connection, owners: Owners) -> list[Finding]:
    tables = pg.execute("SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON "
                        "n.oid = c.relnamespace WHERE c.relkind = 'r' AND starts_with(c.relname, 'sluice_stage_') "
                        "ORDER BY 1, 2").fetchall()
    found = []
    for schema, table in tables:
        query = sql.SQL("SELECT _sluice_write, count(*), count(DISTINCT _sluice_epoch) FROM {} GROUP BY 1 "
                        "ORDER BY 1").format(sql.Identifier(schema, table))
        for write_id, rows, epochs in pg.execute(query).fetchall():
            owner = owners.by_query.get(write_id) or owners.by_job.get(write_id)
            found.append(Finding(PG_STAGED, conn.describe(), f"{schema}.{table} write {write_id}",
                                 f"{rows:,} staged row(s) of {epochs} uncommitted epoch(s)", owner,
                                 owners.verdict(owner), {"rows": float(rows)}, (schema, table, write_id)))
    return found


def remove(conn: Connection, meta: MetaService, finding: Finding) -> str:
    if finding.kind == PG_SLOT:
        (slot,) = finding.handle
        drop_slot(conn, slot)  # refuses a slot a running query holds: that check is made again, now
        meta.forget_holding(PG_SLOT, conn.dbname, slot)
        return f"dropped replication slot {slot} (and its publication, if sluice created it)"
    schema, table, write_id = finding.handle
    with conn.connect_psycopg() as pg:
        deleted = pg.execute(sql.SQL("DELETE FROM {} WHERE _sluice_write = %s").format(sql.Identifier(schema, table)),
                             (write_id,)).rowcount
    return f"deleted {deleted:,} staged row(s) of write {write_id} from {schema}.{table}"
