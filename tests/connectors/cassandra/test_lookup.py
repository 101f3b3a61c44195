"""sluice.lookup(df, "cassandra", ...) on the package's Cassandra: left and inner joins, a missing key, a partition
of several rows and a clustering prefix, a composite partition key, the statements' routing and consistency, the
keys of a one-column partition key read by an IN per replica's group of them, bad input named, and the shuffle by
replica (lookup.repartition-by-replica). A node killed under a lookup: test_faults.py."""


import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

import sluice
from sluice.connectors.cassandra._types import CQLType
from sluice.metrics._lookups import LookupTally
from sluice.source._lookup_dataframe import plan_lookup
from sluice.source._lookup_join import enrich

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


def test_keys_of_a_one_column_partition_key_are_read_by_an_in_per_replica_group_routed_to_that_replica(cass):
    """150 distinct keys of a table whose partition key is one column (75 found, two clustering rows each), at most
    50 keys a SELECT, 4 in flight, the package's one node's ring dealt to three named hosts (range i to host i % 3):
    each statement is a `pk IN ?` of one host's keys, its routing key one of them (so the token-aware policy sends it
    to that host), ceil(keys of the host / 50) statements a host, every key in one; the IN's 150 rows come in pages
    of 7 and every one is there. Negative control: lookup.max-keys-per-request=1, a SELECT per key: 150 statements,
    the same rows. Statements are counted by the driver's request init listener on the lookup's session."""
    from dataclasses import replace

    from cassandra.concurrent import execute_concurrent_with_args
    from cassandra.murmur3 import murmur3

    from sluice.connectors.cassandra._client import session_for
    from sluice.connectors.cassandra._tokens import TokenRing, partition_tokens, read_ring

    table = cass.table("pk int, ck int, v text, PRIMARY KEY ((pk), ck)")
    insert = cass.session.prepare(f"INSERT INTO sluice.{table} (pk, ck, v) VALUES (?, ?, ?)")
    execute_concurrent_with_args(cass.session, insert, [(p, c, f"{p}-{c}") for p in range(150) for c in range(2)])
    keys = [(p, 0) for p in range(0, 300, 2)]  # every even pk: 75 found (two rows each), 75 missing
    expected = sorted(f"{p}-{c}" for p in range(0, 150, 2) for c in range(2))

    def statements(per_request: str) -> tuple[list, TokenRing]:
        options = cass.opts(table, **{"lookup.max-concurrent-requests": "4",
                                      "lookup.max-keys-per-request": per_request})
        plan, _ = plan_lookup(SCHEMA, "cassandra", options, "pk", "inner", ["v"])
        ring = read_ring(plan.reader.conn)
        dealt = plan.reader._ring = replace(ring, owners=tuple(i % 3 for i in range(len(ring.tokens))),
                                            hosts=("node-a", "node-b", "node-c"))
        plan.reader.fetch_size = 7
        sent: list = []

        def listener(future) -> None:
            sent.append(future.query)

        session = session_for(plan.reader.conn)
        session.add_request_init_listener(listener)
        try:
            assert sorted(run(plan, keys)["v"]) == expected
        finally:
            session.remove_request_init_listener(listener)
        return sent, dealt

    grouped, ring = statements("50")
    assert len(grouped) <= 6, len(grouped)
    host_of = {}
    for statement in grouped:
        in_keys = statement.raw_values[0]
        tokens = partition_tokens(pa.table({"pk": pa.array(in_keys, pa.int32())}), ("pk",), {"pk": CQLType("int")})
        hosts = {ring.hosts[i] for i in ring.owner_of(tokens)}
        routed_to = ring.hosts[ring.owner_of(np.array([murmur3(statement.routing_key)]))[0]]
        assert len(in_keys) <= 50 and hosts == {routed_to}, (in_keys, hosts, routed_to)
        host_of.update(dict.fromkeys(in_keys, routed_to))
    assert sorted(host_of) == [k for k, _ in keys] and sum(len(s.raw_values[0]) for s in grouped) == len(keys)
    per_host = [list(host_of.values()).count(name) for name in ring.hosts]
    assert len(grouped) == sum(-(-n // 50) for n in per_host), per_host
    assert len(statements("1")[0]) == len(keys)


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
    # lookup.repartition-by-replica's token of a composite key is the one the driver routes the SELECT by.
    from cassandra.murmur3 import murmur3

    from sluice.connectors.cassandra._table import describe
    from sluice.connectors.cassandra._tokens import partition_tokens

    select = cass.session.prepare(f"SELECT v FROM sluice.{table} WHERE tenant = ? AND day = ?")
    keys = pa.table({"tenant": ["a", "b", "é"], "day": pa.array([1, -5, 2 ** 31 - 1], pa.int32())})
    kinds = describe(plan.reader.conn).columns
    assert partition_tokens(keys, ("tenant", "day"), kinds).tolist() == \
        [murmur3(select.bind(key).routing_key) for key in zip(*keys.to_pydict().values(), strict=True)]


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


def test_tokens_are_computed_in_bulk_as_the_driver_routes_each_key():
    """Murmur3 over keys of every tail and block length, and int, bigint and text keys serialized in Arrow, against
    the driver's own `murmur3` of the bytes it would send as the routing key."""
    import random
    import struct

    import numpy as np
    from cassandra.murmur3 import murmur3

    from sluice.connectors.cassandra._tokens import murmur3_tokens, partition_tokens
    from sluice.connectors.cassandra._types import CQLType

    pick = random.Random(7)
    for length in (0, 1, 7, 8, 9, 15, 16, 17, 33):
        keys = [bytes(pick.randrange(256) for _ in range(length)) for _ in range(50)]
        matrix = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), length)
        assert murmur3_tokens(matrix).tolist() == [murmur3(k) for k in keys], length
    longs = [pick.randrange(-2 ** 63, 2 ** 63) for _ in range(50)] + [-2 ** 63, -1, 0, 2 ** 63 - 1]
    ints = [pick.randrange(-2 ** 31, 2 ** 31) for _ in range(50)]
    texts = ["", "é", "x" * 40, *(str(pick.random()) for _ in range(20))]
    for values, arrow, kind, packed in ((longs, pa.int64(), "bigint", lambda v: struct.pack(">q", v)),
                                        (ints, pa.int32(), "int", lambda v: struct.pack(">i", v)),
                                        (texts, pa.string(), "text", str.encode)):
        keys = pa.table({"k": pa.array(values, arrow)})
        got = partition_tokens(keys, ("k",), {"k": CQLType(kind)}).tolist()
        assert got == [murmur3(packed(v)) for v in values], kind


