"""sluice.lookup(df, "elasticsearch", ...) on a real node of each engine (conftest.py; the Spark test on OpenSearch
only): by _id through _mget, real-time (a document not yet refreshed is found; the negative control, a terms search,
does not find it), by a field through one terms search (a key with several documents), index.max_result_window
named, bad input named, and keys whose shard is not started failing the batch, never read as missing (a node
killed under a lookup: test_faults.py)."""


import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import sluice
from sluice.connectors.elasticsearch._client import ElasticsearchError
from sluice.metrics._lookups import LookupTally
from sluice.source._lookup_dataframe import plan_lookup
from sluice.source._lookup_join import enrich
from sluice.source._lookup_requests import observe_requests

MAPPING = {"user": {"type": "keyword"}, "name": {"type": "keyword"}, "score": {"type": "long"},
           "at": {"type": "date"}, "bio": {"type": "text"}}
BY_ID = StructType([StructField("_id", StringType()), StructField("event", StringType())])
BY_USER = StructType([StructField("user", StringType()), StructField("event", StringType())])


def run(plan, key, values):
    """One Arrow batch through the workers' code, in this process, without a cache."""
    batch = pa.record_batch({key: pa.array(values, pa.string()), "event": [str(v) for v in values]})
    return enrich(plan, batch, None, LookupTally()).to_pydict()


def new_index(search, refresh="1s", **settings):
    index = search.index_name()
    search.call("PUT", f"/{index}", {"settings": {"number_of_shards": 1, "number_of_replicas": 0,
                                                  "refresh_interval": refresh, **settings},
                                     "mappings": {"properties": MAPPING}})
    return index


@pytest.fixture(scope="module")
def users(search):
    """Documents a (user u1), b and c (both user u2: a non-unique key), searchable."""
    index = new_index(search)
    for doc_id, doc in {"a": {"user": "u1", "name": "ann", "score": 1, "at": "2026-01-01T00:00:00Z"},
                        "b": {"user": "u2", "name": "bo", "score": 2, "at": 1767225600000},
                        "c": {"user": "u2", "name": "bea", "score": 3}}.items():
        search.call("PUT", f"/{index}/_doc/{doc_id}", doc)
    search.call("POST", f"/{index}/_refresh")
    return index


@pytest.mark.spark
@pytest.mark.parametrize("search", ["opensearch"], indirect=True)  # Spark's part is the same for both engines
def test_left_and_inner_give_a_row_per_match_typed_as_the_batch_read_types_them(spark, search, users):
    df = spark.createDataFrame([("a", "1"), ("b", "2"), ("zz", "3"), (None, "4")], "_id string, event string")
    left = sluice.lookup(df, "elasticsearch", search.opts(users), on="_id", columns=["name", "score", "at"])
    read = spark.read.format("elasticsearch").options(**search.opts(users)).load()
    assert left.schema.fields[2:] == [read.schema[name] for name in ("name", "score", "at")]
    rows = sorted((r.event, r.name, r.score, r.at is not None) for r in left.collect())
    assert rows == [("1", "ann", 1, True), ("2", "bo", 2, True), ("3", None, None, False), ("4", None, None, False)]
    by_user = spark.createDataFrame([("u2", "x"), ("u9", "y")], "user string, event string")
    inner = sluice.lookup(by_user, "elasticsearch", search.opts(users), on="user", how="inner", columns=["name"])
    assert sorted((r.event, r.name) for r in inner.collect()) == [("x", "bea"), ("x", "bo")]


@pytest.mark.parametrize("search", ["opensearch"], indirect=True)  # the same requests for both engines
@pytest.mark.parametrize("concurrency", [3, 1])
def test_a_batch_split_into_mgets_has_them_in_flight_together_with_one_mgets_rows(search, users, concurrency):
    """5 distinct ids, 2 an _mget: 3 requests. With 3 allowed, 3 are open at once (each held until 3 are: an event,
    not a timing); the negative control, max-concurrent-requests=1, never has two open. The rows are one _mget's,
    in the batch's order, whatever order the requests complete in."""
    ids = ["a", "zz", "b", "c", "a", "yy"]
    whole, _ = plan_lookup(BY_ID, "elasticsearch", search.opts(users), "_id", "left", ["name"])
    split, _ = plan_lookup(BY_ID, "elasticsearch", search.opts(users, **{"lookup.max-keys-per-request": "2",
                           "lookup.max-concurrent-requests": str(concurrency)}), "_id", "left", ["name"])
    with observe_requests(concurrency if concurrency > 1 else None) as counter:
        rows = run(split, "_id", ids)
        seen = (counter.sent, counter.peak)
    assert seen == (3, concurrency)
    assert rows == run(whole, "_id", ids)
    assert rows["name"] == ["ann", None, "bo", "bea", "ann", None]


