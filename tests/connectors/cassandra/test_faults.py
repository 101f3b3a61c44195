"""format("cassandra") when the node fails: killed (SIGKILL) mid-write and started again on its data, the write
retries through the outage and the table ends up equal to the input; without retries the same outage fails the
write loudly (the negative control), and a re-run converges to the same table. A node that stalls (SIGSTOP) times
requests out; they are retried and each key still ends at its last change. A node SIGKILLed under a streaming lookup
fails the query's next micro-batch after lookup.max-retries, never with nulls; started again within them, the
micro-batch is answered.
The node asks for a password (PasswordAuthenticator) over TLS only (client_encryption_options, a self-signed
certificate): a wrong password, a client without TLS and a certificate from another CA are each refused clearly,
and no secret is shown; so is a lookup's IN over the node's guardrail on the partition keys of one SELECT (guardrails
hold for roles that are not superusers, which only a node that asks for a password has)."""

import os
import signal
import threading
import time

import pytest

import sluice
from sluice.testing import LocalCassandra
from sluice.testing._cassandra import self_signed_certificate
from tests.faults import Striker, slow, wait_for_a_client
from tests.lookup_faults import Lookup, Outage, a_store_killed_mid_stream

pytestmark = pytest.mark.spark

ROWS = 3000
IN_KEYS_GUARDRAIL = 150  # the node's partition_keys_in_select_fail_threshold


@pytest.fixture(scope="module")
def server():
    with LocalCassandra(commitlog_sync="batch", auth=True, tls=True,
                        settings={"partition_keys_in_select_fail_threshold": IN_KEYS_GUARDRAIL}) as server, \
            server.cluster() as cluster:
        cluster.connect().execute("CREATE KEYSPACE faults WITH replication = {'class': 'SimpleStrategy', "
                                  "'replication_factor': 1}")
        yield server


@pytest.fixture
def node(server):
    """The server and a session of this test's own: a test that restarts the node leaves the next one a session
    that has not found it again yet."""
    with server.cluster() as cluster:
        yield server, cluster.connect()


def options(server, table: str, **more: str) -> dict[str, str]:
    return {"host": server.host, "port": str(server.port), "keyspace": "faults", "table": table,
            "username": server.username, "password": server.password, "ssl.ca-pem": server.ca_pem, **more}


def kill_when_stored(node, session, table: str, rows: int, restart: bool) -> Striker:
    """In the background: once `rows` rows are in `table`, SIGKILL the node, then (if `restart`) wait until a client
    reaches its port during the outage and start it again."""
    server, _ = node

    def strike() -> None:
        deadline = time.monotonic() + 120
        while session.execute(f"SELECT COUNT(*) FROM faults.{table}").one()[0] < rows:
            assert time.monotonic() < deadline, f"the write never stored {rows} rows"
            threading.Event().wait(0.05)  # polling the store for the event: the rows are there
        server.kill()
        if restart:
            wait_for_a_client(server.host, server.port)
            server.start()

    striker = Striker(strike)
    striker.start()
    return striker


def paced_input(spark, session, table: str):
    """`table` created, and ROWS rows in two tasks paced slowly enough that a fault strikes mid-write."""
    session.execute(f"CREATE TABLE faults.{table} (id bigint PRIMARY KEY, pad text)")
    return (spark.range(0, ROWS, 1, 2).selectExpr("id", "repeat('x', 200) AS pad")
            .mapInArrow(slow(50, 0.1), "id long, pad string"))


def test_a_node_killed_and_restarted_mid_write_loses_nothing(spark, node):
    server, session = node
    table = "killed"
    df = paced_input(spark, session, table)
    opts = options(server, table, **{"sink.max-retries": "30", "sink.retry-delay-ms": "200",
                                     "request.timeout-ms": "2000"})
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
    df = paced_input(spark, session, table)
    opts = options(server, table, **{"sink.max-retries": "0", "request.timeout-ms": "2000"})
    striker = kill_when_stored(node, session, table, 500, restart=False)
    with pytest.raises(Exception, match=r"cassandra"):
        sluice.write(df, "cassandra", opts)
    striker.join(60)
    server.start()
    sluice.write(df, "cassandra", opts)  # the re-run: the same rows again, upserted by key
    assert stored_ids(server, table) == set(range(ROWS))


def test_a_stalled_node_times_requests_out_and_every_key_ends_at_its_last_change(spark, node):
    """SIGSTOP for 4 s with a 1 s request timeout: requests in flight time out (and may still be applied when the
    node resumes), the engine retries them; since each row's timestamp was fixed when it was encoded, a late
    original and its retry write the same cells, and a key's later change always wins."""
    server, session = node
    table = "stalled"
    session.execute(f"CREATE TABLE faults.{table} (id bigint PRIMARY KEY, version int)")
    # Every id three times, versions 0, 1, 2 in that order within its task.
    df = (spark.range(0, 3 * ROWS, 1, 2).selectExpr("id % 3000 AS id", "CAST(id DIV 3000 AS INT) AS version")
          .repartition(2, "id").sortWithinPartitions("version")
          .mapInArrow(slow(100, 0.1), "id long, version int"))
    opts = options(server, table, **{"sink.max-retries": "30", "sink.retry-delay-ms": "200",
                                     "request.timeout-ms": "1000", "batch.grouping": "none"})

    def stall() -> None:
        deadline = time.monotonic() + 120
        while session.execute(f"SELECT COUNT(*) FROM faults.{table}").one()[0] < 500:
            assert time.monotonic() < deadline, "the write never stored 500 rows"
            threading.Event().wait(0.05)
        os.kill(server.pid, signal.SIGSTOP)
        stalled.set()
        time.sleep(4)  # the fault's length: the node is frozen, not an event to wait for
        os.kill(server.pid, signal.SIGCONT)

    stalled = threading.Event()
    striker = Striker(stall)
    striker.start()
    sluice.write(df, "cassandra", opts)
    striker.join(60)
    assert stalled.is_set()
    assert sluice.last_write_summary("cassandra")["retries"] > 0
    with server.cluster() as cluster:
        got = {r.id: r.version for r in cluster.connect().execute(f"SELECT id, version FROM faults.{table}")}
    assert got == dict.fromkeys(range(ROWS), 2)


