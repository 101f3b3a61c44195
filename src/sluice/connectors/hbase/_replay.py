"""write.replay-guard for format("hbase"): the last micro-batch committed per query and target table, kept in a
table of sluice's own.

A table of its own, not a row of the target: readers of the target (format("hbase") scans, the shell, other
connectors) would meet a row that is not data, and the target's families may expire or limit cells in ways the
marker must not be subject to. The guard table has one family `m` keeping one version and no time to live, one row
per query and target table (`<query id>:<namespace:table>`), so it stays a region of a few rows. It is created on
the first micro-batch's commit (the user needs the right to create it, or an administrator creates it beforehand:
`create 'sluice_replay_guard', {NAME => 'm', VERSIONS => 1}`).

The marker is the cell `m:batch` whose timestamp is the micro-batch id: HBase returns the cell with the highest
timestamp, so a replayed older micro-batch that marks again writes a cell that stays hidden, with no read first
(as Elasticsearch's external_gte versions do for its guard).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.connector import OptionError, ReplayGuard
from sluice.connectors.hbase._client import Connection, HBaseError, describe, thrift

FAMILY, QUALIFIER = b"m", b"batch"


def qualified(table: str) -> str:
    """namespace:name (HBase's default namespace when `table` names none)."""
    return table if ":" in table else f"default:{table}"


def table_name(table: str) -> Any:
    namespace, _, name = qualified(table).partition(":")
    return thrift().TTableName(ns=namespace.encode(), qualifier=name.encode())


def check_guard_table(conn: Connection, table: str) -> None:
    """On the driver, once per write: an existing guard table must keep the markers (its family m, no time to
    live: a marker's timestamp is a micro-batch id, which a time to live would expire at once)."""
    if not conn.call("tableExists", table_name(table)):
        return  # created at the first commit
    facts = describe(conn, qualified(table))
    if FAMILY not in facts.families or FAMILY in facts.ttl_families:
        raise OptionError(f"write.replay-guard-table {table} must have a column family 'm' without a time to live "
                          "(the markers' timestamps are micro-batch ids): create it with create "
                          f"'{table}', {{NAME => 'm', VERSIONS => 1}}, name another table, or set "
                          "write.replay-guard=false.")


@dataclass(frozen=True)
class TableReplayGuard(ReplayGuard):
    """write.replay-guard: the row `<query id>:<target>` of `table` holds the last micro-batch committed into
    `target` as the timestamp of its cell m:batch."""

    conn: Connection
    table: str
    target: str

    def _row(self, write_id: str) -> bytes:
        return f"{write_id}:{qualified(self.target)}".encode()  # one row however the target is named

    def last_committed(self, write_id: str) -> int | None:
        module = thrift()
        get = module.TGet(row=self._row(write_id), columns=[module.TColumn(family=FAMILY, qualifier=QUALIFIER)])
        try:
            result = self.conn.call("get", self.table.encode(), get)
        except HBaseError:
            if not self.conn.call("tableExists", table_name(self.table)):
                return None  # no micro-batch of any query has been committed yet
            raise
        cells = result.columnValues or []
        return int(cells[0].timestamp) if cells else None

    def mark_committed(self, write_id: str, epoch: int) -> None:
        module = thrift()
        put = module.TPut(row=self._row(write_id), columnValues=[module.TColumnValue(
            family=FAMILY, qualifier=QUALIFIER, value=str(epoch).encode(), timestamp=epoch)])
        try:
            self.conn.call("put", self.table.encode(), put)
        except HBaseError:
            if self.conn.call("tableExists", table_name(self.table)):
                raise
            self._create()
            self.conn.call("put", self.table.encode(), put)

    def _create(self) -> None:
        module = thrift()
        family = module.TColumnFamilyDescriptor(name=FAMILY, maxVersions=1)
        try:
            self.conn.call("createTable", module.TTableDescriptor(tableName=table_name(self.table),
                                                                  columns=[family]), None)
        except HBaseError:
            if not self.conn.call("tableExists", table_name(self.table)):
                raise  # not another driver's creation of the same table: e.g. no right to create it
