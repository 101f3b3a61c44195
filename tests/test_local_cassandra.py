"""The test Cassandra server (sluice.testing.LocalCassandra): CQL, password sign-in, the batch size limit, and rows
acknowledged before a SIGKILL read back after a restart on the same folder. One server for the module (a start
takes 10-30 s)."""

import os

import pytest

from sluice.testing import LocalCassandra

KEYSPACE = "sluice_local"


@pytest.fixture(scope="module")
def server():
    # batch: a write is acknowledged once it is in the commit log, so a SIGKILL right after cannot lose it.
    with LocalCassandra(auth=True, commitlog_sync="batch", batch_size_warn_threshold_kib=1,
                        batch_size_fail_threshold_kib=2) as node:
        with node.cluster() as cluster:
            cluster.connect().execute(f"CREATE KEYSPACE {KEYSPACE} WITH replication = "
                                      "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        yield node


def test_cql(server):
    assert server.port and server.contact_points == [(server.host, server.port)]
    with server.cluster() as cluster:
        session = cluster.connect()
        assert session.execute("SELECT release_version FROM system.local").one().release_version.startswith("5.0.")
        session.execute(f"CREATE TABLE {KEYSPACE}.kv (k int PRIMARY KEY, v text)")
        insert = session.prepare(f"INSERT INTO {KEYSPACE}.kv (k, v) VALUES (?, ?)")
        for k in range(10):
            session.execute(insert, (k, f"v{k}"))
        rows = session.execute(f"SELECT k, v FROM {KEYSPACE}.kv")
        assert sorted((r.k, r.v) for r in rows) == [(k, f"v{k}") for k in range(10)]


def test_password_sign_in(server):
    from cassandra import AuthenticationFailed
    from cassandra.cluster import NoHostAvailable

    assert server.username == "sluice"
    with server.cluster(password="wrong") as cluster, pytest.raises(NoHostAvailable) as refused:
        cluster.connect()
    assert refused.value.errors and all(isinstance(e, AuthenticationFailed) for e in refused.value.errors.values())
    with server.cluster() as cluster:
        assert cluster.connect().execute("SELECT role FROM system_auth.roles WHERE role = 'sluice'").one()


def test_batch_size_fail_threshold(server):
    from cassandra import InvalidRequest
    from cassandra.query import BatchStatement

    with server.cluster() as cluster:
        session = cluster.connect()
        session.execute(f"CREATE TABLE {KEYSPACE}.wide (k int PRIMARY KEY, v text)")
        insert = session.prepare(f"INSERT INTO {KEYSPACE}.wide (k, v) VALUES (?, ?)")
        small, large = BatchStatement(), BatchStatement()
        small.add(insert, (1, "x"))
        small.add(insert, (2, "x"))
        for k in range(8):  # ~4 KiB over 8 partitions: above the 2 KiB limit
            large.add(insert, (k, "x" * 500))
        session.execute(small)
        with pytest.raises(InvalidRequest, match="Batch too large"):
            session.execute(large)


def test_kill_and_restart_keeps_acknowledged_rows(server):
    with server.cluster() as cluster:
        session = cluster.connect()
        session.execute(f"CREATE TABLE {KEYSPACE}.durable (k int PRIMARY KEY, v text)")
        insert = session.prepare(f"INSERT INTO {KEYSPACE}.durable (k, v) VALUES (?, ?)")
        for k in range(200):
            session.execute(insert, (k, f"v{k}"))
    pid, port = server.pid, server.port
    server.kill()
    assert server.pid is None
    with pytest.raises(ProcessLookupError):  # gone at once: no shutdown ran
        os.kill(pid, 0)
    server.start()  # same folder, same ports: the commit log is replayed
    assert server.port == port and server.pid != pid
    with server.cluster() as cluster:
        rows = cluster.connect().execute(f"SELECT k, v FROM {KEYSPACE}.durable")
        assert sorted((r.k, r.v) for r in rows) == [(k, f"v{k}") for k in range(200)]


def test_missing_server_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_CASSANDRA_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="make check-cassandra"):
        LocalCassandra().start()
