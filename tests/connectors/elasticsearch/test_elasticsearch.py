"""format("elasticsearch") on a real node of each engine (OpenSearch 2.19 and Elasticsearch 7.17): documents by id from
the DataFrame's columns, the index created with a mapping from the schema, deletes from a changelog column, partial
updates, external versions that make a replay of older data change nothing (and, as the negative control, the same
replay without versions overwrites newer data), and bad options refused before any write. Refused documents:
test_dead_letters.py."""

import datetime as dt
import decimal

import pyarrow as pa
import pytest

import sluice
from tests.faults import replay_first_micro_batch

pytestmark = pytest.mark.spark


def test_documents_by_id_with_a_mapping_from_the_schema(spark, search):
    index = search.index_name()
    df = spark.createDataFrame(
        [(1, "eu", 9.5, decimal.Decimal("12.34"), dt.datetime(2026, 1, 2, 3, 4, 5, 123456), dt.date(2026, 1, 2),
          ["a", "b"], (7, "x")),
         (2, "us", None, None, None, None, [], None)],
        "id long, region string, amount double, price decimal(10,2), at timestamp, day date, tags array<string>, "
        "inner struct<n:int, s:string>")
    sluice.write(df, "elasticsearch", search.opts(index, **{"mapping.id": "id"}))
    properties = search.call("GET", f"/{index}/_mapping")[index]["mappings"]["properties"]
    assert {k: v["type"] for k, v in properties.items() if "type" in v} == {
        "id": "long", "region": "keyword", "amount": "double", "price": "double", "at": "date_nanos",
        "day": "date", "tags": "keyword"}
    assert properties["inner"]["properties"] == {"n": {"type": "integer"}, "s": {"type": "keyword"}}
    got = search.docs(index)
    assert got["1"] == {"id": 1, "region": "eu", "amount": 9.5, "price": 12.34, "at": "2026-01-02T03:04:05.123456Z",
                        "day": "2026-01-02", "tags": ["a", "b"], "inner": {"n": 7, "s": "x"}}
    assert got["2"]["region"] == "us" and set(got) == {"1", "2"}
    assert sluice.last_write_summary("elasticsearch")["records"] == 2


def test_composite_ids_routing_and_excluded_columns(spark, search):
    index = search.index_name()
    df = spark.createDataFrame([("eu", 1, "r1", "secret", "a"), ("eu", 2, "r2", "secret", "b")],
                               "region string, n int, shard string, internal string, v string")
    sluice.write(df, "elasticsearch", search.opts(index, **{
        "mapping.id": "region,n", "mapping.routing": "shard", "mapping.exclude": "internal"}))
    got = search.call("GET", f"/{index}/_doc/%5B%22eu%22,1%5D", routing="r1")
    assert got["_source"] == {"region": "eu", "n": 1, "v": "a"} and got["_routing"] == "r1"


def test_many_changes_of_one_id_end_at_the_last_and_deletes_remove(spark, search):
    index = search.index_name()
    # 200 ids, each changed 20 times in order (version 0..19); ids divisible by 10 are deleted at the end. Small
    # bulks, 8 at once per task: one id's changes would overtake each other if the sink did not keep them in order
    # (with sink.mode=unordered this test fails).
    rows = [(i, v, None) for v in range(20) for i in range(200)] + [(i, 20, "d") for i in range(0, 200, 10)]
    df = spark.createDataFrame(rows, "id int, version int, op string").coalesce(1)
    sluice.write(df, "elasticsearch", search.opts(index, **{
        "mapping.id": "id", "upsert.op-column": "op", "sink.batch.max-size": "10", "connections-per-task": "8"}))
    got = search.docs(index)
    assert {int(k): d["version"] for k, d in got.items()} == {i: 19 for i in range(200) if i % 10}


