"""sluice.lookup(df, "hbase", ...) on the session's HBase: left and inner joins by a composite row key across
regions, a missing key, a gateway killed mid-stream failing the query's next micro-batch after its retries, and bad
input named."""

import dataclasses

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import sluice
from sluice.connectors.hbase._client import HBaseError
from sluice.metrics._lookups import LookupTally
from sluice.source._lookup_dataframe import plan_lookup
from sluice.source._lookup_join import enrich
from sluice.source._lookup_requests import observe_requests
from tests.lookup_faults import Lookup, Outage, a_store_killed_mid_stream

pytestmark = pytest.mark.spark

SCHEMA = "region string, id long, amount double, note string"
KEYS = StructType([StructField("region", StringType()), StructField("id", LongType())])


@pytest.fixture(scope="module")
def orders(spark, hbase):
    """Rows (region, id) written by the connector into a table of three regions ([,eu) [eu,us) [us,)); eu/2 has
    no note cell."""
    table = hbase.table(splits=(b"eu", b"us"))
    rows = [("asia", 1, 1.5, "a1"), ("eu", 1, 2.5, "e1"), ("eu", 2, 3.5, None), ("us", 7, 4.5, "u7")]
    sluice.write(spark.createDataFrame(rows, SCHEMA), "hbase", hbase.opts(table, rowkey="region,id", family="d"))
    return table


def options(hbase, table: str, **more: str) -> dict[str, str]:
    return hbase.opts(table, rowkey="region,id", family="d", **{"schema": SCHEMA, **more})


def batch_read(spark, hbase, table: str, schema: str):
    return spark.read.format("hbase").options(**hbase.opts(table, rowkey="region,id", family="d")).schema(schema).load()


def test_left_and_inner_by_a_composite_row_key_typed_as_the_batch_read_types_them(spark, hbase, orders):
    df = spark.createDataFrame([(1, "asia", "x"), (1, "eu", "y"), (2, "eu", "z"), (7, "us", "w"), (3, "eu", "gone"),
                                (None, "us", "null key")], "id int, region string, event string")
    left = sluice.lookup(df, "hbase", options(hbase, orders), on=["id", "region"])
    assert left.schema.fields[3:] == batch_read(spark, hbase, orders, SCHEMA).schema.fields[2:]
    assert sorted((tuple(r) for r in left.collect()), key=lambda r: r[2]) == [
        (3, "eu", "gone", None, None), (None, "us", "null key", None, None), (7, "us", "w", 4.5, "u7"),
        (1, "asia", "x", 1.5, "a1"), (1, "eu", "y", 2.5, "e1"), (2, "eu", "z", 3.5, None)]
    # eu/2 has no note cell: with only note looked up, its Get finds nothing, as a read of note alone skips it.
    inner = sluice.lookup(df, "hbase", options(hbase, orders), on=["region", "id"], how="inner", columns=["note"])
    assert sorted((r.event, r.note) for r in inner.collect()) == [("w", "u7"), ("x", "a1"), ("y", "e1")]
    notes = batch_read(spark, hbase, orders, "region string, id long, note string").collect()
    assert ("eu", 2) not in {(r.region, r.id) for r in notes} and len(notes) == 3


def run(plan, keys):
    """One Arrow batch through the workers' code, in this process."""
    batch = pa.record_batch({"region": [k[0] for k in keys], "id": pa.array([k[1] for k in keys], pa.int64())})
    try:
        return enrich(plan, batch, None, LookupTally()).to_pydict()
    finally:
        plan.reader.close(clean=True)


@pytest.mark.parametrize("concurrency", [3, 1])
def test_a_batch_split_by_region_has_its_getmultiples_in_flight_together_with_one_calls_rows(hbase, orders,
                                                                                             concurrency):
    """6 distinct keys over the three regions (1, 3 and 2 of them), 2 a call: 4 getMultiples, one region each. With
    3 allowed, 3 are open at once (each held until 3 are: an event, not a timing); the negative control,
    max-concurrent-requests=1, never has two open (nor splits by region: 3 calls). The rows are one call's, in the
    batch's order, whatever order the calls complete in."""
    keys = [("us", 7), ("asia", 1), ("eu", 3), ("eu", 1), ("zz", 9), ("eu", 2), ("us", 7)]
    whole, _ = plan_lookup(KEYS, "hbase", options(hbase, orders), ["region", "id"], "left", ["amount"])
    split, _ = plan_lookup(KEYS, "hbase", options(hbase, orders, **{"lookup.max-keys-per-request": "2",
                           "lookup.max-concurrent-requests": str(concurrency)}), ["region", "id"], "left", ["amount"])
    with observe_requests(concurrency if concurrency > 1 else None) as counter:
        rows = run(split, keys)
        seen = (counter.sent, counter.peak)
    assert seen == ((4, 3) if concurrency == 3 else (3, 1))
    assert rows == run(whole, keys)
    assert rows["amount"] == [4.5, 1.5, None, 2.5, None, 3.5, 4.5]


