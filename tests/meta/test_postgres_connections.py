"""The PostgreSQL MetaService keeps one connection per process across its transactions, survives that connection
dying while idle, and serializes only what must be: a table's commits wait for another commit to that table, never
for one to another table."""

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from sluice.meta import MetaService, WriterConflictError, _backend
from sluice.meta._connections import IDLE_CLOSE_S, KEPT

WAIT_S = 60  # only ever the failure signal of an event that did not come


@pytest.fixture
def meta_url(pg):
    schema = f"meta_{uuid.uuid4().hex[:8]}"
    pg.sql(f"CREATE SCHEMA {schema}")
    url = pg.url + f"?options=-csearch_path%3D{schema}"
    yield url
    KEPT.close(url)


@pytest.fixture
def opened(monkeypatch):
    """The connections the MetaService opens, counted as they are made (the real ones)."""
    count = [0]
    connect = _backend.Backend.connect

    def counting(self):
        count[0] += 1
        return connect(self)

    monkeypatch.setattr(_backend.Backend, "connect", counting)
    return count


def commits(url: str, n: int) -> None:
    """`n` table-store commits as its sink makes them: a new MetaService per step, three transactions each."""
    for version in range(1, n + 1):
        job = MetaService(url).claim_writer("orders", name="ingest", query_id="q1")
        barrier = MetaService(url).batch_barrier("q1", version, ["orders"])
        MetaService(url).complete_barrier("orders", barrier, version, job_id=job)


def test_a_process_keeps_one_connection_across_its_transactions(meta_url, opened, monkeypatch):
    commits(meta_url, 10)  # the schema, then 30 transactions
    assert opened[0] == 1
    assert KEPT.idle(meta_url) == 1
    MetaService(meta_url).close()
    assert KEPT.idle(meta_url) == 0
    MetaService(meta_url).last_barrier("orders")  # after close(): a new one
    assert opened[0] == 2
    # Negative control: a connection per transaction (each closed at its end, as before) fails the count.
    monkeypatch.setattr(KEPT, "give_back", lambda url, conn: conn.close())
    KEPT.close(meta_url)
    opened[0] = 0
    commits(meta_url, 10)
    assert opened[0] == 30


def test_a_kept_connection_the_server_ended_is_replaced_once_and_named(meta_url, pg, opened, caplog):
    meta = MetaService(meta_url)
    meta.last_barrier("orders")
    ((_, kept),) = KEPT._idle[meta_url]
    old_pid = kept.info.backend_pid
    # The server ends the idle session (a restart, idle_session_timeout); wait until its process is gone.
    assert pg.sql("SELECT pg_terminate_backend(%s, 60000)", (old_pid,)) == [(True,)]
    opened[0] = 0
    with caplog.at_level(logging.WARNING, logger="sluice.meta"):
        assert meta.complete_barrier("orders", 1000, 1) is True
    assert opened[0] == 1
    assert "a kept connection failed before its transaction began (consuming input failed: terminating connection " \
        "due to administrator command" in caplog.text
    assert meta.barriers("orders") == [(1000, 1)]
    ((_, now),) = KEPT._idle[meta_url]
    assert kept.closed and now.info.backend_pid != old_pid


@dataclass
class Race:
    b_went_on: bool  # writer B finished while A's transaction was still open
    b_result: object  # B's claim_writer answer, or the exception it raised