def test_update_merges_fields_and_upsert_creates_missing_documents(spark, search):
    index = search.index_name()
    sluice.write(spark.createDataFrame([(1, "a", 10)], "id int, name string, qty int"), "elasticsearch",
                 search.opts(index, **{"mapping.id": "id"}))
    sluice.write(spark.createDataFrame([(1, 11), (2, 20)], "id int, qty int"), "elasticsearch",
                 search.opts(index, **{"mapping.id": "id", "write.operation": "upsert"}))
    assert search.docs(index) == {"1": {"id": 1, "name": "a", "qty": 11}, "2": {"id": 2, "qty": 20}}
    with pytest.raises(Exception, match=r"document '3' of index .*document_missing_exception"):
        sluice.write(spark.createDataFrame([(3, 30)], "id int, qty int"), "elasticsearch",
                     search.opts(index, **{"mapping.id": "id", "write.operation": "update"}))


def test_a_replay_of_older_versions_changes_nothing_and_without_versions_it_overwrites(spark, search):
    newer = spark.createDataFrame([(i, 2, "new") for i in range(100)], "id int, v long, state string")
    older = spark.createDataFrame([(i, 1, "old") for i in range(100)], "id int, v long, state string")
    versioned, unversioned = search.index_name(), search.index_name()
    for df in (newer, older):  # the older write arrives late: a replay
        sluice.write(df, "elasticsearch", search.opts(versioned, **{"mapping.id": "id", "mapping.version": "v"}))
    assert {d["state"] for d in search.docs(versioned).values()} == {"new"}
    assert search.call("GET", f"/{versioned}/_doc/7")["_version"] == 2
    # The negative control: the same replay without external versions overwrites the newer documents.
    for df in (newer, older):
        sluice.write(df, "elasticsearch", search.opts(unversioned, **{"mapping.id": "id"}))
    assert {d["state"] for d in search.docs(unversioned).values()} == {"old"}


def test_a_replayed_micro_batch_never_overwrites_a_later_one(spark, search, tmp_path):
    """A micro-batch whose write reached the index but not the checkpoint's commit log (the driver was killed) is
    replayed from a copy of that checkpoint after a later batch changed the same documents. With
    write.version=micro-batch the replay carries batch 0's versions and loses to batch 1's; without versions (the
    negative control) the replay overwrites batch 1."""

    def replay(versions: str) -> set[str]:
        index = search.index_name()

        def batch(n: int) -> pa.Table:
            return pa.table({"id": pa.array(range(5), pa.int32()), "v": [f"batch {n}"] * 5})

        after_batch_1, replayed = replay_first_micro_batch(
            spark, tmp_path / versions, "id int, v string", batch, "elasticsearch",
            search.opts(index, **{"mapping.id": "id", "write.version": versions, "write.replay-guard": "false"}),
            lambda: {d["v"] for d in search.docs(index).values()})
        assert after_batch_1 == {"batch 1"}
        return replayed

    assert replay("micro-batch") == {"batch 1"}
    assert replay("none") == {"batch 0"}


def test_a_replay_after_the_index_forgot_a_delete_brings_nothing_back(spark, search, tmp_path):
    """The same replay of micro-batch 0 after micro-batch 1 deleted half its documents, into an index that keeps a
    delete's version for no time (index.gc_deletes=0s, and refreshed: the default 60 s only delays this). The
    replay guard's marker says micro-batch 1 was committed, so the replay writes nothing; without the guard (the
    negative control) the deleted documents come back, external versions and all."""

    def replay(guard: str) -> tuple[set[int], set[int]]:
        index = search.index_name()
        search.call("PUT", f"/{index}", {"settings": {"index.gc_deletes": "0s", "number_of_replicas": 0}})

        def batch(n: int) -> pa.Table:
            ids = range(10) if n == 0 else range(0, 10, 2)
            return pa.table({"id": pa.array(ids, pa.int32()), "op": ["u" if n == 0 else "d"] * len(ids)})

        def stored() -> set[int]:
            search.call("POST", f"/{index}/_flush")  # with the refresh in docs(): the deletes' versions pruned
            return {int(i) for i in search.docs(index)}

        return replay_first_micro_batch(
            spark, tmp_path / guard, "id int, op string", batch, "elasticsearch",
            search.opts(index, **{"mapping.id": "id", "write.version": "micro-batch", "upsert.op-column": "op",
                                  "write.replay-guard": guard}), stored)

    odd = set(range(1, 10, 2))
    assert replay("true") == (odd, odd)
    summary = sluice.last_write_summary("elasticsearch")
    assert summary["replays_skipped"] >= 1 and summary["records"] == 0, summary
    assert replay("false") == (odd, set(range(10)))


