"""sluice.lookup(df, "tablestore", ...) on real Delta tables with a SQLite MetaService: left and inner joins, a
missing key, lookup.version against the latest barrier, each task's own latest barrier, data files pruned by their
statistics, a table in an S3 bucket, and bad input named."""

import pickle
import re
import uuid

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import sluice
from sluice.meta import MetaService
from sluice.metrics._lookups import LookupTally
from sluice.source._lookup_dataframe import plan_lookup
from sluice.source._lookup_join import enrich
from sluice.tablestore import StoreTable

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    where = tmp_path_factory.mktemp("lookup")
    return {"warehouse": str(where / "wh"), "meta": str(where / "meta.db")}


@pytest.fixture(scope="module")
def users(spark, store):
    """An upsert table: version 1 holds ids 1 and 2; version 2 renames id 1."""
    sluice.write(spark.createDataFrame([(1, "old"), (2, "two")], "id long, name string").coalesce(1), "tablestore",
                 {"table": "users", "primary-key": "id", **store})
    sluice.write(spark.createDataFrame([(1, "new")], "id long, name string").coalesce(1), "tablestore",
                 {"table": "users", **store})
    return "users"


SCHEMA = StructType([StructField("id", LongType()), StructField("event", StringType())])


def run(plan, ids):
    """One Arrow batch through the workers' code, in this process."""
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "event": [str(i) for i in ids]})
    return enrich(plan, batch, None, LookupTally()).to_pydict()


def test_left_and_inner_read_the_latest_barrier_typed_as_the_batch_read_types_them(spark, store, users):
    df = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c"), (None, "d")], "id int, event string")
    left = sluice.lookup(df, "tablestore", {"table": users, **store}, on="id")
    read = spark.read.format("tablestore").option("table", users).options(**store).load()
    assert left.schema.fields[2:] == [f for f in read.schema.fields if f.name != "id"]
    assert sorted((r.event, r.name) for r in left.collect()) == [("a", "new"), ("b", "two"), ("c", None),
                                                                  ("d", None)]
    inner = sluice.lookup(df, "tablestore", {"table": users, **store}, on="id", how="inner")
    assert sorted((r.event, r.name) for r in inner.collect()) == [("a", "new"), ("b", "two")]


def test_lookup_version_reads_that_version_and_without_it_the_latest_barrier(store, users):
    (_, first), (_, last) = MetaService(store["meta"]).barriers(users)
    named, _ = plan_lookup(SCHEMA, "tablestore", {"table": users, "lookup.version": str(first), **store}, "id",
                           "left", None)
    assert run(named, [1, 2])["name"] == ["old", "two"]
    latest, _ = plan_lookup(SCHEMA, "tablestore", {"table": users, **store}, "id", "left", None)
    assert run(latest, [1, 2])["name"] == ["new", "two"]  # negative control: no version, the latest barrier's
    assert latest.reader.task_version() == last


def test_each_task_reads_the_latest_barrier_when_it_starts(spark, store):
    """A lookup planned before a later write: a task started after it (the reader as Spark ships it to a task)
    sees the new barrier; one task keeps the version it started with."""
    table = f"t_{uuid.uuid4().hex[:8]}"
    opts = {"table": table, "primary-key": "id", **store}
    sluice.write(spark.createDataFrame([(1, "a")], "id long, name string"), "tablestore", opts)
    plan, _ = plan_lookup(SCHEMA, "tablestore", {"table": table, **store}, "id", "left", ["name"])
    task = pickle.loads(pickle.dumps(plan))
    assert run(task, [1])["name"] == ["a"]
    sluice.write(spark.createDataFrame([(1, "b")], "id long, name string"), "tablestore", opts)
    assert run(task, [1])["name"] == ["a"]
    assert run(pickle.loads(pickle.dumps(plan)), [1])["name"] == ["b"]


def test_only_the_files_whose_statistics_can_hold_a_key_are_opened(spark, store):
    """Two files, ids 0-9 and 100-109; the second is deleted from disk. Keys of the first are read without it;
    negative control: a key inside the second's range needs the missing file and fails."""
    table = f"t_{uuid.uuid4().hex[:8]}"
    for start in (0, 100):
        sluice.write(spark.range(start, start + 10, 1, 1).selectExpr("id", "concat('n', id) AS name"), "tablestore",
                     {"table": table, **store})
    dt = StoreTable(table, store["warehouse"]).delta()
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    second = next(a["path"] for a in actions if a["min.id"] == 100)
    (StoreTable(table, store["warehouse"]).root / second).unlink()
    plan, _ = plan_lookup(SCHEMA, "tablestore", {"table": table, **store}, "id", "left", ["name"])
    assert run(plan, [3, 50, 200])["name"] == ["n3", None, None]
    with pytest.raises(FileNotFoundError, match=re.escape(second.rsplit("/", 1)[1])):
        run(plan, [3, 105])


def test_files_without_bounds_are_read(spark, store):
    """A list column leaves appended files with their row counts alone (_stats.py): every file is read."""
    table = f"t_{uuid.uuid4().hex[:8]}"
    sluice.write(spark.createDataFrame([(1, "one", [1]), (2, "two", [])], "id long, name string, tags array<int>"),
                 "tablestore", {"table": table, **store})
    actions = pa.table(StoreTable(table, store["warehouse"]).delta().get_add_actions(flatten=True)).to_pylist()
    assert all(a["min.id"] is None for a in actions)
    plan, _ = plan_lookup(SCHEMA, "tablestore", {"table": table, **store}, "id", "left", ["name"])
    assert run(plan, [2, 3])["name"] == ["two", None]


def test_a_table_in_an_s3_bucket_is_looked_up_through_the_storage_options(spark, s3, tmp_path):
    store = {"warehouse": s3.uri(f"wh-{uuid.uuid4().hex[:8]}"), "meta": str(tmp_path / "meta.db"), **s3.storage}
    sluice.write(spark.createDataFrame([(1, "one"), (2, "two")], "id long, name string"), "tablestore",
                 {"table": "remote", **store})
    plan, _ = plan_lookup(SCHEMA, "tablestore", {"table": "remote", **store}, "id", "left", None)
    assert run(pickle.loads(pickle.dumps(plan)), [2, 3])["name"] == ["two", None]


def test_bad_input_is_named_before_any_work(store, users, tmp_path):
    def refused(options=None, on="id", schema=SCHEMA, columns=None):
        with pytest.raises(sluice.OptionError) as failed:
            plan_lookup(schema, "tablestore", {"table": users, **store, **(options or {})}, on, "left", columns)
        return str(failed.value)

    assert "Did you mean 'lookup.version'?" in refused({"lookup.versoin": "1"})
    assert "key column 'event' is not a column of table 'users' (version 2)" in refused(on="event")
    assert "looked-up column 'nope' is not a column of table 'users'" in refused(columns=["nope"])
    text_keys = StructType([StructField("id", StringType())])
    assert "key column 'id' is string in the DataFrame, but the key id of table 'users'" in refused(schema=text_keys)
    no_barrier = refused({"meta": str(tmp_path / "other.db")})
    assert "table 'users' has no completed barrier in the MetaService" in no_barrier
    assert "Set lookup.version" in no_barrier
    with pytest.raises(sluice.SluiceError, match="table 'no_such' does not exist in"):
        plan_lookup(SCHEMA, "tablestore", {"table": "no_such", **store}, "id", "left", None)
    with pytest.raises(sluice.SluiceError, match="table 'users' has no version 9: its latest is 2"):
        plan_lookup(SCHEMA, "tablestore", {"table": users, "lookup.version": "9", **store}, "id", "left", None)
