"""format("sluice_kafka") on a SASL/SCRAM listener: the password reaches the producer, and a wrong one fails the write
before any task starts, naming the authentication, with the password nowhere in the error or the plan."""

import uuid

import pytest

from sluice.testing import LocalKafka, read_committed

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def scram():
    with LocalKafka(sasl="SCRAM-SHA-512") as server:
        yield server


def sink_options(server, password):
    return {f"kafka.{k}": str(v) for k, v in server.client_config(**{"sasl.password": password}).items()}


def test_a_write_with_the_password_lands(spark, scram):
    topic = f"auth-{uuid.uuid4().hex[:8]}"
    scram.create_topic(topic)
    df = spark.range(0, 100, 1, 2).selectExpr("CAST(id AS STRING) AS value")
    df.write.format("sluice_kafka").options(**sink_options(scram, scram.password)).option("topic", topic) \
        .mode("append").save()
    assert len(read_committed(scram.client_config(), topic)) == 100


def test_a_wrong_password_fails_before_the_write_without_showing_it(spark, scram):
    topic = f"auth-{uuid.uuid4().hex[:8]}"
    scram.create_topic(topic)
    wrong = "wrong-" + uuid.uuid4().hex
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    writer = df.write.format("sluice_kafka").options(**sink_options(scram, wrong)).option("topic", topic) \
        .option("timeout-ms", "5000").mode("append")
    with pytest.raises(Exception, match=r"(?i)authentication") as error:
        writer.save()
    assert wrong not in str(error.value) and scram.password not in str(error.value)
    assert read_committed(scram.client_config(), topic) == []


def test_the_password_is_in_no_plan_progress_or_command_line(spark, scram, tmp_path, capsys):
    import subprocess

    topic = f"auth-{uuid.uuid4().hex[:8]}"
    scram.create_topic(topic)
    src = tmp_path / "in"
    spark.range(0, 50, 1, 1).selectExpr("CAST(id AS STRING) AS value").write.parquet(str(src))
    query = (spark.readStream.schema("value string").parquet(str(src)).writeStream.format("sluice_kafka")
             .options(**sink_options(scram, scram.password)).option("topic", topic)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    capsys.readouterr()
    query.explain(extended=True)
    plan = capsys.readouterr().out
    commands = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "sluice_kafka" in plan and len(read_committed(scram.client_config(), topic)) == 50
    for shown in (plan, str(query.lastProgress), str(query.recentProgress), commands):
        assert scram.password not in shown
