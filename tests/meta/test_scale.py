"""What a MetaService call does must not grow with the tables and jobs it holds: the statements of a table-store
commit and of a consistent read, traced on SQLite and checked with EXPLAIN QUERY PLAN (no full scan of a table
that grows with jobs or barriers), and the schema set up once per process, not at every MetaService made."""

import sqlite3

import pytest

from sluice.meta import MetaService, _backend


@pytest.fixture
def traced(monkeypatch):
    """Every statement the MetaService runs on SQLite (with its values), in order."""
    statements: list[str] = []
    connect = _backend.Backend.connect

    def tracing(self):
        conn = connect(self)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(_backend.Backend, "connect", tracing)
    return statements


def full_scans(path: str, statements: list[str]) -> list[str]:
    """The statements whose plan reads a whole table or subquery (SQLite's plan says SCAN <name>)."""
    conn = sqlite3.connect(path)
    found = []
    for sql in statements:
        if not sql.lstrip().upper().startswith(("SELECT", "DELETE", "UPDATE")):
            continue
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
        found += [f"{detail}: {sql}" for detail in plan if detail.startswith("SCAN")]
    conn.close()
    return found


def many_jobs(path: str, jobs: int = 20) -> MetaService:
    meta = MetaService(path)
    for j in range(jobs):
        sinks = [f"j{j}t{k}" for k in range(4)]
        meta.register_job(f"job-{j}", [f"j{j - 1}t0"] if j else [], sinks, query_id=f"q{j}")
        for k, table in enumerate(sinks):
            meta.complete_barrier(table, 1000 + j, k + 1)
    return meta


def test_a_commit_finds_its_tables_writer_by_index_not_by_scanning_every_jobs_tables(tmp_path, traced):
    path = str(tmp_path / "meta.db")
    meta = many_jobs(path)
    traced.clear()
    meta.claim_writer("j7t2", name="job-7", query_id="q7")
    barrier = meta.batch_barrier("q7", 1, ["j7t2"])
    meta.complete_barrier("j7t2", barrier, 5)
    assert traced and full_scans(path, traced) == []
    # Negative control: without the index, the same statements read every job's table edges.
    sqlite3.connect(path).execute("DROP INDEX sluice_job_tables_by_table")
    assert any("SCAN t" in s for s in full_scans(path, traced))


def test_a_consistent_read_looks_at_its_tables_and_their_upstream_only(tmp_path, traced):
    path = str(tmp_path / "meta.db")
    meta = many_jobs(path)
    for table in ("j0t0", "j1t0", "j1t1"):
        meta.complete_barrier(table, 5000, 9)
    traced.clear()
    found = meta.consistent_version(["j1t0", "j1t1"])  # j1 reads j0t0: its upstream
    assert (found.barrier, found.versions) == (5000, {"j1t0": 9, "j1t1": 9})
    read = list(traced)
    # The lineage is read whole (upstream walks it in Python): one row per (source, sink) pair ever, not per barrier.
    assert [s for s in full_scans(path, read) if "sluice_lineage" not in s] == []
    touched = {t for s in read for t in ("j5t0", "j19t3") if f"'{t}'" in s}
    assert touched == set(), "a consistent read asked about tables it does not depend on"
    # Negative control: the pass over every table's last barrier it made before (tables()) is a full scan.
    traced.clear()
    meta.tables()
    assert any("SCAN" in s for s in full_scans(path, traced))


def test_an_upstream_table_behind_the_barrier_still_refuses_the_consistent_read(tmp_path):
    from sluice.meta import NoConsistentVersionError

    meta = many_jobs(str(tmp_path / "meta.db"), jobs=2)
    meta.complete_barrier("j1t0", 5000, 9)
    meta.complete_barrier("j1t1", 5000, 9)  # j0t0, upstream of j1, is at barrier 1000 only
    with pytest.raises(NoConsistentVersionError, match=r"upstream table\(s\) \['j0t0'\] have not reached barrier 5000"):
        meta.consistent_version(["j1t0", "j1t1"])


def test_the_schema_is_set_up_once_per_process_not_at_every_meta_service_made(tmp_path, traced):
    path = str(tmp_path / "meta.db")
    MetaService(path)
    traced.clear()
    MetaService(path).last_barrier("x")  # as the table store makes one per step of a commit
    assert [s for s in traced if "CREATE" in s or "IMMEDIATE" in s] == []
    # Negative control: a process that has not set it up yet writes the schema (under the write lock).
    _backend._READY.clear()
    MetaService(path)
    assert any("CREATE TABLE IF NOT EXISTS" in s for s in traced)
