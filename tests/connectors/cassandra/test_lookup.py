"""sluice.lookup(df, "cassandra", ...) on the package's Cassandra: left and inner joins, a missing key, a partition
of several rows and a clustering prefix, a composite partition key, the statements' routing and consistency, a
cluster that cannot be reached, and bad input named."""

import copy
import dataclasses

import pyarrow as pa
import pytest
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

import sluice
from sluice.connectors.cassandra._client import CassandraError
from sluice.metrics._lookups import LookupTally
from sluice.source._lookup_dataframe import plan_lookup
from sluice.source._lookup_join import enrich
from sluice.testing._postgres import free_port

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def events(cass):
    """pk 1: three rows (ck 1..3); pk 2: one row; pk 3: none."""
    table = cass.table("pk int, ck int, v text, amount double, id uuid, PRIMARY KEY ((pk), ck)")
    for pk, ck in [(1, 1), (1, 2), (1, 3), (2, 1)]:
        cass.cql(f"INSERT INTO sluice.{table} (pk, ck, v, amount, id) VALUES (%s, %s, %s, %s, uuid())",
                 (pk, ck, f"v{pk}-{ck}", pk + ck / 10))
    return table


def test_left_and_inner_give_every_row_of_a_partition_typed_as_the_batch_read_types_them(spark, cass, events):
    df = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c"), (None, "d")], "pk long, event string")
    left = sluice.lookup(df, "cassandra", cass.opts(events), on="pk")
    read = spark.read.format("cassandra").options(**cass.opts(events)).load()
    assert left.schema.fields[2:] == [f for f in read.schema.fields if f.name != "pk"]
    rows = sorted(((r.event, r.ck, r.v) for r in left.collect()), key=str)
    assert rows == [("a", 1, "v1-1"), ("a", 2, "v1-2"), ("a", 3, "v1-3"), ("b", 1, "v2-1"), ("c", None, None),
                    ("d", None, None)]
    inner = sluice.lookup(df, "cassandra", cass.opts(events), on="pk", how="inner", columns=["v"])
    assert sorted((r.event, r.v) for r in inner.collect()) == [("a", "v1-1"), ("a", "v1-2"), ("a", "v1-3"),
                                                                ("b", "v2-1")]


SCHEMA = StructType([StructField("pk", IntegerType()), StructField("ck", IntegerType()),
                     StructField("event", StringType())])


def run(plan, keys):
    """One Arrow batch through the workers' code, in this process."""
    batch = pa.record_batch({"pk": pa.array([k[0] for k in keys], pa.int32()),
                             "ck": pa.array([k[1] for k in keys], pa.int32()), "event": [str(k) for k in keys]})
    try:
        return enrich(plan, batch, None, LookupTally()).to_pydict()
    finally:
        plan.reader.close(clean=True)


def test_a_clustering_prefix_narrows_the_partition_and_each_select_is_routed_at_local_quorum(cass, events):
    from cassandra import ConsistencyLevel

    plan, _ = plan_lookup(SCHEMA, "cassandra", cass.opts(events), ["ck", "pk"], "left", ["v"])
    assert run(plan, [(1, 2), (2, 1), (2, 2)])["v"] == ["v1-2", "v2-1", None]
    prepared = plan.reader._prepared
    # The routing key's columns are bound, so the token-aware policy sends each SELECT to a replica of its partition.
    assert prepared.routing_key_indexes == [0] and prepared.consistency_level == ConsistencyLevel.LOCAL_QUORUM
    one, _ = plan_lookup(SCHEMA, "cassandra", cass.opts(events, **{"read.consistency": "ONE"}), "pk", "left", ["v"])
    assert run(one, [(2, 0)])["v"] == ["v2-1"] and one.reader._prepared.consistency_level == ConsistencyLevel.ONE


