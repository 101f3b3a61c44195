"""format("clickhouse") over HTTPS, against the chdb stand-in serving TLS (ChdbClickHouse(tls=True)): the CA travels
as PEM text in ssl.ca-pem, the certificate and host name are checked, a CA that did not sign the server's certificate
is refused once (not retried) with an error naming the url, and the password is in no error and no plan."""

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
    with ChdbClickHouse(password=PASSWORD, tls=True, tls_names=("localhost",)) as server:
        yield server


def options(server, table, **more):
    return {"url": server.url, "table": table, "password": PASSWORD, "ssl.ca-pem": server.ca_pem, **more}


@pytest.mark.spark
def test_a_write_and_a_read_over_verified_https(spark, https_ch, capsys):
    https_ch.sql("CREATE TABLE tls_rw (id Int64, body String) ENGINE = MergeTree() ORDER BY id")
    df = spark.range(0, 300, 1, 2).selectExpr("id", "concat('row ', CAST(id AS STRING)) AS body")
    sluice.write(df, "clickhouse", options(https_ch, "tls_rw"))
    read = spark.read.format("clickhouse").options(**options(https_ch, "tls_rw")).load()
    assert sorted(r.id for r in read.collect()) == list(range(300))
    read.explain(True)
    assert PASSWORD not in capsys.readouterr().out
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