def test_a_node_killed_mid_stream_fails_the_lookup_query_after_the_retries_and_one_back_within_them_answers(
        spark, node, tmp_path):
    """Two streaming queries answered a micro-batch over TLS, as the node's user, then the node is SIGKILLed: the
    next micro-batch of the one with lookup.max-retries=1 fails it, naming the table and the node, writing no nulls.
    Negative control: the other, with lookup.max-retries=10, meets the same outage, the node is started again, and
    it answers the right rows (tests/lookup_faults.py)."""
    server, session = node
    session.execute("CREATE TABLE faults.dim (id int PRIMARY KEY, name text)")
    for key, name in ((1, "ann"), (2, "bo")):
        session.execute("INSERT INTO faults.dim (id, name) VALUES (%s, %s)", (key, name))
    lookup = Lookup("cassandra", options(server, "dim"), ["id"], "name", "id int")
    message = a_store_killed_mid_stream(spark, tmp_path, Outage(server.kill, server.start, server.host, server.port),
                                        lookup, [{"id": 1}, {"id": 3}], [{"id": 1}, {"id": 2}, {"id": 3}],
                                        ["ann", None, "ann", "bo", None])
    assert (f"looking up 3 key(s) in table faults.dim on cassandra://{server.username}@{server.host}:{server.port}"
            "/faults.dim failed after 2 attempt(s) (lookup.max-retries=1)") in message, message
    assert server.password not in message


def test_a_wrong_password_is_refused_clearly_and_never_shown(spark, node):
    server, _ = node
    df = spark.range(3).selectExpr("id", "'x' AS pad")
    with pytest.raises(Exception) as refused:
        sluice.write(df, "cassandra", {**options(server, "killed"), "password": "wrong-s3cret"})
    assert "authentication failed: check username and password" in str(refused.value)
    assert "wrong-s3cret" not in str(refused.value)


def test_tls_is_required_and_the_nodes_certificate_is_checked_against_ssl_ca_pem(spark, node, tmp_path):
    server, session = node
    session.execute("CREATE TABLE faults.tls (id bigint PRIMARY KEY, pad text)")
    df = spark.range(0, 100, 1, 2).selectExpr("id", "'x' AS pad")
    sluice.write(df, "cassandra", options(server, "tls"))  # every test here writes over TLS; this one checks it
    assert stored_ids(server, "tls") == set(range(100))
    plain = {k: v for k, v in options(server, "tls").items() if k != "ssl.ca-pem"}
    with pytest.raises(Exception) as refused:  # the negative control: the node takes no client without TLS
        sluice.write(df, "cassandra", plain)
    assert "ssl=true" in str(refused.value), refused.value
    other_ca = self_signed_certificate(tmp_path, server.host, "another-ca-pw", "other")
    with pytest.raises(Exception) as unverified:
        sluice.write(df, "cassandra", {**plain, "ssl.ca-pem": other_ca})
    message = str(unverified.value)
    assert "ssl.ca-pem" in message and "certificate" in message, message
    assert f"{server.host}:{server.port}" in message and "TLS failed" in message, message  # the node, and what failed
    for secret in (server.password, other_ca.splitlines()[1], server.ca_pem.splitlines()[1]):
        assert secret not in message


def test_an_in_over_the_nodes_guardrail_fails_naming_lookup_max_keys_per_request(node):
    """The node refuses a SELECT of more than 150 partition keys (cassandra.yaml's
    partition_keys_in_select_fail_threshold) to a role that is not a superuser: a lookup of 200 keys at
    lookup.max-keys-per-request=200 fails at its first statement, naming the option, its value and the guardrail.
    Negative control: the same keys at 150 a request are read."""
    from cassandra.concurrent import execute_concurrent_with_args

    from sluice.source._lookup_dataframe import plan_lookup
    from tests.connectors.cassandra.test_lookup import SCHEMA, run

    server, session = node
    session.execute("CREATE TABLE faults.guarded (pk int, ck int, v text, PRIMARY KEY ((pk), ck))")
    insert = session.prepare("INSERT INTO faults.guarded (pk, ck, v) VALUES (?, ?, ?)")
    execute_concurrent_with_args(session, insert, [(p, 0, str(p)) for p in range(200)])
    session.execute("CREATE ROLE reader WITH LOGIN = true AND SUPERUSER = false AND PASSWORD = 'reader-test-pw'")
    session.execute("GRANT SELECT ON KEYSPACE faults TO reader")
    keys = [(p, 0) for p in range(200)]

    def lookup(per_request: int) -> list:
        opts = {**options(server, "guarded"), "username": "reader", "password": "reader-test-pw",
                "lookup.max-keys-per-request": str(per_request)}
        plan, _ = plan_lookup(SCHEMA, "cassandra", opts, "pk", "inner", ["v"])
        return run(plan, keys)["v"]

    with pytest.raises(sluice.SinkError, match=r"lookup\.max-keys-per-request=200\) by its guardrail "
                                               r"partition_keys_in_select_fail_threshold") as refused:
        lookup(200)
    assert "Set lookup.max-keys-per-request below that threshold" in str(refused.value)
    assert "reader-test-pw" not in str(refused.value)
    assert sorted(lookup(IN_KEYS_GUARDRAIL), key=int) == [str(p) for p in range(200)]