def test_many_partitions_of_one_batch_are_read_concurrently_each_once(cass):
    from cassandra.concurrent import execute_concurrent_with_args

    table = cass.table("pk int, ck int, v text, PRIMARY KEY ((pk), ck)")
    insert = cass.session.prepare(f"INSERT INTO sluice.{table} (pk, ck, v) VALUES (?, ?, ?)")
    execute_concurrent_with_args(cass.session, insert, [(p, c, f"{p}-{c}") for p in range(150) for c in range(2)])
    options = cass.opts(table, **{"lookup.max-concurrent-requests": "4"})
    plan, _ = plan_lookup(SCHEMA, "cassandra", options, "pk", "inner", ["v"])
    assert plan.reader.concurrency == 4
    keys = [(p, 0) for p in range(0, 300, 2)]  # every even pk: 75 found (two rows each), 75 missing
    out = run(plan, keys)["v"]
    assert sorted(out) == sorted(f"{p}-{c}" for p in range(0, 150, 2) for c in range(2))


def test_a_composite_partition_key_is_looked_up_whole(cass):
    table = cass.table("tenant text, day int, n int, v text, PRIMARY KEY ((tenant, day), n)")
    cass.cql(f"INSERT INTO sluice.{table} (tenant, day, n, v) VALUES ('a', 1, 1, 'a11')")
    cass.cql(f"INSERT INTO sluice.{table} (tenant, day, n, v) VALUES ('a', 1, 2, 'a12')")
    cass.cql(f"INSERT INTO sluice.{table} (tenant, day, n, v) VALUES ('b', 1, 1, 'b11')")
    schema = StructType([StructField("tenant", StringType()), StructField("day", LongType())])
    plan, _ = plan_lookup(schema, "cassandra", cass.opts(table), ["tenant", "day"], "inner", ["n", "v"])
    batch = pa.record_batch({"tenant": ["a", "b", "a", "c"], "day": pa.array([1, 1, 2, 1], pa.int64())})
    try:
        out = enrich(plan, batch, None, LookupTally()).to_pydict()
    finally:
        plan.reader.close(clean=True)
    assert sorted(zip(out["tenant"], out["v"], strict=True)) == [("a", "a11"), ("a", "a12"), ("b", "b11")]


def test_a_cluster_that_cannot_be_reached_fails_the_batch_naming_the_table_never_nulls(cass, events):
    """The reader planned against the running node, then pointed at a port nothing listens on (the shared node
    keeps running). Negative control: the same reader on the node's port answers."""
    options = cass.opts(events, **{"lookup.max-retries": "1"})
    plan, _ = plan_lookup(SCHEMA, "cassandra", options, "pk", "left", ["v"])
    assert run(plan, [(2, 0)])["v"] == ["v2-1"]
    reader = copy.copy(plan.reader)
    reader.conn = dataclasses.replace(plan.reader.conn, port=free_port())
    gone = dataclasses.replace(plan, reader=reader)
    with pytest.raises(CassandraError) as failed:
        run(gone, [(2, 0)])
    message = str(failed.value)
    assert f"looking up 1 key(s) in table sluice.{events}" in message, message
    assert "failed after 2 attempt(s) (lookup.max-retries=1)" in message, message


def test_bad_input_is_named_before_any_work(cass, events):
    def refused(options=None, on="pk", schema=SCHEMA, columns=None):
        with pytest.raises(sluice.OptionError) as failed:
            plan_lookup(schema, "cassandra", {**cass.opts(events), **(options or {})}, on, "left", columns)
        return str(failed.value)

    assert "Did you mean 'lookup.max-retries'?" in refused({"lookup.max-retry": "2", "password": "hunter2"})
    assert "hunter2" not in refused({"lookup.max-retry": "2", "password": "hunter2"})
    assert "table 'no_such' does not exist in keyspace 'sluice'" in refused({"table": "no_such"})
    assert f"key column 'event' is not a column of table sluice.{events}" in refused(on="event")
    assert f"looked-up column 'nope' is not a column of table sluice.{events}" in refused(columns=["nope"])
    not_partition = refused(on="ck")
    assert "on=['ck'] is not a key" in not_partition and "by the partition key ['pk']" in not_partition
    assert "missing: ['pk']" in not_partition
    assert "clustering columns ['ck']" in refused(on=["pk", "v"], schema=StructType([*SCHEMA.fields,
                                                                                     StructField("v", StringType())]))
    text_keys = StructType([StructField("pk", StringType())])
    assert "key column 'pk' is string in the DataFrame, but the key pk of table sluice." in refused(schema=text_keys)