@pytest.mark.parametrize("on", ["_id", "user"])
def test_mget_by_id_is_real_time_and_a_terms_search_sees_the_last_refresh(search, on):
    """A document indexed into an index that never refreshes on its own: _mget finds it; the negative control, the
    terms search by a field, does not until the index is refreshed."""
    index = new_index(search, refresh="-1")
    search.call("PUT", f"/{index}/_doc/d1", {"user": "u1", "name": "new"})
    schema = BY_ID if on == "_id" else BY_USER
    plan, _ = plan_lookup(schema, "elasticsearch", search.opts(index), on, "left", ["name"])
    key = "d1" if on == "_id" else "u1"
    assert run(plan, on, [key])["name"] == (["new"] if on == "_id" else [None])
    search.call("POST", f"/{index}/_refresh")
    assert run(plan, on, [key])["name"] == ["new"]


def test_keys_matching_more_documents_than_the_result_window_fail_naming_it(search, users):
    """Negative control: within the window (the default, 10,000) the same keys are answered."""
    small = new_index(search, max_result_window=2)
    for n in range(3):
        search.call("PUT", f"/{small}/_doc/{n}", {"user": "u2", "name": f"n{n}"})
    search.call("POST", f"/{small}/_refresh")
    plan, _ = plan_lookup(BY_USER, "elasticsearch", search.opts(small), "user", "left", ["name"])
    with pytest.raises(ElasticsearchError, match=r"match more than 2 documents, the index's "
                                                 r"index.max_result_window"):
        run(plan, "user", ["u2"])
    plan, _ = plan_lookup(BY_USER, "elasticsearch", search.opts(users), "user", "left", ["name"])
    assert sorted(run(plan, "user", ["u2"])["name"]) == ["bea", "bo"]


def test_bad_input_is_named_before_any_work(search, users):
    def refused(options=None, on="_id", schema=BY_ID, columns=None):
        with pytest.raises(sluice.OptionError) as failed:
            plan_lookup(schema, "elasticsearch", {**search.opts(users), **(options or {})}, on, "left", columns)
        return str(failed.value)

    message = refused({"lookup.max-retry": "1", "password": "hunter2"})
    assert "unknown option 'lookup.max-retry'" in message and "Did you mean 'lookup.max-retries'?" in message
    assert "hunter2" not in message
    assert "index 'no-such-index' does not exist" in refused({"index": "no-such-index"})
    assert f"key column 'event' is not a column of index '{users}'" in refused(on="event")
    assert f"looked-up column 'nope' is not a column of index '{users}'" in refused(columns=["nope"])
    text = StructType([StructField("bio", StringType())])
    assert f"key column 'bio' of index '{users}' is a text field" in refused(on="bio", schema=text)
    long_ids = StructType([StructField("_id", LongType())])
    assert "is read as string: cast it (df.withColumn('_id', df['_id'].cast('string')))" in refused(schema=long_ids)
    both = StructType([*BY_USER.fields, StructField("_id", StringType())])
    assert "takes one key column" in refused(on=["user", "_id"], schema=both)


def test_keys_whose_shard_is_not_started_fail_the_batch_never_nulls(search):
    """An index whose one primary shard no node may hold (index.routing.allocation.require._name matches none), as a
    restarted node's shards are until it has recovered them: its keys fail the batch after the retries, naming what
    the node said, never read as missing. Negative control: the shard allowed a node, the same lookup answers."""
    index = search.index_name()
    search.call("PUT", f"/{index}", {"settings": {"number_of_shards": 1, "number_of_replicas": 0,
                                                  "index.routing.allocation.require._name": "nowhere"},
                                     "mappings": {"properties": MAPPING}}, wait_for_active_shards="0")
    opts = search.opts(index, **{"lookup.max-retries": "0"})
    by_id, _ = plan_lookup(BY_ID, "elasticsearch", opts, "_id", "left", ["name"])
    by_user, _ = plan_lookup(BY_USER, "elasticsearch", opts, "user", "left", ["name"])
    for plan, key in ((by_id, "_id"), (by_user, "user")):
        with pytest.raises(ElasticsearchError) as failed:
            run(plan, key, ["a"])
        assert "looking up 1 key(s) in " in str(failed.value) and f"index '{index}'" in str(failed.value)
    search.call("PUT", f"/{index}/_settings", {"index.routing.allocation.require._name": None})
    search.call("GET", f"/_cluster/health/{index}", wait_for_status="green", timeout="60s")
    assert run(by_id, "_id", ["a"])["name"] == [None] and run(by_user, "user", ["u1"])["name"] == [None]
