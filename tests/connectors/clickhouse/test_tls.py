"""format("clickhouse") over HTTPS, against the chdb stand-in serving TLS (ChdbClickHouse(tls=True)): the CA travels
as PEM text in ssl.ca-pem, the certificate and host name are checked, a CA that did not sign the server's certificate
is refused once (not retried) with an error naming the url, and the password is in no error and no plan.

The stand-in demands a client certificate (client_auth=True: Python's ssl, verify_mode=CERT_REQUIRED): every request
here presents one (ssl.cert-pem, ssl.key-pem); none, one of another CA and an expired one are refused naming the url
and the reason, not retried, and the key is in no error, plan or repr. The real clickhouse-server over HTTPS (and its
certificate users) is not what runs here."""

import pytest

import sluice
from sluice.connector import OptionError
from sluice.connectors.clickhouse._client import ClickHouseError, Connection
from sluice.connectors.clickhouse._options import READ_SPEC
from sluice.testing._tls import TestCA
from tests.clickhouse_chdb import ChdbClickHouse

PASSWORD = "ch-tls-Pw-91b2"


@pytest.fixture(scope="module")
def https_ch():
    with ChdbClickHouse(password=PASSWORD, tls=True, tls_names=("localhost",), client_auth=True) as server:
        yield server


@pytest.fixture(scope="module")
def client(https_ch):
    return https_ch.client_ca.client_certificate("sluice")


def options(server, table, **more):
    certificate = server.client_ca.client_certificate("sluice") if "ssl.cert-pem" not in more else None
    mine = {"ssl.cert-pem": certificate.cert_pem, "ssl.key-pem": certificate.key_pem} if certificate else {}
    return {"url": server.url, "table": table, "password": PASSWORD, "ssl.ca-pem": server.ca_pem, **mine, **more}


@pytest.mark.spark
def test_a_write_and_a_read_over_verified_https(spark, https_ch, client, capsys):
    """With a client certificate, as the stand-in demands."""
    https_ch.sql("CREATE TABLE tls_rw (id Int64, body String) ENGINE = MergeTree() ORDER BY id")
    df = spark.range(0, 300, 1, 2).selectExpr("id", "concat('row ', CAST(id AS STRING)) AS body")
    mine = {"ssl.cert-pem": client.cert_pem, "ssl.key-pem": client.key_pem}
    sluice.write(df, "clickhouse", options(https_ch, "tls_rw", **mine))
    read = spark.read.format("clickhouse").options(**options(https_ch, "tls_rw", **mine)).load()
    assert sorted(r.id for r in read.collect()) == list(range(300))
    read.explain(True)
    shown = capsys.readouterr().out
    assert PASSWORD not in shown and client.key_pem.strip() not in shown
    assert client.key_pem.strip() not in repr(Connection.from_options(READ_SPEC.parse(options(https_ch, "t", **mine))))
    # the negative control: without the CA, the system's CAs do not vouch for this server
    without_ca = {k: v for k, v in options(https_ch, "tls_rw").items() if k != "ssl.ca-pem"}
    with pytest.raises(Exception, match=r"TLS: ClickHouse at https://localhost:\d+ presented a certificate"):
        spark.read.format("clickhouse").options(**without_ca).load().collect()


@pytest.mark.spark
def test_a_wrong_ca_is_refused_naming_the_url_and_never_retried(spark, https_ch):
    https_ch.sql("CREATE TABLE tls_wrong (id Int64) ENGINE = MergeTree() ORDER BY id")
    wrong = options(https_ch, "tls_wrong", **{"ssl.ca-pem": TestCA("other").pem})
    with pytest.raises(Exception, match=r"TLS: ClickHouse at https://localhost:\d+ presented a certificate that "
                                        r"was refused \(.*certificate verify failed.*Check ssl\.ca-pem") as refused:
        sluice.write(spark.range(10), "clickhouse", wrong)
    assert PASSWORD not in str(refused.value)
    assert https_ch.rows("SELECT count() FROM tls_wrong") == [["0"]]


