"""format("sluice_kafka")'s write options, columns and record sizes, without a broker or Spark."""

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from sluice.connector import OptionError
from sluice.connectors.kafka import KafkaDataSource
from sluice.connectors.kafka._checks import RecordColumns, check_columns
from sluice.connectors.kafka._options import WriteOptions
from sluice.connectors.kafka._sink import BATCH_OVERHEAD, HEADER_OVERHEAD, record_sizes

BASE = {"kafka.bootstrap.servers": "b1:9092,b2:9092", "topic": "orders"}


def parsed(**more):
    return KafkaDataSource({**BASE, **more}).write_options()


def test_kafka_settings_pass_through_and_secrets_are_redacted():
    opts = parsed(**{"kafka.linger.ms": "20", "kafka.sasl.username": "app", "kafka.sasl.password": "pw-secret",
                     "kafka.sasl.oauthbearer.config": "token-secret"})
    write = WriteOptions.of(opts)
    assert dict(write.client) == {"bootstrap.servers": "b1:9092,b2:9092", "linger.ms": "20",
                                     "sasl.username": "app", "sasl.password": "pw-secret",
                                     "sasl.oauthbearer.config": "token-secret"}
    for shown in (repr(opts), repr(write), str(write.client)):
        assert "pw-secret" not in shown and "token-secret" not in shown and "<redacted>" in shown
    assert write.client.scrub("failed with pw-secret") == "failed with <redacted>"


@pytest.mark.parametrize(("raw", "message"), [
    ({"topic": "t"}, "needs option\\(s\\) kafka.bootstrap.servers"),
    ({**BASE, "kafka.transactional.id": "x"}, "sink.transactional=true"),
    ({**BASE, "kafka.enable.idempotence": "false"}, "idempotent producer"),
    ({**BASE, "kafka.sasl.jaas.config": "x"}, "kafka.sasl.username and kafka.sasl.password"),
    ({**BASE, "topik": "x"}, "Did you mean 'topic'"),
    ({**BASE, "transactional-id-prefix": "p"}, "only applies to sink.transactional=true"),
    ({**BASE, "sink.transactional": "true"}, "needs sink.mode=global-ordered"),
    ({**BASE, "timeout-ms": "10"}, "'timeout-ms' must be >= 100"),
])
def test_bad_options_are_refused(raw, message):
    with pytest.raises(OptionError, match=message):
        KafkaDataSource(raw).write_options()


HEADERS = T.ArrayType(T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]))


def schema(**columns: T.DataType) -> T.StructType:
    return T.StructType([T.StructField(name, dtype) for name, dtype in columns.items()])


def test_the_columns_of_sparks_kafka_sink():
    assert check_columns(schema(key=T.StringType(), value=T.BinaryType(), headers=HEADERS, topic=T.StringType(),
                                partition=T.IntegerType(), timestamp=T.TimestampType()), None) == \
        RecordColumns(True, True, True, True, True)
    assert check_columns(schema(value=T.StringType()), "t") == RecordColumns(False, False, False, False, False)
    with pytest.raises(OptionError, match="needs a topic"):
        check_columns(schema(value=T.StringType()), None)
    with pytest.raises(OptionError, match="column 'partition' is bigint; it must be int"):
        check_columns(schema(value=T.StringType(), partition=T.LongType()), "t")
    with pytest.raises(OptionError, match="column 'value' is int"):
        check_columns(schema(value=T.IntegerType()), "t")


def test_record_sizes_are_kafkas():
    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = pa.RecordBatch.from_pydict({
        "key": pa.array(["k", "kk", None]),
        "value": pa.array([b"abc", None, b"x" * 10]),
        "headers": pa.array([[{"key": "h", "value": b"12"}], None, []], headers_type),
    })
    sizes = record_sizes(batch, RecordColumns(True, True, False, False, False)).tolist()
    assert sizes == [1 + 3 + 1 + 2 + HEADER_OVERHEAD + BATCH_OVERHEAD, 2 + BATCH_OVERHEAD, 10 + BATCH_OVERHEAD]
