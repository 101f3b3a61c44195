"""The process's connection pool (sluice/connectors/postgres/_pool.py) against a real server: what is lent again,
what is closed instead, and a streaming query's micro-batches that connect once, not every trigger."""

import multiprocessing
import uuid

import psycopg
import pytest

from sluice.connectors.postgres._client import Connection
from sluice.connectors.postgres._options import READ_SPEC
from sluice.connectors.postgres._pool import POOL, ConnectionPool
from sluice.connectors.postgres.changes._slot import DECODING_SESSION
from sluice.testing import LocalPostgres


@pytest.fixture
def conn_info(pg):
    POOL.close_idle()
    yield Connection.from_options(READ_SPEC.parse({"url": pg.url, "table": "unused"}))
    POOL.close_idle()


def backend(conn) -> int:
    if isinstance(conn, psycopg.Connection):
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with conn.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]


@pytest.mark.parametrize("driver", ["psycopg", "adbc"])
def test_a_connection_given_back_cleanly_is_lent_again_and_a_fresh_lease_without_pooling_is_not(conn_info, driver):
    key = conn_info.pool_key(driver)
    lease = conn_info.lease(key)
    first = backend(lease.conn)
    lease.release(clean=True)
    again = conn_info.lease(key)
    assert backend(again.conn) == first
    again.release(clean=True)
    unpooled = conn_info.lease(key, pooled=False)  # the negative control: a batch write's connection
    assert backend(unpooled.conn) != first
    unpooled.release(clean=True)
    assert POOL.idle_count() == 1, "an unpooled lease is closed at release, never kept"


def test_a_failed_user_closes_its_connection(conn_info):
    with pytest.raises(RuntimeError), conn_info.pooled() as conn:
        pid = backend(conn)
        raise RuntimeError("the task failed")
    assert conn.closed
    assert POOL.idle_count() == 0
    with conn_info.pooled() as conn:
        assert backend(conn) != pid
    assert POOL.idle_count() == 1


def test_a_connection_the_server_ended_while_idle_is_replaced_not_lent(conn_info, pg):
    """A server restart (or an administrator's pg_terminate_backend) between two micro-batches must not fail the
    next task: the idle connection fails its round trip and a new one is lent."""
    with conn_info.pooled("adbc") as conn:
        pid = backend(conn)
    # With a timeout, pg_terminate_backend returns once the backend has exited.
    assert pg.sql("SELECT pg_terminate_backend(%s, 10000)", (pid,)) == [(True,)]
    with conn_info.pooled("adbc") as conn:
        assert backend(conn) != pid


def test_an_open_transaction_is_never_kept_idle(conn_info):
    lease = conn_info.lease(conn_info.pool_key(autocommit=False))
    backend(lease.conn)  # the SELECT opened a transaction
    lease.release(clean=True)
    assert POOL.idle_count() == 0
    assert lease.conn.closed


def test_connections_with_their_own_session_settings_are_kept_apart(conn_info):
    decoding = conn_info.pool_key("adbc", session=DECODING_SESSION)
    with conn_info.pooled("adbc", session=DECODING_SESSION) as conn:
        pid = backend(conn)
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('TimeZone')")
            assert cur.fetchone()[0] == "UTC"
    with conn_info.pooled("adbc") as conn:
        assert backend(conn) != pid, "a plain user never gets the decoding session"
    lease = conn_info.lease(decoding)
    assert backend(lease.conn) == pid
    lease.release(clean=True)


def test_idle_connections_are_closed_after_the_idle_time(conn_info):
    pool = ConnectionPool(idle_close_s=0.3)
    key = conn_info.pool_key()
    conn = pool.take(key, lambda: conn_info.open(key))
    backend(conn)
    pool.give_back(key, conn)
    assert pool.idle_count() == 1
    reaper = pool._reaper
    assert reaper is not None
    reaper.join(30)  # it ends once it has closed every idle connection: nothing took this one within 0.3 s
    assert not reaper.is_alive()
    assert conn.closed
    assert pool.idle_count() == 0


def test_more_idle_connections_than_the_bound_are_closed(conn_info):
    pool = ConnectionPool(idle_per_key=2)
    key = conn_info.pool_key()
    conns = [pool.take(key, lambda: conn_info.open(key)) for _ in range(3)]
    for conn in conns:
        pool.give_back(key, conn)
    assert pool.idle_count() == 2
    assert conns[2].closed
    pool.close_idle()


def _idle_in_child(queue) -> None:
    queue.put(POOL.idle_count())


def test_a_forked_child_does_not_use_its_parents_connections(conn_info):
    with conn_info.pooled() as conn:
        backend(conn)
    assert POOL.idle_count() == 1
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_idle_in_child, args=(queue,))
    child.start()
    assert queue.get(timeout=30) == 0
    child.join(30)
    assert POOL.idle_count() == 1, "the parent's connection is still its own"


def sluice_connections_logged(server) -> int:
    """Connections the server logged as authorized for sluice (its application_name); the test's own have none."""
    return sum(1 for line in server.log_path.read_text(errors="replace").splitlines()
               if "connection authorized" in line and "application_name=sluice" in line)


@pytest.fixture(scope="module")
def logged_pg():
    """A server that logs every connection it authorizes (log_connections), for counting them."""
    with LocalPostgres(settings={"wal_level": "logical", "synchronous_commit": "on", "log_connections": "on"}) as s:
        yield s


@pytest.mark.spark
def test_a_change_stream_into_postgres_connects_once_not_every_micro_batch(spark, logged_pg, tmp_path):
    """Connections sluice opened while 8 micro-batches ran, as the server logged them (log_connections): without
    the pool each micro-batch opens 5 (the write's plan and its commit's, the fetch, its position check, the
    write); with it, the processes serving the query connected during the warm-up and use those."""
    lpg = logged_pg
    with psycopg.connect(lpg.url, autocommit=True) as c:
        c.execute("CREATE TABLE pool_src (id bigint PRIMARY KEY, v text)")
        c.execute("CREATE TABLE pool_dst (id bigint, v text)")
        c.execute("CREATE PUBLICATION pool_pub FOR TABLE pool_src")
    query = (spark.readStream.format("postgres_changes")
             .options(url=lpg.url, table="pool_src", publication="pool_pub", slot=f"pool_{uuid.uuid4().hex[:8]}")
             .load().selectExpr("id", "v").writeStream.format("postgres").options(url=lpg.url, table="pool_dst")
             .option("checkpointLocation", str(tmp_path / "cp")).start())

    def micro_batch(i: int) -> None:
        c.execute("INSERT INTO pool_src VALUES (%s, 'x')", (i,))
        while sum(1 for p in query.recentProgress if p.numInputRows) < i + 1:
            query.awaitTermination(0.1)

    try:
        with psycopg.connect(lpg.url, autocommit=True) as c:
            for i in range(3):  # warm-up: every process serving the query connects once
                micro_batch(i)
            before = sluice_connections_logged(lpg)
            for i in range(3, 11):
                micro_batch(i)
            opened = sluice_connections_logged(lpg) - before
    finally:
        query.stop()
    assert query.exception() is None
    assert psycopg.connect(lpg.url).execute("SELECT count(*) FROM pool_dst").fetchone()[0] == 11
    assert opened < 8, f"{opened} connections opened in 8 micro-batches"
