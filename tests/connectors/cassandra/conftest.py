import contextlib
import os
import uuid

import pytest

from sluice.testing import LocalCassandra


class Cass:
    """The server under test, CQL helpers and unique table names (keyspace `sluice`, replication factor 1)."""

    keyspace = "sluice"

    def __init__(self, server: LocalCassandra) -> None:
        self.server = server
        self.cluster = server.cluster()
        self.session = self.cluster.connect()
        self.session.execute("CREATE KEYSPACE IF NOT EXISTS sluice WITH replication = "
                             "{'class': 'SimpleStrategy', 'replication_factor': 1}")

    def cql(self, query: str, params=None) -> list:
        return list(self.session.execute(query, params))

    def table(self, columns: str) -> str:
        name = f"t_{uuid.uuid4().hex[:10]}"
        self.cql(f"CREATE TABLE sluice.{name} ({columns})")
        return name

    def opts(self, table: str, **more: str) -> dict[str, str]:
        return {"host": self.server.host, "port": str(self.server.port), "keyspace": self.keyspace, "table": table,
                **more}


class RunningServer:
    """A server started elsewhere (SLUICE_TEST_CASSANDRA=host:port), for quick runs of this folder by hand."""

    def __init__(self, address: str) -> None:
        self.host, _, port = address.rpartition(":")
        self.port = int(port)

    def cluster(self):
        from cassandra.cluster import Cluster

        return Cluster([self.host], port=self.port, protocol_version=5)

    def nodetool(self, *args: str) -> str:
        raise RuntimeError(f"nodetool {' '.join(args)}: this test flushes and compacts through LocalCassandra's "
                           "local JMX; run it without SLUICE_TEST_CASSANDRA")


@pytest.fixture(scope="package")
def cass():
    """One Cassandra for this package's modules that need no node of their own, each test on tables of its own (its
    JVM stops with the package, not idling through the rest of the suite; a test that kills it starts it again on
    its data), with local JMX for nodetool, or the running one SLUICE_TEST_CASSANDRA names."""
    address = os.environ.get("SLUICE_TEST_CASSANDRA")
    with contextlib.nullcontext(RunningServer(address)) if address else LocalCassandra(jmx=True) as server:
        c = Cass(server)
        yield c
        c.cluster.shutdown()


@pytest.fixture(scope="module", autouse=True)
def no_session_outlives_its_module():
    """The driver side of a write (its plan, the replay guard's marks) keeps sessions in this process, as executors
    do; each module's servers stop at its end, so its sessions go with them instead of reconnecting to ports that
    are gone (their warnings reach every later test's log capture)."""
    yield
    from sluice.connectors.cassandra._client import close_sessions

    close_sessions()
