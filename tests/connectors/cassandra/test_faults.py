"""format("cassandra") when the node dies: killed (SIGKILL) mid-write and started again on its data, the write
retries through the outage and the table ends up equal to the input; without retries the same outage fails the
write loudly (the negative control), and a re-run converges to the same table."""

import threading
import time

import pytest

import sluice
from sluice.testing import LocalCassandra
from tests.faults import slow

pytestmark = pytest.mark.spark

ROWS = 3000


@pytest.fixture(scope="module")
def node():
    with LocalCassandra(commitlog_sync="batch") as server, server.cluster() as cluster:
        session = cluster.connect()
        session.execute("CREATE KEYSPACE faults WITH replication = {'class': 'SimpleStrategy', "
                        "'replication_factor': 1}")
        yield server, session


def kill_when_stored(node, session, table: str, rows: int, restart: bool) -> threading.Thread:
    """In the background: once `rows` rows are in `table`, SIGKILL the node, then (if `restart`) start it again."""
    server, _ = node

    def strike() -> None:
        deadline = time.monotonic() + 120
        while session.execute(f"SELECT COUNT(*) FROM faults.{table}").one()[0] < rows:
            assert time.monotonic() < deadline, f"the write never stored {rows} rows"
            time.sleep(0.05)  # polling the store for the event: the rows are there
        server.kill()
        if restart:
            server.start()

    thread = threading.Thread(target=strike, daemon=True)
    thread.start()
    return thread


def test_a_node_killed_and_restarted_mid_write_loses_nothing(spark, node):
    server, session = node
    table = "killed"
    session.execute(f"CREATE TABLE faults.{table} (id bigint PRIMARY KEY, pad text)")
    df = (spark.range(0, ROWS, 1, 2).selectExpr("id", "repeat('x', 200) AS pad")
          .mapInArrow(slow(50, 0.02), "id long, pad string"))
    opts = {"host": server.host, "port": str(server.port), "keyspace": "faults", "table": table,
            "sink.max-retries": "30", "sink.retry-delay-ms": "200", "request.timeout-ms": "2000"}
    striker = kill_when_stored(node, session, table, 500, restart=True)
    sluice.write(df, "cassandra", opts)
    striker.join(180)
    summary = sluice.last_write_summary("cassandra")
    assert summary["retries"] > 0, summary  # the outage was seen and ridden out
    assert stored_ids(server, table) == set(range(ROWS))


def stored_ids(server, table: str) -> set[int]:
    with server.cluster() as cluster:  # a new connection: the test's own may still be reconnecting
        return {r.id for r in cluster.connect().execute(f"SELECT id FROM faults.{table}")}


def test_without_retries_the_same_outage_fails_the_write_and_a_rerun_converges(spark, node):
    server, session = node
    table = "failed"
    session.execute(f"CREATE TABLE faults.{table} (id bigint PRIMARY KEY, pad text)")
    df = (spark.range(0, ROWS, 1, 2).selectExpr("id", "repeat('x', 200) AS pad")
          .mapInArrow(slow(50, 0.02), "id long, pad string"))
    opts = {"host": server.host, "port": str(server.port), "keyspace": "faults", "table": table,
            "sink.max-retries": "0", "request.timeout-ms": "2000"}
    striker = kill_when_stored(node, session, table, 500, restart=False)
    with pytest.raises(Exception, match=r"cassandra"):
        sluice.write(df, "cassandra", opts)
    striker.join(60)
    server.start()
    sluice.write(df, "cassandra", opts)  # the re-run: the same rows again, upserted by key
    assert stored_ids(server, table) == set(range(ROWS))
