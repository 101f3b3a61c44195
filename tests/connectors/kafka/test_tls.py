"""format("sluice_kafka") sink and source over SASL_SSL (SCRAM-SHA-512 on TLS), the CA as PEM text in the options
(kafka.ssl.ca.pem: executors have no file of it); librdkafka checks the certificate and the broker's host name
(ssl.endpoint.identification.algorithm=https, its default). A CA that did not sign the broker's certificate is
refused before any write, naming the broker and the certificate; the password is in no error and no plan.

The broker also demands a client certificate (client_auth=True: ssl.client.auth=required on the SASL_SSL listener),
given as PEM text in librdkafka's own settings (kafka.ssl.certificate.pem, kafka.ssl.key.pem): every write and read
here presents one. None, one of another CA and an expired one are refused by the sink and the source, naming the
broker and the broker's alert; the key is in no error and no plan."""

import uuid

import pytest

from sluice.testing import read_committed
from sluice.testing._tls import TestCA

pytestmark = pytest.mark.spark

FORMAT = "sluice_kafka"


@pytest.fixture(scope="module")
def secured(secured_kafka):
    return secured_kafka  # tests/conftest.py


@pytest.fixture(scope="module")
def client(secured):
    return secured.client_ca.client_certificate("sluice")


def options(server, **more):
    mine = server.client_ca.client_certificate("sluice")
    return {"kafka.bootstrap.servers": server.bootstrap_servers, "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": server.username,
            "kafka.sasl.password": server.password, "kafka.ssl.ca.pem": server.ca_pem,
            "kafka.ssl.certificate.pem": mine.cert_pem, "kafka.ssl.key.pem": mine.key_pem, **more}


def test_a_write_and_a_read_over_sasl_ssl(spark, secured, client, capsys):
    """With a client certificate, as the broker demands."""
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    secured.create_topic(topic, 2)
    mine = {"kafka.ssl.certificate.pem": client.cert_pem, "kafka.ssl.key.pem": client.key_pem}
    df = spark.range(0, 200, 1, 2).selectExpr("CAST(id AS STRING) AS value")
    df.write.format(FORMAT).options(**options(secured, topic=topic, **mine)).mode("append").save()
    assert len(read_committed(secured.client_config(), topic)) == 200
    read = spark.read.format(FORMAT).options(**options(secured, subscribe=topic, **mine)).load()
    assert sorted(int(r.value) for r in read.selectExpr("CAST(value AS STRING) AS value").collect()) == \
        list(range(200))
    read.explain(True)
    shown = capsys.readouterr().out
    assert secured.password not in shown and client.key_pem.strip() not in shown


@pytest.mark.parametrize("case", ["no certificate", "another CA", "expired"])
def test_a_missing_foreign_or_expired_certificate_is_refused_by_the_sink_and_the_source(spark, secured, client,
                                                                                       case):
    """The negative controls of the write above: the same options but for the client certificate."""
    topic = f"mtls-{uuid.uuid4().hex[:8]}"
    secured.create_topic(topic)
    opts = options(secured, **{"timeout-ms": "2000"})  # the alert comes at once; librdkafka retries until then
    if case == "no certificate":
        del opts["kafka.ssl.certificate.pem"], opts["kafka.ssl.key.pem"]
        key = client.key_pem
    else:
        other = (TestCA("other client CA").client_certificate("sluice") if case == "another CA"
                 else secured.client_ca.client_certificate("sluice", expired=True))
        opts |= {"kafka.ssl.certificate.pem": other.cert_pem, "kafka.ssl.key.pem": other.key_pem}
        key = other.key_pem
    # A Java broker's alerts: "bad certificate" for none and for another CA's, "certificate unknown" for an expired one.
    alert = "certificate unknown" if case == "expired" else "bad certificate"
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception) as sink:
        df.write.format(FORMAT).options(**opts).option("topic", topic).mode("append").save()
    with pytest.raises(Exception) as source:
        spark.read.format(FORMAT).options(**opts).option("subscribe", topic).load().collect()
    servers = secured.bootstrap_servers.replace(".", r"\.")
    for refused in (sink, source):
        assert refused.match(rf"(?s){servers}.*TLS failed: .*the broker refused the client certificate \(TLS alert "
                             rf'"{alert}": .*check kafka\.ssl\.certificate\.pem and kafka\.ssl\.key\.pem')
        assert key.strip() not in str(refused.value) and secured.password not in str(refused.value)
    assert read_committed(secured.client_config(), topic) == []


def test_a_wrong_ca_is_refused_by_the_sink_and_the_source_naming_the_broker(spark, secured):
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    secured.create_topic(topic)
    wrong = options(secured, **{"kafka.ssl.ca.pem": TestCA("other").pem, "timeout-ms": "5000"})
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception) as sink:
        df.write.format(FORMAT).options(**wrong).option("topic", topic).mode("append").save()
    with pytest.raises(Exception) as source:
        spark.read.format(FORMAT).options(**wrong).option("subscribe", topic).load().collect()
    servers = secured.bootstrap_servers.replace(".", r"\.")
    for refused in (sink, source):
        assert refused.match(rf"(?s){servers}.*certificate verify failed.*check that kafka\.ssl\.ca\.pem holds the CA")
        assert secured.password not in str(refused.value)
    assert read_committed(secured.client_config(), topic) == []
