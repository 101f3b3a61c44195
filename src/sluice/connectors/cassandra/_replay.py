"""write.replay-guard for format("cassandra"): the last micro-batch committed per query and target table, kept in a
table of the target's keyspace.

The guard table (`sluice_replay_guard` by default: query text, target text, micro_batch bigint, one partition per
query and target) is created on the first micro-batch's commit (the user needs CREATE on the keyspace, or an
administrator creates it beforehand with GUARD_COLUMNS). It lives in the target's keyspace, so it has the same
replication as the data it guards.

The driver marks with `UPDATE ... USING TIMESTAMP <micro-batch id>`: Cassandra keeps the cell with the highest write
timestamp, so a replayed older micro-batch that marks again changes nothing, with no read and no lightweight
transaction (Paxos' four round trips buy nothing here: the marks of one query are ordered by their ids). Marks and
the tasks' reads are at QUORUM, so a read meets at least one replica that has the last mark, whichever coordinator
and data center either went through. Nothing deletes a marker, so no tombstone and no gc_grace_seconds bears on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.connector import ReplayGuard
from sluice.connectors.cassandra._client import CassandraError, Connection, classify, quote_ident

GUARD_COLUMNS = "query text, target text, micro_batch bigint, PRIMARY KEY ((query, target))"


@dataclass(frozen=True)
class KeyspaceReplayGuard(ReplayGuard):
    """write.replay-guard: the row (query id, target table) of `table`, in the target's keyspace, holds the last
    micro-batch committed into the target, written at the micro-batch id as its timestamp."""

    conn: Connection
    table: str

    @property
    def _name(self) -> str:
        return f"{quote_ident(self.conn.keyspace)}.{quote_ident(self.table)}"

    def _execute(self, cql: str, values: tuple[Any, ...]) -> Any:
        from cassandra import ConsistencyLevel
        from cassandra.query import SimpleStatement

        statement = SimpleStatement(cql, consistency_level=ConsistencyLevel.QUORUM, is_idempotent=True)
        return self.conn.session().execute(statement, values)

    def _exists(self) -> bool:
        found = self.conn.session().execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s AND table_name = %s",
            (self.conn.keyspace, self.table))
        return found.one() is not None

    def _refused(self, error: Exception) -> BaseException:
        from cassandra import RequestValidationException

        if isinstance(error, RequestValidationException):  # a table of other columns, or a missing permission
            return CassandraError(f"the replay guard's table {self._name} (write.replay-guard-table) refused its "
                                  f"marker ({type(error).__name__}: {error}). It must have the columns "
                                  f"({GUARD_COLUMNS}), and the user CREATE on the keyspace (or an administrator "
                                  "creates the table) and SELECT and MODIFY on it; or set write.replay-guard=false.",
                                  store="cassandra", target=self.conn.display)
        return classify(error, self.conn)

    def last_committed(self, write_id: str) -> int | None:
        try:
            row = self._execute(f"SELECT micro_batch FROM {self._name} WHERE query = %s AND target = %s",
                                (write_id, self.conn.table)).one()
        except Exception as e:
            if not self._exists():
                return None  # no micro-batch of any query in this keyspace has been committed yet
            raise self._refused(e) from None
        return None if row is None else int(row[0])

    def mark_committed(self, write_id: str, epoch: int) -> None:
        mark = f"UPDATE {self._name} USING TIMESTAMP %s SET micro_batch = %s WHERE query = %s AND target = %s"
        values = (epoch, epoch, write_id, self.conn.table)
        try:
            self._execute(mark, values)
        except Exception as e:
            if self._exists():
                raise self._refused(e) from None
            try:
                self.conn.session().execute(f"CREATE TABLE IF NOT EXISTS {self._name} ({GUARD_COLUMNS})")
                self._execute(mark, values)
            except Exception as e:
                raise self._refused(e) from None
