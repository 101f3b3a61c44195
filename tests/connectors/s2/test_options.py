"""The S2 formats' options as typed objects, one class per record kind (no server, no Spark)."""

import pickle

from pyspark.sql.types import LongType, StringType, StructField, StructType

from sluice.connectors.s2._client import Connection
from sluice.connectors.s2._datasource import S2DataSource, S2UpsertDataSource
from sluice.connectors.s2._kinds import RecordKind
from sluice.connectors.s2._options import (
    APPEND_SPEC,
    READ_SPEC,
    UPSERT_READ_SPEC,
    UPSERT_SPEC,
    AppendWriteOptions,
    ReadOptions,
    UpsertReadOptions,
    UpsertWriteOptions,
)
from sluice.connectors.s2._sink import S2WritePlan
from sluice.engine import SinkConfig

CONNECTION = {"s2.basin": "typed-basin", "s2.auth-token": "sekrit-token", "s2.endpoints.account": "http://h:1",
              "s2.endpoints.basin": "http://h:1"}


def test_write_options_have_a_class_per_record_kind():
    append = AppendWriteOptions.of(APPEND_SPEC.parse({**CONNECTION, "s2.stream": "o/{r}", "format": "RAW",
                                                      "s2.max-append-sessions": "7"}))
    assert (append.kind, append.s2_stream, append.format, append.s2_max_append_sessions) == \
        (RecordKind.APPEND, "o/{r}", "raw", 7)
    assert (append.s2_create_streams, append.s2_create_basin, append.s2_stamp_writer) == (False, False, False)
    upsert = UpsertWriteOptions.of(UPSERT_SPEC.parse({**CONNECTION, "s2.stream": "s", "primary-key": "a, b",
                                                      "upsert.op-column": "op"}))
    assert (upsert.kind, upsert.primary_key, upsert.upsert_op_column, upsert.upsert_reduce) == \
        (RecordKind.UPSERT, ("a", "b"), "op", True)
    assert S2UpsertDataSource(options={}).primary_key(UPSERT_SPEC.parse({**CONNECTION, "s2.stream": "s",
                                                                         "primary-key": "id"})) == ("id",)


def test_read_options_have_a_class_per_record_kind():
    read = ReadOptions.of(READ_SPEC.parse({**CONNECTION, "s2.streams": "a,b", "failOnDataLoss": "false"}))
    assert (read.kind, read.s2_streams, read.fail_on_data_loss, read.s2_start, read.format) == \
        (RecordKind.APPEND, ("a", "b"), False, "earliest", "binary")
    upsert = UpsertReadOptions.of(UPSERT_READ_SPEC.parse({**CONNECTION, "s2.discovery-prefix": "p",
                                                          "primary-key": "id"}))
    assert (upsert.kind, upsert.primary_key, upsert.s2_discovery_prefix) == (RecordKind.UPSERT, ("id",), "p")
    assert S2UpsertDataSource.read_spec is UPSERT_READ_SPEC and S2DataSource.read_spec is READ_SPEC


def test_the_write_plan_travels_typed_and_never_shows_the_token():
    opts = APPEND_SPEC.parse({**CONNECTION, "s2.stream": "s"})
    schema = StructType([StructField("id", LongType()), StructField("v", StringType())])
    plan = S2WritePlan("s2", opts, schema, SinkConfig.of(opts), AppendWriteOptions.of(opts),
                       Connection.from_options(opts))
    copy = pickle.loads(pickle.dumps(plan))
    assert (copy.write, copy.conn) == (plan.write, plan.conn) and copy.conn.token == "sekrit-token"
    assert "sekrit" not in repr(plan)
    assert S2DataSource.write_options_type is AppendWriteOptions
    assert S2UpsertDataSource.read_options_type is UpsertReadOptions