def test_write_refresh_true_makes_the_write_searchable_at_commit(spark, search):
    index = search.index_name()
    search.call("PUT", f"/{index}", {"settings": {"refresh_interval": -1}})  # the index never refreshes itself
    df = spark.range(0, 50, 1, 2)
    sluice.write(df, "elasticsearch", search.opts(index, **{"mapping.id": "id"}))
    assert search.call("GET", f"/{index}/_count")["count"] == 0  # the negative control: written, not searchable
    sluice.write(df, "elasticsearch", search.opts(index, **{"mapping.id": "id", "write.refresh": "true"}))
    assert search.call("GET", f"/{index}/_count")["count"] == 50


def test_bad_input_is_refused_before_any_write(spark, search):
    index = search.index_name()
    df = spark.createDataFrame([(1, "a"), (None, "b")], "id int, v string")
    with pytest.raises(Exception, match=r"mapping.id column 'id' is null in row \d+ of this task"):
        sluice.write(df, "elasticsearch", search.opts(index, **{"mapping.id": "id"}))
    with pytest.raises(Exception, match=r"index '.*' does not exist \(index.create=never\)"):
        sluice.write(df, "elasticsearch", search.opts(search.index_name(), **{"index.create": "never"}))
    with pytest.raises(Exception, match=r"write.operation=update changes documents by id: set mapping.id"):
        sluice.write(df, "elasticsearch", search.opts(index, **{"write.operation": "update"}))
    with pytest.raises(Exception, match=r"cannot carry external versions"):
        sluice.write(df, "elasticsearch", search.opts(index, **{
            "mapping.id": "id", "write.operation": "upsert", "write.version": "micro-batch"}))
    with pytest.raises(Exception, match=r"mapping\.idd.*Did you mean .mapping\.id."):
        sluice.write(df, "elasticsearch", search.opts(index, **{"mapping.idd": "id"}))
    strict = search.index_name()
    search.call("PUT", f"/{strict}", {"mappings": {"dynamic": "strict", "properties": {"id": {"type": "long"}}}})
    with pytest.raises(Exception, match=r"strict mapping without field\(s\) \['v'\]"):
        sluice.write(df, "elasticsearch", search.opts(strict, **{"mapping.id": "id"}))


