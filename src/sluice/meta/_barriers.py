"""Barriers (FLIP-276): each table's completed barriers with their Delta versions, the barrier of every micro-batch,
and the consistent version of a set of tables.

A barrier is a logical timestamp in ms. A table completes a barrier when the commit holding it is done; the table's
Delta version for that barrier is recorded with it. The consistent version of a set of tables is the largest
barrier every one of them has completed, with each table's version for it; tables the set depends on (upstream
through jobs) must have completed it too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sluice.meta._backend import Cursor
from sluice.meta._lineage import Lineage
from sluice.meta._model import ConsistentVersion, MetaError, NoConsistentVersionError

# Micro-batches of a query whose barrier bookkeeping is kept for replays (older rows are deleted as new ones come):
# Spark keeps the metadata of spark.sql.streaming.minBatchesToRetain (default 100) batches and can replay no
# batch older than that; twice that leaves room for a raised setting.
REPLAYABLE_BATCHES = 200


class BarrierLedger(Lineage):
    def complete_barrier(self, table: str, barrier: int, version: int, job_id: str | None = None) -> bool:
        """Record that `table` completed `barrier` in Delta version `version`. False if it already had (replay)."""
        with self._tx(write=True, locks=(f"barriers:{table}",)) as cur:  # checked, then inserted: one at a time
            cur.execute("SELECT version FROM sluice_barriers WHERE table_name = ? AND barrier = ?", (table, barrier))
            row = cur.fetchone()
            if row is not None:
                if row[0] != version:
                    raise MetaError(f"table '{table}' completed barrier {barrier} in version {row[0]} already; "
                                    f"refusing version {version} for it (a barrier is committed once)")
                return False
            cur.execute("SELECT max(barrier) FROM sluice_barriers WHERE table_name = ?", (table,))
            last = cur.fetchone()[0]
            if last is not None and barrier < last:
                raise MetaError(f"table '{table}' already completed barrier {last}; barrier {barrier} is older "
                                "(barriers only grow)")
            cur.execute("INSERT INTO sluice_barriers (table_name, barrier, version, job_id, committed_at) "
                        "VALUES (?, ?, ?, ?, ?)", (table, barrier, version, job_id, time.time()))
        return True

    def batch_barrier(self, query_id: str, batch_id: int, tables: Sequence[str]) -> int:
        """The barrier of an ingest micro-batch: assigned when first asked (now in ms, above every barrier the
        tables and the query have), the same one on every replay of that batch."""
        with self._tx(write=True, locks=(f"query:{query_id}",)) as cur:
            known = _batch_barrier(cur, query_id, batch_id)
            if known is not None:
                return known
            floor = int(time.time() * 1000)
            cur.execute("SELECT max(barrier) FROM sluice_batch_barriers WHERE query_id = ?", (query_id,))
            floor = max(floor, (cur.fetchone()[0] or 0) + 1)
            for table in tables:
                cur.execute("SELECT max(barrier) FROM sluice_barriers WHERE table_name = ?", (table,))
                floor = max(floor, (cur.fetchone()[0] or 0) + 1)
            _insert_batch_barrier(cur, query_id, batch_id, floor)
            return floor

    def last_batch_barriers(self) -> dict[str, tuple[int, int]]:
        """Each query's newest micro-batch and the barrier it was given: (batch id, barrier)."""
        with self._tx() as cur:
            cur.execute("SELECT b.query_id, b.batch_id, b.barrier FROM sluice_batch_barriers b WHERE b.batch_id = "
                        "(SELECT max(batch_id) FROM sluice_batch_barriers l WHERE l.query_id = b.query_id)")
            return {query_id: (batch_id, barrier) for query_id, batch_id, barrier in cur.fetchall()}

    def record_batch_barrier(self, query_id: str, batch_id: int, barrier: int) -> None:
        """A job reading table-store tables: micro-batch `batch_id` processes input up to `barrier` (its read
        tasks record it; its sink then commits with that barrier). The same batch always maps to one barrier."""
        with self._tx(write=True, locks=(f"query:{query_id}",)) as cur:
            known = _batch_barrier(cur, query_id, batch_id)
            if known is None:
                _insert_batch_barrier(cur, query_id, batch_id, barrier)
            elif known != barrier:
                raise MetaError(f"micro-batch {batch_id} of query {query_id} has barrier {known}; refusing {barrier}")

    def aligned_barrier(self, tables: Sequence[str], start_barrier: int) -> int:
        """The barrier the next micro-batch of a job reading all of `tables` advances to from `start_barrier`.

        Every table-store source of the job asks with the same start (their previous batch ended aligned); the
        first to ask fixes the answer - the newest barrier all the tables completed - and the others get the
        same one, so the sources of one micro-batch never pair different barriers. `start_barrier` when there is
        nothing newer in common yet.
        """
        group = ",".join(sorted(set(tables)))
        with self._tx(write=True, locks=(f"aligned:{group}",)) as cur:  # the first to ask fixes the answer
            cur.execute("SELECT barrier FROM sluice_aligned_barriers WHERE tables = ? AND start_barrier = ?",
                        (group, start_barrier))
            row = cur.fetchone()
            if row is not None:
                return int(row[0])
            names = group.split(",")
            marks = ", ".join("?" * len(names))
            cur.execute(f"SELECT barrier FROM sluice_barriers WHERE table_name IN ({marks}) AND barrier > ? "
                        "GROUP BY barrier HAVING count(DISTINCT table_name) = ? ORDER BY barrier DESC LIMIT 1",
                        (*names, start_barrier, len(names)))
            found = cur.fetchone()
            if found is None:
                return start_barrier
            cur.execute("INSERT INTO sluice_aligned_barriers (tables, start_barrier, barrier) VALUES (?, ?, ?)",
                        (group, start_barrier, int(found[0])))
            cur.execute("DELETE FROM sluice_aligned_barriers WHERE tables = ? AND start_barrier < (SELECT "
                        "min(start_barrier) FROM (SELECT start_barrier FROM sluice_aligned_barriers WHERE tables = ? "
                        f"ORDER BY start_barrier DESC LIMIT {REPLAYABLE_BATCHES}) AS kept)", (group, group))
            return int(found[0])

    def prune_barriers(self, table: str, below_version: int) -> int:
        """Forget `table`'s barriers completed in a version older than `below_version` (the oldest version a
        consistent read may still open, see tablestore.vacuum), never its newest. Returns the rows deleted."""
        with self._tx(write=True) as cur:
            cur.execute("DELETE FROM sluice_barriers WHERE table_name = ? AND version < ? AND barrier < "
                        "(SELECT max(barrier) FROM sluice_barriers WHERE table_name = ?)",
                        (table, below_version, table))
            return max(0, cur.rowcount)

    def barriers(self, table: str) -> list[tuple[int, int]]:
        """(barrier, version) pairs of a table, oldest first."""
        with self._tx() as cur:
            cur.execute("SELECT barrier, version FROM sluice_barriers WHERE table_name = ? ORDER BY barrier",
                        (table,))
            return [(int(b), int(v)) for b, v in cur.fetchall()]

    def tables(self) -> dict[str, tuple[int, int] | None]:
        """Every known table -> its last (barrier, version), or None before its first barrier."""
        with self._tx() as cur:
            cur.execute("SELECT table_name FROM sluice_job_tables UNION SELECT table_name FROM sluice_barriers")
            names = sorted(r[0] for r in cur.fetchall())
            cur.execute("SELECT b.table_name, b.barrier, b.version FROM sluice_barriers b JOIN (SELECT table_name, "
                        "max(barrier) AS barrier FROM sluice_barriers GROUP BY table_name) m "
                        "ON m.table_name = b.table_name AND m.barrier = b.barrier")
            last = {t: (int(b), int(v)) for t, b, v in cur.fetchall()}
        return {name: last.get(name) for name in names}

    def _last_barriers(self, tables: Sequence[str]) -> dict[str, tuple[int, int] | None]:
        """The newest (barrier, version) of each of `tables` that `tables()` knows (None before its first barrier):
        indexed lookups of these tables only, not a pass over every table's barriers as `tables()` makes."""
        if not tables:
            return {}
        with self._tx() as cur:
            out: dict[str, tuple[int, int] | None] = {}
            for table in tables:
                cur.execute("SELECT barrier, version FROM sluice_barriers WHERE table_name = ? ORDER BY barrier DESC "
                            "LIMIT 1", (table,))
                row = cur.fetchone()
                if row is not None:
                    out[table] = (int(row[0]), int(row[1]))
                    continue
                # A table without barriers counts (as None) when a running job has it, as in `tables()`.
                cur.execute("SELECT 1 FROM sluice_job_tables WHERE table_name = ? LIMIT 1", (table,))
                if cur.fetchone() is not None:
                    out[table] = None
        return out

    def last_barrier(self, table: str) -> tuple[int, int] | None:
        """The table's newest (barrier, version), or None before its first barrier."""
        with self._tx() as cur:
            cur.execute("SELECT barrier, version FROM sluice_barriers WHERE table_name = ? ORDER BY barrier DESC "
                        "LIMIT 1", (table,))
            row = cur.fetchone()
        return (int(row[0]), int(row[1])) if row else None

    def barrier_version(self, table: str, barrier: int) -> int | None:
        """The Delta version in which `table` completed `barrier`, or None if it has not."""
        with self._tx() as cur:
            cur.execute("SELECT version FROM sluice_barriers WHERE table_name = ? AND barrier = ?", (table, barrier))
            row = cur.fetchone()
        return int(row[0]) if row else None

    def consistent_version(self, tables: Sequence[str]) -> ConsistentVersion:
        """The largest barrier every table in `tables` completed (and every table they depend on reached)."""
        tables = list(dict.fromkeys(tables))
        if not tables:
            raise MetaError("consistent_version needs at least one table")
        marks = ", ".join("?" * len(tables))
        with self._tx() as cur:
            cur.execute(f"SELECT barrier FROM sluice_barriers WHERE table_name IN ({marks}) GROUP BY barrier "
                        "HAVING count(DISTINCT table_name) = ? ORDER BY barrier DESC LIMIT 1", (*tables, len(tables)))
            row = cur.fetchone()
            if row is None:
                cur.execute(f"SELECT table_name, max(barrier) FROM sluice_barriers WHERE table_name IN ({marks}) "
                            "GROUP BY table_name", tuple(tables))
                have = dict(cur.fetchall())
                unknown = [t for t in tables if t not in have]
                if unknown:  # a typo or a table no job has written yet: say so, not "no barrier in common"
                    raise NoConsistentVersionError(
                        f"table(s) {unknown} have no completed barrier at all in the MetaService {self._db.display}: "
                        "check the names (consistent-with / read_consistent), or wait for their first commit")
                raise NoConsistentVersionError(
                    f"tables {tables} have no completed barrier in common yet (last barriers: "
                    f"{ {t: have.get(t) for t in tables} }); wait for their jobs to complete one")
            barrier = int(row[0])
            cur.execute("SELECT table_name, version FROM sluice_barriers WHERE barrier = ? "
                        f"AND table_name IN ({marks})", (barrier, *tables))
            versions = {t: int(v) for t, v in cur.fetchall()}
        upstream = self.upstream(tables)  # once, not once per table
        behind = {t: last for t, last in self._last_barriers(sorted(upstream - versions.keys())).items()
                  if last is None or last[0] < barrier}
        if behind:
            raise NoConsistentVersionError(f"upstream table(s) {sorted(behind)} have not reached barrier {barrier} "
                                           "that their downstream tables completed; the lineage is inconsistent")
        return ConsistentVersion(barrier, versions)


def _batch_barrier(cur: Cursor, query_id: str, batch_id: int) -> int | None:
    cur.execute("SELECT barrier FROM sluice_batch_barriers WHERE query_id = ? AND batch_id = ?", (query_id, batch_id))
    row = cur.fetchone()
    return int(row[0]) if row is not None else None


def _insert_batch_barrier(cur: Cursor, query_id: str, batch_id: int, barrier: int) -> None:
    cur.execute("INSERT INTO sluice_batch_barriers (query_id, batch_id, barrier) VALUES (?, ?, ?)",
                (query_id, batch_id, barrier))
    cur.execute("DELETE FROM sluice_batch_barriers WHERE query_id = ? AND batch_id <= ?",
                (query_id, batch_id - REPLAYABLE_BATCHES))