def lock_waiters(pg) -> int:
    """MetaService sessions waiting for a lock another holds (the server's own account)."""
    return pg.sql("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                  "WHERE NOT l.granted AND a.application_name = 'sluice-meta'")[0][0]


@contextmanager
def held_after_its_edges(thread: str) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(inside, release): while this lasts, the thread named `thread` stops right after writing its edges (INSERT INTO
    sluice_job_tables), its transaction open, sets `inside` and waits for `release`."""
    inside, release = threading.Event(), threading.Event()
    execute = _backend.Cursor.execute

    def holding(self, sql, params=()):
        execute(self, sql, params)
        if threading.current_thread().name == thread and sql.startswith("INSERT INTO sluice_job_tables"):
            inside.set()
            release.wait()

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_backend.Cursor, "execute", holding)
        yield inside, release


def ran_through(pg, done: threading.Event, what: str) -> bool:
    """Whether `what` finished (`done`) before any MetaService session waited for a lock another holds: False as soon
    as one waits (the server's account, pg_locks), True once `done` is set first."""
    deadline = time.monotonic() + WAIT_S
    while not done.is_set() and lock_waiters(pg) == 0:
        assert time.monotonic() < deadline, f"{what} neither finished nor waited for a lock"
        done.wait(0.01)
    return done.is_set()


def race(url: str, pg, table_a: str, table_b: str) -> Race:
    """Writer A claims `table_a` and holds its transaction open (its writer row written, not committed); writer B
    claims `table_b` meanwhile. B either finishes or waits for a lock A holds; then A commits."""
    b_done = threading.Event()
    results: dict[str, object] = {}

    def claim(who: str, table: str) -> None:
        try:
            results[who] = MetaService(url).claim_writer(table, name=f"job-{who}", query_id=f"query-{who}",
                                                      lease_s=600)
        except WriterConflictError as e:
            results[who] = e
        finally:
            if who == "b":
                b_done.set()

    a = threading.Thread(target=claim, args=("a", table_a), name="writer-a")
    b = threading.Thread(target=claim, args=("b", table_b), name="writer-b")
    with held_after_its_edges("writer-a") as (inside, release):
        a.start()
        try:
            assert inside.wait(WAIT_S), "writer A never reached its commit"
            b.start()
            went_on = ran_through(pg, b_done, "writer B")
        finally:
            release.set()
            a.join(WAIT_S)
    b.join(WAIT_S)
    assert not a.is_alive() and not b.is_alive() and isinstance(results["a"], str)
    return Race(went_on, results["b"])


def old_table_lock(self, locks):
    """The discipline before: every serialized transaction locked the whole jobs table."""
    return "BEGIN; LOCK TABLE sluice_jobs IN EXCLUSIVE MODE" if locks else "BEGIN"


def test_commits_to_different_tables_do_not_wait_for_each_other(meta_url, pg):
    MetaService(meta_url)
    found = race(meta_url, pg, "orders", "customers")
    assert found.b_went_on and isinstance(found.b_result, str)
    # Negative control: the table-wide lock makes B wait for A's commit.
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_backend.Backend, "begin_sql", old_table_lock)
        found = race(meta_url, pg, "payments", "refunds")
    assert not found.b_went_on


def test_commits_to_one_table_are_still_serialized_and_the_second_writer_fenced(meta_url, pg):
    MetaService(meta_url)
    found = race(meta_url, pg, "orders", "orders")
    assert not found.b_went_on
    assert isinstance(found.b_result, WriterConflictError)
    assert "'orders' already has an active writer: job 'job-a-" in str(found.b_result)
    # Negative control: without the lock, B does not see A's uncommitted claim: two writers of one table.
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_backend.Backend, "begin_sql", lambda self, locks: "BEGIN")
        found = race(meta_url, pg, "payments", "payments")
    assert found.b_went_on and isinstance(found.b_result, str)
    writers = [j for j in MetaService(meta_url).jobs() if "payments" in j.sinks and j.status == "running"]
    assert len(writers) == 2


def meta_backends(pg) -> set[int]:
    """The server processes of MetaService connections, by the server's own account."""
    return {pid for (pid,) in pg.sql("SELECT pid FROM pg_stat_activity WHERE application_name = 'sluice-meta'")}


