"""format("elasticsearch") signed in by a client certificate alone (mutual TLS), against OpenSearch whose security
demands one on its REST layer (LocalOpenSearch(auth=True, tls=True, client_auth=True): clientauth_mode REQUIRE, a
client CA of the server's own, and its clientcert authentication, which takes the certificate's common name as the
user). The certificate and its key travel as PEM text (ssl.cert-pem, ssl.key-pem), with no password: a write and a
read present it; no certificate, one of another CA and an expired one are refused to the write and the read, naming
the node and its TLS alert, without a retry, and nothing is written; the key is in no error, plan or repr."""

import pytest

import sluice
from sluice.connectors.elasticsearch._client import Connection
from sluice.connectors.elasticsearch._options import READ_SPEC
from sluice.testing import LocalOpenSearch
from sluice.testing._tls import TestCA

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def secured():
    with LocalOpenSearch(auth=True, tls=True, client_auth=True, password="os-mtls-Pw-3b1c7") as server:
        yield server


@pytest.fixture(scope="module")
def client(secured):
    return secured.client_ca.client_certificate(secured.username)  # the common name is the user it signs in as


def options(server, index, certificate, **more):
    """No username or password: the certificate alone signs in."""
    return {"nodes": server.url, "index": index, "ssl.ca-pem": server.ca_pem, "ssl.cert-pem": certificate.cert_pem,
            "ssl.key-pem": certificate.key_pem, **more}


def test_a_client_certificate_signs_in_to_write_and_read(spark, secured, client, capsys):
    df = spark.range(0, 100, 1, 2).selectExpr("id", "concat('doc ', CAST(id AS STRING)) AS body")
    sluice.write(df, "elasticsearch", options(secured, "mtls_rw", client, **{"mapping.id": "id",
                                                                          "write.refresh": "true"}))
    read = spark.read.format("elasticsearch").options(**options(secured, "mtls_rw", client)).load()
    assert sorted(r.id for r in read.select("id").collect()) == list(range(100))
    read.explain(True)
    key = client.key_pem.strip()
    assert key not in capsys.readouterr().out
    conn = Connection.from_options(READ_SPEC.parse(options(secured, "mtls_rw", client)))
    assert conn.certificate is not None and key not in repr(conn)


@pytest.mark.parametrize("case", ["no certificate", "another CA", "expired"])
def test_a_missing_foreign_or_expired_certificate_is_refused_naming_the_node(spark, secured, client, case):
    """The negative controls of the write above: the same options but for the client certificate."""
    index = f"mtls_{case.replace(' ', '_').lower()}"
    opts = options(secured, index, client)
    if case == "no certificate":
        del opts["ssl.cert-pem"], opts["ssl.key-pem"]
        key = client.key_pem
    else:
        other = (TestCA("other client CA").client_certificate(secured.username) if case == "another CA"
                 else secured.client_ca.client_certificate(secured.username, expired=True))
        opts |= {"ssl.cert-pem": other.cert_pem, "ssl.key-pem": other.key_pem}
        key = other.key_pem
    # A Java server's alerts (OpenSearch's TLS is the JDK's): "bad certificate" for none, "certificate unknown" for
    # one it cannot verify (another CA's, an expired one).
    alert = "bad certificate" if case == "no certificate" else "certificate unknown"
    with pytest.raises(Exception) as write:
        sluice.write(spark.range(3), "elasticsearch", {**opts, "mapping.id": "id"})
    with pytest.raises(Exception) as read:
        spark.read.format("elasticsearch").options(**opts).load().collect()
    for refused in (write, read):
        assert refused.match(rf"TLS: https://127\.0\.0\.1:{secured.http_port} refused the client certificate "
                             rf'\(ssl\.cert-pem.*; TLS alert "{alert}": .*\) \[.*\]\. '
                             r"Set ssl\.cert-pem and ssl\.key-pem")
        assert key.strip() not in str(refused.value)
        assert "attempt" not in str(refused.value)  # a certificate does not change between attempts
    status, _ = secured.request("GET", f"/{index}/_count")
    assert status == 404  # nothing was written, not even the index