def test_a_host_name_the_certificate_does_not_list_is_refused(https_ch):
    assert https_ch.url.startswith("https://localhost:")  # the certificate lists localhost only
    ip = Connection.from_options(READ_SPEC.parse(options(https_ch, "t", url=https_ch.url.replace("localhost",
                                                                                                 "127.0.0.1"))))
    with pytest.raises(ClickHouseError, match=r"TLS: ClickHouse at https://127\.0\.0\.1:\d+ presented a certificate "
                                              r"that was refused \(.*IP address mismatch") as refused:
        ip.query("SELECT 1")
    assert PASSWORD not in str(refused.value)
    assert Connection.from_options(READ_SPEC.parse(options(https_ch, "t"))).query("SELECT 1").strip() == "1"


def test_the_ca_is_pem_text_for_https_urls_only(https_ch):
    with pytest.raises(OptionError, match="not a path"):
        Connection.from_options(READ_SPEC.parse(options(https_ch, "t", **{"ssl.ca-pem": "/etc/ssl/ca.pem"})))
    with pytest.raises(OptionError, match="plain http://"):
        Connection.from_options(READ_SPEC.parse(options(https_ch, "t", url="http://127.0.0.1:1")))


@pytest.mark.spark
@pytest.mark.parametrize("case", ["no certificate", "another CA", "expired"])
def test_a_missing_foreign_or_expired_certificate_is_refused_by_name(spark, https_ch, client, case):
    """The negative controls of the write above: the same options but for the client certificate."""
    https_ch.sql("CREATE TABLE IF NOT EXISTS mtls_refused (id Int64) ENGINE = MergeTree() ORDER BY id")
    if case == "no certificate":
        opts = {k: v for k, v in options(https_ch, "mtls_refused").items() if k not in ("ssl.cert-pem", "ssl.key-pem")}
        key, reason = client.key_pem, r"the server requires one and none was given: set the certificate and its key"
    else:
        other = (TestCA("other client CA").client_certificate("sluice") if case == "another CA"
                 else https_ch.client_ca.client_certificate("sluice", expired=True))
        opts = options(https_ch, "mtls_refused", **{"ssl.cert-pem": other.cert_pem, "ssl.key-pem": other.key_pem})
        key = other.key_pem
        reason = {"another CA": r"the server does not trust the CA that signed it.*unknown ca",
                  "expired": r"it has expired: renew it.*certificate expired"}[case]
    with pytest.raises(Exception, match=r"TLS: ClickHouse at https://localhost:\d+ refused the client certificate "
                                        r"\(ssl\.cert-pem\): " + reason) as refused:
        sluice.write(spark.range(3), "clickhouse", opts)
    assert key.strip() not in str(refused.value) and PASSWORD not in str(refused.value)
    assert https_ch.rows("SELECT count() FROM mtls_refused") == [["0"]]


def test_the_client_certificate_is_pem_text_of_both_for_https(https_ch, client):
    mine = {"ssl.cert-pem": client.cert_pem, "ssl.key-pem": client.key_pem}
    with pytest.raises(OptionError, match=r"'ssl\.cert-pem' is set without 'ssl\.key-pem'"):
        Connection.from_options(READ_SPEC.parse(options(https_ch, "t", **{"ssl.cert-pem": client.cert_pem})))
    with pytest.raises(OptionError, match="not a path") as as_path:
        Connection.from_options(READ_SPEC.parse(options(https_ch, "t", **{**mine, "ssl.key-pem": "/etc/k.pem"})))
    assert "/etc/k.pem" not in str(as_path.value)
    with pytest.raises(OptionError, match="plain http://"):
        Connection.from_options(READ_SPEC.parse(options(https_ch, "t", url="http://127.0.0.1:1", **mine)))
