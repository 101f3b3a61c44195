"""format("cassandra") against an overloaded node: Cassandra's native-transport rate limiter
(native_transport_rate_limiting_enabled, a few hundred requests per second) with native_transport_throw_on_overload,
so requests over the limit are refused with OverloadedException ("Coordinator node overloaded") instead of being
held back on the socket. The write counts them as throttles, the AIMD window shrinks, the refused requests are
retried and every row is stored; without retries (the negative control) the same write fails, naming the overload
and sink.max-retries. (A node without throw_on_overload holds requests back until they time out on the client:
test_faults.py's stalled node covers that path.)"""

import pytest

import sluice
from sluice.testing import LocalCassandra
from tests.faults import poll_until

pytestmark = pytest.mark.spark

ROWS = 1500
REQUESTS_PER_SECOND = 300


@pytest.fixture(scope="module")
def server():
    settings = {"native_transport_rate_limiting_enabled": True,
                "native_transport_max_requests_per_second": REQUESTS_PER_SECOND,
                "native_transport_throw_on_overload": True}
    with LocalCassandra(settings=settings) as server, server.cluster() as cluster:
        cluster.connect().execute("CREATE KEYSPACE overload WITH replication = {'class': 'SimpleStrategy', "
                                  "'replication_factor': 1}")
        yield server


def write(spark, server, table: str, **more: str) -> None:
    with server.cluster() as cluster:
        cluster.connect().execute(f"CREATE TABLE overload.{table} (id bigint PRIMARY KEY, pad text)")
    df = spark.range(0, ROWS, 1, 2).selectExpr("id", "repeat('x', 100) AS pad")
    # One statement per row, up to 32 requests of 100 rows in flight per task: far over the node's limit.
    sluice.write(df, "cassandra", {"host": server.host, "port": str(server.port), "keyspace": "overload",
                                   "table": table, "batch.grouping": "none", **more})


def stored(server, table: str) -> set[int]:
    """The table's ids. Right after a write the node may still be over its limit and refuse the reading session's
    own connection: those refusals (only those) are waited out."""
    from cassandra.cluster import NoHostAvailable

    def read() -> tuple[set[int]] | None:
        try:
            with server.cluster() as cluster:
                return ({r.id for r in cluster.connect().execute(f"SELECT id FROM overload.{table}")},)
        except NoHostAvailable as e:
            if "overloaded" not in str(e):
                raise
            return None

    return poll_until(read, 30, f"a read of overload.{table} the node takes", 0.5)[0]


def test_an_overloaded_node_slows_the_write_down_and_every_row_is_stored(spark, server):
    write(spark, server, "retried", **{"sink.max-retries": "50", "sink.retry-delay-ms": "100"})
    summary = sluice.last_write_summary("cassandra")
    assert summary["throttles"] > 0, summary  # the node did refuse requests
    assert summary["records"] == ROWS
    assert stored(server, "retried") == set(range(ROWS))


def test_without_retries_the_overload_fails_the_write_and_says_so(spark, server):
    with pytest.raises(Exception, match=r"(?s)sink\.max-retries=0.*overloaded.*lower sink\.requests\.max-inflight"):
        write(spark, server, "refused", **{"sink.max-retries": "0"})



def test_a_task_connecting_while_the_node_is_overloaded_waits_for_it(server):
    """A task's connection and prepares are a few requests before any row: a node whose rate limiter another
    task just emptied refuses them too (the test above once failed so: the second task's connection was refused
    before the first task's write failed). They are repeated until the node takes them; without that (the negative
    control, the bare connection) they fail. The limiter refills every second, so one attempt may land on fresh
    permits either way: each side is tried until it met the overload (twenty times at most). Once a retried
    connection has been refused, the hammer stops, as another task's write relents when its AIMD window shrinks:
    a connection (a dozen requests) racing a hammer that empties the limiter every second may never be let in."""
    import threading

    from cassandra.cluster import NoHostAvailable

    from sluice.connectors.cassandra._client import Connection, _connect, _overloaded, while_overloaded

    conn = Connection(hosts=(server.host,), port=server.port, keyspace="overload", table="t", username=None,
                      timeout_s=30.0)
    attempts: list[int] = []
    unexpected: list[BaseException] = []
    refusing, stop = threading.Event(), threading.Event()

    def attempt():
        attempts.append(1)
        try:
            return _connect(conn)
        except NoHostAvailable as e:
            if _overloaded(e):
                stop.set()  # the node refused it: the other write relents, the limiter refills
            raise

    # The hammer's own session: the node may still refuse what the test before sent it.
    session = while_overloaded(lambda: _connect(conn), conn, "connect")
    try:
        def hammer() -> None:  # keeps the node's limiter empty until the test has seen both sides
            while not stop.is_set() and not unexpected:
                for f in [session.execute_async("SELECT now() FROM system.local") for _ in range(200)]:
                    try:
                        f.result()
                    except BaseException as e:
                        if not _overloaded(e):  # refusing what is over its limit is the point; nothing else is
                            unexpected.append(e)
                        refusing.set()

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            assert refusing.wait(30), "the node never refused a request over its limit"
            refused = None  # the negative control: a bare connection meets the overload and fails
            for _ in range(20):
                try:
                    _connect(conn).cluster.shutdown()
                except NoHostAvailable as e:
                    refused = e
                    break
            assert refused is not None and "overloaded" in str(refused), \
                f"twenty bare connections to the overloaded node all succeeded or failed otherwise: {refused!r}"
            tries = []  # attempts each retried connection took; one that met the overload took two or more
            for _ in range(20):
                before = len(attempts)
                while_overloaded(attempt, conn, "connect").cluster.shutdown()
                tries.append(len(attempts) - before)
                if tries[-1] >= 2:
                    break
        finally:
            stop.set()  # stops the hammer whatever happened
            thread.join()
    finally:
        session.cluster.shutdown()
    assert not unexpected
    assert max(tries) >= 2, f"no retried connection met the overload in {len(tries)} tries: {tries}"
