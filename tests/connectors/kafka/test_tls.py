"""format("sluice_kafka") sink and source over SASL_SSL (SCRAM-SHA-512 on TLS), the CA as PEM text in the options
(kafka.ssl.ca.pem: executors have no file of it); librdkafka checks the certificate and the broker's host name
(ssl.endpoint.identification.algorithm=https, its default). A CA that did not sign the broker's certificate is
refused before any write, naming the broker and the certificate; the password is in no error and no plan."""

import uuid

import pytest

from sluice.testing import LocalKafka, read_committed
from sluice.testing._tls import TestCA

pytestmark = pytest.mark.spark

FORMAT = "sluice_kafka"


@pytest.fixture(scope="module")
def secured():
    with LocalKafka(sasl="SCRAM-SHA-512", tls=True, heap_mb=256) as server:
        yield server


def options(server, **more):
    return {"kafka.bootstrap.servers": server.bootstrap_servers, "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": server.username,
            "kafka.sasl.password": server.password, "kafka.ssl.ca.pem": server.ca_pem, **more}


def test_a_write_and_a_read_over_sasl_ssl(spark, secured, capsys):
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    secured.create_topic(topic, 2)
    df = spark.range(0, 200, 1, 2).selectExpr("CAST(id AS STRING) AS value")
    df.write.format(FORMAT).options(**options(secured, topic=topic)).mode("append").save()
    assert len(read_committed(secured.client_config(), topic)) == 200
    read = spark.read.format(FORMAT).options(**options(secured, subscribe=topic)).load()
    assert sorted(int(r.value) for r in read.selectExpr("CAST(value AS STRING) AS value").collect()) == \
        list(range(200))
    read.explain(True)
    assert secured.password not in capsys.readouterr().out


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
