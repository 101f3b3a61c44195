"""format("hbase") over HTTPS: HBase's Thrift2 gateway in its HTTP mode with TLS (its binary protocol has none), with
a certificate of a throwaway CA. Written and read back with the CA given as PEM text; refused, naming the gateway and
what failed and without retrying, when the CA is not given or is another one; and never sent in plaintext when ssl is
off (the binary protocol to an HTTPS port fails)."""

import pytest

import sluice
from sluice.connectors.hbase._client import Connection
from sluice.testing import LocalHBase
from sluice.testing._tls import TestCA
from tests.connectors.hbase.conftest import HBase

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def hbase_tls():
    with LocalHBase(tls=True) as server:
        helper = HBase(server)
        # The helper's own calls (table creation, reading back) go over HTTPS too.
        object.__setattr__(helper, "conn", Connection((server.host,), server.port, 60.0, True, server.ca_pem))
        yield helper


def test_a_write_and_a_read_over_https_verified_against_the_ca_given_as_text(spark, hbase_tls):
    table = hbase_tls.table()
    df = spark.createDataFrame([(i, f"v{i}") for i in range(200)], "id long, note string")
    sluice.write(df, "hbase", hbase_tls.opts(table, rowkey="id", family="d", **{"ssl.ca-pem": hbase_tls.server.ca_pem}))
    assert len(hbase_tls.rows(table)) == 200
    back = spark.read.format("hbase").options(**hbase_tls.opts(table, rowkey="id", family="d",
                                                               **{"ssl.ca-pem": hbase_tls.server.ca_pem})) \
        .schema("id long, note string").load()
    assert sorted(tuple(r) for r in back.collect()) == [(i, f"v{i}") for i in range(200)]


@pytest.mark.parametrize("trust", ["system", "another-ca"])
def test_a_gateway_whose_certificate_is_not_trusted_is_refused_naming_it(spark, hbase_tls, trust):
    table = hbase_tls.table()
    df = spark.createDataFrame([(1, "x")], "id long, note string")
    options = {"ssl": "true"} if trust == "system" else {"ssl.ca-pem": TestCA("another CA").pem}
    where = f"{hbase_tls.server.host}:{hbase_tls.server.port}"
    with pytest.raises(Exception, match=rf"TLS to the HBase Thrift2 gateway at {where} failed \(.*CERTIFICATE_VERIFY"
                                        r"_FAILED.*\).*Set ssl.ca-pem"):
        sluice.write(df, "hbase", hbase_tls.opts(table, rowkey="id", family="d", **options))
    assert hbase_tls.rows(table) == {}


def test_without_ssl_nothing_is_sent_in_plaintext_to_the_https_gateway(spark, hbase_tls):
    """The negative control: ssl off speaks the binary protocol, which the HTTPS port does not take; the write fails
    rather than reaching HBase some other way."""
    table = hbase_tls.table()
    df = spark.createDataFrame([(1, "x")], "id long, note string")
    with pytest.raises(Exception, match=r"HBase Thrift2 gateway at"):
        sluice.write(df, "hbase", hbase_tls.opts(table, rowkey="id", family="d", **{"request.timeout-ms": "5000",
                                                                                    "sink.max-retries": "1"}))
    assert hbase_tls.rows(table) == {}
