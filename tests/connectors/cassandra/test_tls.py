"""format("cassandra") signed in by a client certificate (mutual TLS), against a node that demands one
(LocalCassandra(tls=True, client_auth=True): client_encryption_options' require_client_auth, a truststore holding a
client CA of the server's own). The certificate and its key travel as PEM text (ssl.cert-pem, ssl.key-pem): a write
and a read present it; no certificate, one of another CA and an expired one are refused to the write and the read on
the driver, before any task, naming the node and the node's TLS alert, and nothing is written; the key is in no
error, plan or repr.

One server for the module (a node's start costs more than all the tests here)."""

import uuid

import pytest

import sluice
from sluice.connectors.cassandra._client import Connection
from sluice.connectors.cassandra._options import READ_SPEC
from sluice.testing import LocalCassandra
from sluice.testing._tls import TestCA

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def secured():
    with LocalCassandra(tls=True, client_auth=True) as server, server.cluster() as cluster:
        cluster.connect().execute("CREATE KEYSPACE mtls WITH replication = {'class': 'SimpleStrategy', "
                                  "'replication_factor': 1}")
        yield server


@pytest.fixture(scope="module")
def client(secured):
    return secured.client_ca.client_certificate("sluice")


def options(server, table: str, certificate, **more: str) -> dict[str, str]:
    return {"host": server.host, "port": str(server.port), "keyspace": "mtls", "table": table,
            "ssl.ca-pem": server.ca_pem, "ssl.cert-pem": certificate.cert_pem, "ssl.key-pem": certificate.key_pem,
            **more}


def new_table(server) -> str:
    table = f"t_{uuid.uuid4().hex[:8]}"
    with server.cluster() as cluster:
        cluster.connect().execute(f"CREATE TABLE mtls.{table} (id bigint PRIMARY KEY, body text)")
    return table


def stored(server, table: str) -> int:
    with server.cluster() as cluster:
        return cluster.connect().execute(f"SELECT COUNT(*) FROM mtls.{table}").one()[0]


def test_a_client_certificate_signs_in_to_write_and_read(spark, secured, client, capsys):
    table = new_table(secured)
    df = spark.range(0, 100, 1, 2).selectExpr("id", "concat('row ', id) AS body")
    sluice.write(df, "cassandra", options(secured, table, client))
    assert stored(secured, table) == 100
    read = spark.read.format("cassandra").options(**options(secured, table, client)).load()
    assert sorted(r.id for r in read.collect()) == list(range(100))
    read.explain(True)
    key = client.key_pem.strip()
    assert key not in capsys.readouterr().out
    opts = options(secured, table, client)
    conn = Connection.from_options(READ_SPEC.parse(opts))
    assert conn.ssl and conn.certificate is not None and key not in repr(conn)


@pytest.mark.parametrize("case", ["no certificate", "another CA", "expired"])
def test_a_missing_foreign_or_expired_certificate_is_refused_naming_the_node(spark, secured, client, case):
    """The negative controls of the write above: the same options but for the client certificate."""
    table = new_table(secured)
    opts = options(secured, table, client)
    if case == "no certificate":
        del opts["ssl.cert-pem"], opts["ssl.key-pem"]
        key = client.key_pem
    else:
        other = (TestCA("other client CA").client_certificate("sluice") if case == "another CA"
                 else secured.client_ca.client_certificate("sluice", expired=True))
        opts |= {"ssl.cert-pem": other.cert_pem, "ssl.key-pem": other.key_pem}
        key = other.key_pem
    # The node's alerts (netty-tcnative's OpenSSL): none and expired are named; another CA's is "internal error".
    alert = {"no certificate": "certificate required", "another CA": "internal error", "expired": "certificate expired"}
    df = spark.range(3).selectExpr("id", "'x' AS body")
    with pytest.raises(Exception) as write:
        sluice.write(df, "cassandra", opts)
    with pytest.raises(Exception) as read:
        spark.read.format("cassandra").options(**opts).load().collect()
    for refused in (write, read):
        assert refused.match(rf"cannot connect to Cassandra at cassandra://{secured.host}:{secured.port}/mtls\."
                             rf'{table}: TLS: the node refused the client certificate \(.*TLS alert "{alert[case]}": '
                             r".*\) \[.*\]\. Set ssl\.cert-pem and ssl\.key-pem")
        assert key.strip() not in str(refused.value)
    assert stored(secured, table) == 0