def test_a_connection_idle_past_the_bound_is_closed_and_the_next_call_opens_one(meta_url, pg, opened, monkeypatch):
    now = [0.0]
    KEPT.close()  # only this test's connection is kept: the closer ends once it has closed it
    monkeypatch.setattr(KEPT, "clock", lambda: now[0])
    meta = MetaService(meta_url)
    assert meta.last_barrier("orders") is None
    ((_, kept),) = KEPT._idle[meta_url]
    closer, pid = KEPT._closer, kept.info.backend_pid
    assert closer is not None and pid in meta_backends(pg)
    now[0] += IDLE_CLOSE_S
    KEPT.wake()
    closer.join(WAIT_S)
    assert not closer.is_alive() and kept.closed and KEPT.idle(meta_url) == 0
    deadline = time.monotonic() + WAIT_S
    while pid in meta_backends(pg):  # its server process exits after the client said goodbye
        assert time.monotonic() < deadline, "the closed connection's server process is still there"
    assert meta.last_barrier("orders") is None
    assert opened[0] == 2
    # Negative control: with the bound off, a connection idle for an hour is still kept, and still on the server.
    monkeypatch.setattr(KEPT, "idle_close_s", None)
    closer = KEPT._closer
    KEPT.wake()
    assert closer is not None
    closer.join(WAIT_S)
    now[0] += 3600
    assert meta.last_barrier("orders") is None
    assert KEPT._closer is None and opened[0] == 2
    ((_, kept),) = KEPT._idle[meta_url]
    assert kept.info.backend_pid in meta_backends(pg)


def end_while_registering(url: str, pg, job_id: str, table: str) -> None:
    """Job `job_id` registers again under its id (a restarted driver) and holds its transaction open, its rows
    replaced; meanwhile finish_job ends it and must wait. Then the registration commits, and the end goes on."""
    errors: list[BaseException] = []
    ended = threading.Event()

    def call(what) -> None:
        try:
            what(MetaService(url))
        except BaseException as e:
            errors.append(e)
            raise
        finally:
            if threading.current_thread().name == "finisher":
                ended.set()

    registrar = threading.Thread(target=call, name="registrar",
                                 args=(lambda m: m.register_job("ingest", [], [table], job_id=job_id),))
    finisher = threading.Thread(target=call, name="finisher", args=(lambda m: m.finish_job(job_id),))
    with held_after_its_edges("registrar") as (inside, release):
        registrar.start()
        try:
            assert inside.wait(WAIT_S), "the registration never reached its commit"
            finisher.start()
            assert not ran_through(pg, ended, "finish_job"), "finish_job ran through an open registration of its job"
        finally:
            release.set()
            registrar.join(WAIT_S)
    finisher.join(WAIT_S)
    assert not registrar.is_alive() and not finisher.is_alive() and errors == []


def test_a_job_ended_while_it_registers_again_is_ended_whole(meta_url, pg):
    meta = MetaService(meta_url)
    meta.register_job("ingest", [], ["orders"], job_id="ingest-1")
    end_while_registering(meta_url, pg, "ingest-1", "orders")
    assert meta.job("ingest-1").status == "finished"  # the end came after the registration, as a whole
    meta.register_job("next", [], ["orders"])  # its table is free
    # Negative control: without the job's lock the end skips the job row the registration replaced, then deletes
    # the new registration's edges: ingest-1 runs on, writing no table, and a second writer of it gets in.
    begin_sql = _backend.Backend.begin_sql
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_backend.Backend, "begin_sql",
                  lambda self, locks: begin_sql(self, [n for n in locks if not n.startswith("job:")]))
        meta.register_job("ingest", [], ["payments"], job_id="ingest-2")
        end_while_registering(meta_url, pg, "ingest-2", "payments")
    assert meta.job("ingest-2").status == "running"
    meta.register_job("next", [], ["payments"])
    writers = [j.job_id for j in meta.jobs() if j.status == "running" and "payments" in j.sinks]
    assert writers[0] == "ingest-2" and len(writers) == 2
