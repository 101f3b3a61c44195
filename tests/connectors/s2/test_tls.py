"""format("s2") over HTTPS with a token, against the local S2 server serving TLS (LocalS2(tls=True, token=...)).

The CA travels as PEM text in s2.ssl.ca-pem (executors have no file of it) and is added to the SDK's own TLS
context, which checks the certificate and the host name; a CA that did not sign the server's certificate is
refused with an error naming the endpoint; the token is in no error and no plan."""

import json
import uuid

import pytest

from sluice.connector import OptionError
from sluice.connectors.s2._client import Connection
from sluice.connectors.s2._options import READ_SPEC
from sluice.s2local import LocalS2
from sluice.testing._tls import TestCA

TOKEN = "s2-token-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def https_s2():
    with LocalS2(tls=True, token=TOKEN) as server:
        yield server


def options(server, basin, **more):
    return {"s2.basin": basin, "s2.endpoints.account": server.url, "s2.endpoints.basin": server.url,
            "s2.auth-token": TOKEN, "s2.ssl.ca-pem": server.ca_pem, **more}


def write(spark, opts, n=100):
    spark.range(0, n, 1, 2).selectExpr("id").write.format("s2").options(**opts) \
        .option("s2.stream", "s").option("s2.create-streams", "true").option("s2.create-basin", "true") \
        .mode("append").save()


@pytest.mark.spark
def test_a_write_and_a_read_over_verified_https_with_a_token(spark, https_s2, capsys):
    assert https_s2.url.startswith("https://127.0.0.1:")
    basin = f"tls-{uuid.uuid4().hex[:12]}"
    write(spark, options(https_s2, basin), 100)
    read = spark.read.format("s2").options(**options(https_s2, basin, **{"s2.streams": "s"})).load()
    assert sorted(json.loads(r.body)["id"] for r in read.select("body").collect()) == list(range(100))
    read.explain(True)
    assert TOKEN not in capsys.readouterr().out
    # the negative control: without the CA the SDK trusts only the system's CAs, which did not sign this server's
    without_ca = {k: v for k, v in options(https_s2, basin, **{"s2.streams": "s"}).items() if k != "s2.ssl.ca-pem"}
    with pytest.raises(Exception, match=r"TLS: S2 at https://127\.0\.0\.1:\d+ presented a certificate that was "
                                        "refused") as refused:
        spark.read.format("s2").options(**without_ca).option("s2.max-retries", "0").load().collect()
    assert TOKEN not in str(refused.value)


@pytest.mark.spark
def test_a_wrong_ca_is_refused_naming_the_endpoint(spark, https_s2):
    wrong = options(https_s2, f"tls-{uuid.uuid4().hex[:12]}", **{"s2.max-retries": "0"})
    wrong["s2.ssl.ca-pem"] = TestCA("other").pem
    with pytest.raises(Exception, match=r"TLS: S2 at https://127\.0\.0\.1:\d+ presented a certificate that was "
                                        r"refused for 'create-basin'.*certificate verify failed.*Check s2\.ssl\.ca-pem"
                       ) as refused:
        write(spark, wrong, 3)
    assert TOKEN not in str(refused.value)


@pytest.mark.spark
def test_a_wrong_token_is_refused_over_https_without_showing_it(spark, https_s2):
    wrong = "wrong-" + uuid.uuid4().hex
    opts = options(https_s2, f"tls-{uuid.uuid4().hex[:12]}", **{"s2.auth-token": wrong})
    with pytest.raises(Exception, match="HTTP 401") as refused:
        write(spark, opts, 3)
    assert wrong not in str(refused.value) and TOKEN not in str(refused.value)


def test_the_ca_is_pem_text_for_https_endpoints_only(https_s2):
    def conn(**more):
        return Connection.from_options(READ_SPEC.parse({**options(https_s2, "basin-tls-1"), "s2.streams": "s",
                                                        **more}))

    assert conn().ca_pem == https_s2.ca_pem and "BEGIN" not in repr(conn())
    with pytest.raises(OptionError, match="not a path"):
        conn(**{"s2.ssl.ca-pem": "/etc/ssl/ca.pem"})
    plain = "http://127.0.0.1:1"
    with pytest.raises(OptionError, match="endpoints are http:// \\(plaintext\\)"):
        conn(**{"s2.endpoints.account": plain, "s2.endpoints.basin": plain})