def test_reads_slice_a_point_in_time_prune_columns_and_push_exact_filters(spark, search):
    index = search.index_name()
    search.call("PUT", f"/{index}", {"settings": {"number_of_shards": 3, "number_of_replicas": 0}, "mappings": {
        "properties": {"id": {"type": "long"}, "region": {"type": "keyword"}, "title": {"type": "text"},
                       "at": {"type": "date_nanos"}, "tags": {"type": "keyword"},
                       "inner": {"properties": {"n": {"type": "integer"}}}}}})
    df = spark.range(0, 1000, 1, 2).selectExpr(
        "id", "IF(id % 4 = 0, 'eu', 'us') AS region", "concat('spark and search ', id) AS title",
        "timestamp_micros(1767225600000000 + id) AS at", "array('a', cast(id % 3 AS string)) AS tags",
        "named_struct('n', CAST(id AS INT)) AS inner")
    sluice.write(df, "elasticsearch", search.opts(index, **{"mapping.id": "id"}))
    search.call("POST", f"/{index}/_refresh")
    read = spark.read.format("elasticsearch").options(**search.opts(index, **{
        "read.array-columns": "tags", "read.page-size": "97", "read.metadata": "true", "pushdown": "true"})).load()
    assert read.rdd.getNumPartitions() == 3  # one slice per primary shard
    want = {r.id: r.asDict(recursive=True) for r in df.selectExpr("CAST(id AS STRING) AS _id", "*").collect()}
    assert {r.id: r.asDict(recursive=True) for r in read.collect()} == want

    def plan_filters(frame) -> str:
        """The Filter nodes of the physical plan: the predicates Spark evaluates itself."""
        plan = frame._jdf.queryExecution().executedPlan().toString()
        return "\n".join(line for line in plan.splitlines() if " Filter " in f" {line.strip(' +-*():0123456789')} ")

    eu = read.where("region = 'eu' AND id >= 500").select("id")
    assert sorted(r.id for r in eu.collect()) == [i for i in range(500, 1000) if i % 4 == 0]
    assert "Filter" not in plan_filters(eu)  # the engine filtered: keyword and long fields are exact
    titled = read.where("title = 'spark and search 7'").select("id")
    assert [r.id for r in titled.collect()] == [7]
    assert "Filter" in plan_filters(titled)  # text is analyzed: Spark compares it
    unpushed = spark.read.format("elasticsearch").options(**search.opts(index, **{"read.array-columns": "tags"})) \
        .load().where("region = 'eu' AND id >= 500").select("id")
    assert sorted(r.id for r in unpushed.collect()) == [i for i in range(500, 1000) if i % 4 == 0]
    assert "Filter" in plan_filters(unpushed)  # pushdown off (the default): Spark filters what it read
    queried = spark.read.format("elasticsearch").options(**search.opts(index, **{
        "read.query": '{"match": {"title": "17"}}', "read.array-columns": "tags"})).load().select("id")
    assert [r.id for r in queried.collect()] == [17]


def test_dates_in_any_format_objects_and_nested_read_back_and_several_values_need_array_columns(spark, search):
    index = search.index_name()
    search.call("PUT", f"/{index}", {"mappings": {"properties": {
        "day": {"type": "date", "format": "yyyy/MM/dd HH:mm||epoch_millis"}, "n": {"type": "long"},
        "owner": {"properties": {"name": {"type": "keyword"}}},
        "items": {"type": "nested", "properties": {"sku": {"type": "keyword"}, "qty": {"type": "integer"}}}}}})
    search.call("PUT", f"/{index}/_doc/1", {"day": "2026/01/02 03:04", "n": 1, "owner": {"name": "ann"},
                                            "items": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 1}]})
    search.call("PUT", f"/{index}/_doc/2", {"day": 1767225600000, "n": [2, 3], "items": {"sku": "c", "qty": 5}},
                refresh="true")
    read = spark.read.format("elasticsearch").options(**search.opts(index, **{"read.array-columns": "n"})).load()
    assert read.schema["items"].dataType.simpleString() == "array<struct<qty:int,sku:string>>"
    got = {r.n[0]: (r.day.astimezone(dt.UTC), r.owner and r.owner.name, [(i.sku, i.qty) for i in r.items])
           for r in read.collect()}
    assert got == {1: (dt.datetime(2026, 1, 2, 3, 4, tzinfo=dt.UTC), "ann", [("a", 2), ("b", 1)]),
                   2: (dt.datetime(2026, 1, 1, tzinfo=dt.UTC), None, [("c", 5)])}
    with pytest.raises(Exception, match=r"field 'n' holds several values in a document; read it as an array with "
                                        r"read.array-columns=n"):
        spark.read.format("elasticsearch").options(**search.opts(index)).load().collect()