def test_a_gateway_killed_mid_stream_fails_the_query_after_the_retries_and_one_back_within_them_answers(
        spark, hbase, orders, tmp_path):
    """Two streaming queries answered a micro-batch through the session's gateway, then the gateway is SIGKILLed
    (HBase keeps running): the next micro-batch of the one with lookup.max-retries=1 fails it, naming the table and
    the gateway, writing no nulls. Negative control: the other, with lookup.max-retries=10, meets the same outage,
    the gateway is started again, and it answers the right rows (tests/lookup_faults.py)."""
    server = hbase.server
    lookup = Lookup("hbase", options(hbase, orders), ["region", "id"], "amount", "region string, id long")
    # A key with a 0 byte in a column that is not the key's last has no row key: it matches nothing.
    message = a_store_killed_mid_stream(
        spark, tmp_path, Outage(server.kill_gateway, server.start_gateway, server.host, server.port), lookup,
        [{"region": "us", "id": 7}, {"region": "e\x00u", "id": 1}],
        [{"region": "us", "id": 7}, {"region": "eu", "id": 1}, {"region": "eu", "id": 3}],
        [4.5, None, 4.5, 2.5, None])
    where = f"{server.host}:{server.port}"
    # The keys are in two regions: a getMultiple each, in flight together, the first to fail raised.
    assert (f"key(s) in HBase table {orders} at hbase://{where}/{orders} failed after 2 attempt(s) "
            "(lookup.max-retries=1)") in message, message
    assert f"no answer from the HBase Thrift2 gateway at {where}" in message, message


def test_bad_input_is_named_before_any_work(spark, hbase, orders):
    def refused(more=None, on=("region", "id"), schema=KEYS, columns=None):
        with pytest.raises(sluice.OptionError) as failed:
            plan_lookup(schema, "hbase", {**options(hbase, orders), **(more or {})}, list(on), "left", columns)
        return str(failed.value)

    assert "Did you mean 'lookup.max-retries'?" in refused({"lookup.max-retry": "2"})
    assert "HBase table default:t_none does not exist" in refused({"table": "t_none"})
    assert "schema='id long,' is no list of columns and types" in refused({"schema": "id long,"})
    with_note = StructType([*KEYS.fields, StructField("note", StringType())])
    assert "key column 'note' is not a column of the row key of HBase table" in refused(on=["note"], schema=with_note)
    part = refused(on=["region"])
    assert "on=['region'] is part of the row key" in part and "missing: ['id']" in part, part
    assert "looked-up column 'nope' is not a column of the schema option" in refused(columns=["nope"])
    assert "has no column family ['x']" in refused({"columns": "note=x:n"})
    assert "row key column 'id' is list<" in refused({"schema": "region string, id array<long>"})
    assert "key column 'id' is string in the DataFrame" in refused(
        schema=StructType([StructField("region", StringType()), StructField("id", StringType())]))


def test_a_cell_that_does_not_decode_as_the_schema_types_it_fails_naming_it(hbase, orders):
    """amount was written as a double (8 bytes): read as an int it does not decode, and the task fails."""
    plan, _ = plan_lookup(KEYS, "hbase", options(hbase, orders, schema="region string, id long, amount int"),
                          ["region", "id"], "left", None)
    with pytest.raises(HBaseError) as failed:
        run(plan, [("eu", 1)])
    message = str(failed.value)
    assert f"a row looked up in HBase table {orders}" in message and "column 'amount'" in message, message


def test_repartition_by_region_gives_each_task_the_keys_of_one_region(spark, hbase, orders):
    """With the option, each task's keys lie in one region of the three, and every key is looked up (the session's
    HBase is one region server: its partitions-per-server partitions take a region each). Negative control: without
    it the DataFrame's two partitions each hold keys of several regions."""
    from pyspark.sql.functions import spark_partition_id

    from sluice.source._lookup_dataframe import planned

    # Keys of all three regions in each of the DataFrame's two partitions, as composite (region, id) keys.
    keys = [(i % 5, name) for i, name in enumerate(["asia", "eu", "us", "fr", "zz", "eu", "us", "ch", "a", "v"] * 4)]
    df = spark.createDataFrame(keys, "id int, region string").repartition(2)
    plan, out = plan_lookup(df.schema, "hbase", options(hbase, orders, **{"lookup.repartition-by-region": "true"}),
                            ["id", "region"], "left", ["amount"])
    placement = plan.reader.placement()
    assert placement.regions.starts == (b"", b"eu", b"us") and placement.partitions == 10
    found = {("asia", 1): 1.5, ("eu", 1): 2.5, ("eu", 2): 3.5, ("us", 7): 4.5}

    def regions_per_task(on: bool) -> dict[int, set[int]]:
        plan.reader._placement = placement if on else None
        rows = planned(df, plan, out).withColumn("task", spark_partition_id()).collect()
        assert sorted((r.region, r.id, r.amount) for r in rows) == sorted(
            (region, i, found.get((region, i))) for i, region in keys)
        at = placement.region_of(pa.table({"region": [r.region for r in rows],
                                           "id": pa.array([r.id for r in rows], pa.int64())}))
        tasks: dict[int, set[int]] = {}
        for row, region in zip(rows, at.tolist(), strict=True):
            tasks.setdefault(row.task, set()).add(region)
        return tasks

    placed = regions_per_task(True)
    assert all(len(regions) == 1 for regions in placed.values()), placed
    assert sorted(r for regions in placed.values() for r in regions) == [0, 1, 2], placed
    unplaced = regions_per_task(False)
    assert len(unplaced) == 2 and all(len(regions) > 1 for regions in unplaced.values()), unplaced

    # Several region servers (stood in for by dealing the three regions to two): each task's keys have one server.
    dealt = dataclasses.replace(placement, regions=placement.regions.dealt(("rs-a:1", "rs-b:1")), per_server=1)
    key_table = pa.table({"region": [k[1] for k in keys], "id": pa.array([k[0] for k in keys], pa.int64())})
    servers = [dealt.regions.servers[dealt.regions.server_of[r]] for r in dealt.region_of(key_table)]
    assert [("rs-a:1", "rs-b:1")[p] for p in dealt.assign(key_table).to_pylist()] == servers
    assert set(servers) == {"rs-a:1", "rs-b:1"}