def test_repartition_by_replica_gives_each_task_the_keys_of_one_node(spark, cass):
    """Each task's keys all have one first replica, and every key is looked up. The package's node is one node
    holding every range, so the ring the driver read is handed on with its ranges dealt to three named hosts in
    turn (range i to host i % 3); the lookups still go to the real node. Negative control: without the option the
    DataFrame's two partitions each hold keys of all three hosts."""
    from dataclasses import replace

    from pyspark.sql.functions import spark_partition_id

    from sluice.source._lookup_dataframe import planned

    table = cass.table("pk bigint PRIMARY KEY, v text")
    insert = cass.session.prepare(f"INSERT INTO sluice.{table} (pk, v) VALUES (?, ?)")
    for pk in range(0, 200):
        cass.session.execute(insert, (pk, f"v{pk}"))
    df = spark.range(0, 300, numPartitions=2).withColumnRenamed("id", "pk")
    options = cass.opts(table, **{"lookup.repartition-by-replica": "true", "lookup.partitions-per-host": "2"})
    plan, out = plan_lookup(df.schema, "cassandra", options, "pk", "left", ["v"])
    read = plan.reader.placement()
    assert set(read.ring.owners) == {0} and len(read.ring.hosts) == 1 and len(read.ring.tokens) > 3
    dealt = replace(read, ring=replace(read.ring, owners=tuple(i % 3 for i in range(len(read.ring.tokens))),
                                       hosts=("node-a", "node-b", "node-c")))

    def hosts_per_task(reader_placement):
        plan.reader._placement = reader_placement
        rows = planned(df, plan, out).withColumn("task", spark_partition_id()).collect()
        assert sorted((r.pk, r.v) for r in rows) == [(pk, f"v{pk}" if pk < 200 else None) for pk in range(300)]
        keys = pa.table({"pk": pa.array([r.pk for r in rows], pa.int64())})
        tasks: dict[int, set[str]] = {}
        for row, host in zip(rows, dealt.host_of(keys), strict=True):
            tasks.setdefault(row.task, set()).add(host)
        return tasks

    placed = hosts_per_task(dealt)
    assert len(placed) == 6 and all(len(hosts) == 1 for hosts in placed.values()), placed
    assert set().union(*placed.values()) == {"node-a", "node-b", "node-c"}
    unplaced = hosts_per_task(None)
    assert len(unplaced) == 2 and all(len(hosts) == 3 for hosts in unplaced.values()), unplaced
