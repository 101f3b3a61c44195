"""format("elasticsearch") over HTTPS with a password, against OpenSearch with its security plugin serving HTTPS
(LocalOpenSearch(auth=True, tls=True)): the CA travels as PEM text in ssl.ca-pem, certificate and host name are
checked, a CA that did not sign the node's certificate is refused naming the node, before anything is written, and the
password is in no error and no plan. (The embedded Elasticsearch 7.17 has no X-Pack: neither TLS nor users.)"""

import pytest

import sluice
from sluice.testing import LocalOpenSearch
from sluice.testing._tls import TestCA

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def https_search():
    with LocalOpenSearch(auth=True, tls=True, password="os-tls-Pw-5e8a1") as server:
        yield server


def options(server, index, **more):
    return {"nodes": server.url, "index": index, "username": server.username, "password": server.password,
            "ssl.ca-pem": server.ca_pem, **more}


def test_a_write_and_a_read_over_verified_https(spark, https_search, capsys):
    assert https_search.url.startswith("https://127.0.0.1:")
    df = spark.range(0, 200, 1, 2).selectExpr("id", "concat('doc ', CAST(id AS STRING)) AS body")
    sluice.write(df, "elasticsearch", options(https_search, "tls_rw", **{"mapping.id": "id",
                                                                          "write.refresh": "true"}))
    read = spark.read.format("elasticsearch").options(**options(https_search, "tls_rw")).load()
    assert sorted(r.id for r in read.select("id").collect()) == list(range(200))
    read.explain(True)
    assert https_search.password not in capsys.readouterr().out
    # the negative control: without the CA, the system's CAs do not vouch for this node
    without_ca = {k: v for k, v in options(https_search, "tls_rw").items() if k != "ssl.ca-pem"}
    with pytest.raises(Exception, match=r"TLS: https://127\.0\.0\.1:\d+ presented a certificate that was refused"):
        spark.read.format("elasticsearch").options(**without_ca).load().collect()


def test_a_wrong_ca_is_refused_naming_the_node_before_anything_is_written(spark, https_search):
    wrong = options(https_search, "tls_wrong", **{"ssl.ca-pem": TestCA("other").pem, "mapping.id": "id"})
    with pytest.raises(Exception, match=r"TLS: https://127\.0\.0\.1:\d+ presented a certificate that was refused "
                                        r"\(.*certificate verify failed.*Check ssl\.ca-pem") as refused:
        sluice.write(spark.range(10), "elasticsearch", wrong)
    assert https_search.password not in str(refused.value)
    status, _ = https_search.request("GET", "/tls_wrong/_count")
    assert status == 404  # nothing was written, not even the index
