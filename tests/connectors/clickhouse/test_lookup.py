"""sluice.lookup(df, "clickhouse", ...) on the ClickHouse test server: left and inner joins typed as the batch read
types them, a non-unique key, a composite key of quoted strings, FINAL on a ReplacingMergeTree (and without it, the
negative control), bad input named, and a server killed mid-stream failing the query's next micro-batch after its
retries."""

import datetime as dt
from urllib.parse import quote

import pyarrow as pa
import pytest
from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType

import sluice
from sluice.connectors.clickhouse._lookup import URL_BUDGET, _chunks, _elements
from sluice.metrics._lookups import LookupTally
from sluice.source._lookup_dataframe import plan_lookup
from sluice.source._lookup_join import enrich
from sluice.source._lookup_requests import observe_requests
from tests.clickhouse_chdb import clickhouse_server
from tests.lookup_faults import Lookup, Outage, a_store_killed_mid_stream

SCHEMA = StructType([StructField("id", LongType()), StructField("event", StringType())])


def run(plan, ids):
    """One Arrow batch through the workers' code, in this process, without a cache."""
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "event": [str(i) for i in ids]})
    return enrich(plan, batch, None, LookupTally()).to_pydict()


@pytest.fixture(scope="module")
def users(ch):
    """id 1: one row; id 2: two rows (a MergeTree key is not unique); id 3: none."""
    table = ch.table("id UInt64, name String, score Decimal(5, 2), at DateTime, tags Array(UInt32)")
    ch.sql(f"INSERT INTO {table} VALUES (1, 'ann', 1.5, '2026-01-01 00:00:00', [1, 2]), "
           "(2, 'bo', 2, '2026-01-02 00:00:00', []), (2, 'bea', 3, '2026-01-03 00:00:00', [3])")
    return table


@pytest.mark.spark
def test_left_and_inner_give_a_row_per_match_typed_as_the_batch_read_types_them(spark, ch, users):
    df = spark.createDataFrame([(1, "a"), (1, "b"), (2, "c"), (3, "d"), (None, "e"), (-1, "f")],
                               "id long, event string")
    left = sluice.lookup(df, "clickhouse", ch.opts(users), on="id")
    read = spark.read.format("clickhouse").options(**ch.opts(users)).load()
    assert left.schema.fields[2:] == [f for f in read.schema.fields if f.name != "id"]
    rows = sorted((r.event, r.name, r.tags) for r in left.collect())
    assert rows == [("a", "ann", [1, 2]), ("b", "ann", [1, 2]), ("c", "bea", [3]), ("c", "bo", []),
                    ("d", None, None), ("e", None, None), ("f", None, None)]
    inner = sluice.lookup(df, "clickhouse", ch.opts(users), on="id", how="inner", columns=["name"])
    assert sorted((r.event, r.name) for r in inner.collect()) == [("a", "ann"), ("b", "ann"), ("c", "bea"),
                                                                   ("c", "bo")]


def test_a_composite_key_of_quoted_strings_is_sent_as_typed_parameters(ch):
    """Quotes and backslashes in a key reach the server as values, not SQL; an integer out of the column's range
    (UInt8) matches nothing instead of failing the query."""
    table = ch.table("tenant String, id UInt8, v String", "MergeTree() ORDER BY (tenant, id)")
    ch.sql(f"INSERT INTO {table} VALUES ('o''brien', 1, 'quote'), ('back\\\\slash', 1, 'backslash'), ('a', 2, 'a2')")
    schema = StructType([StructField("tenant", StringType()), StructField("id", LongType())])
    plan, out = plan_lookup(schema, "clickhouse", ch.opts(table), ["tenant", "id"], "left", None)
    batch = pa.record_batch({"tenant": ["o'brien", "back\\slash", "a", "a", "') OR 1=1 --"],
                             "id": pa.array([1, 1, 2, 258, 1], pa.int64())})
    assert enrich(plan, batch, None, LookupTally()).column("v").to_pylist() == ["quote", "backslash", "a2", None, None]
    assert out.fieldNames() == ["tenant", "id", "v"]


def test_a_date_before_the_first_day_a_date_column_holds_matches_nothing(ch):
    """The server would clamp 1900-01-02 into a Date parameter as 1970-01-01 and match that day's row: such a key
    is not sent."""
    table = ch.table("day Date, v String", "MergeTree() ORDER BY day")
    ch.sql(f"INSERT INTO {table} VALUES ('1970-01-01', 'epoch'), ('2149-06-06', 'last')")
    schema = StructType([StructField("day", DateType())])
    plan, _ = plan_lookup(schema, "clickhouse", ch.opts(table), "day", "left", None)
    days = pa.array([dt.date(1900, 1, 2), dt.date(1970, 1, 1), dt.date(2149, 6, 6), dt.date(2200, 1, 1)])
    found = enrich(plan, pa.record_batch({"day": days}), None, LookupTally()).column("v").to_pylist()
    assert found == [None, "epoch", "last", None]


@pytest.mark.parametrize("final", ["default", "false"])
def test_a_replacing_table_is_read_with_final_so_a_key_gives_its_last_row(ch, final):
    """Both versions of key 1 sit unmerged in one part (optimize_on_insert=0, and a lone part is never merged):
    FINAL (the default for a ReplacingMergeTree) gives the newest; the negative control, final=false, both."""
    table = ch.table("id UInt64, ver UInt32, name String", "ReplacingMergeTree(ver) ORDER BY id")
    ch.sql(f"INSERT INTO {table} SETTINGS optimize_on_insert = 0 VALUES (1, 1, 'old'), (1, 2, 'new'), (2, 1, 'two')")
    options = ch.opts(table) if final == "default" else ch.opts(table, final="false")
    plan, _ = plan_lookup(SCHEMA, "clickhouse", options, "id", "left", ["name"])
    names = sorted(run(plan, [1])["name"])
    assert names == (["new"] if final == "default" else ["new", "old"])


@pytest.mark.parametrize("concurrency", [3, 1])
def test_a_batch_split_into_queries_has_them_in_flight_together_with_one_querys_rows(ch, users, concurrency):
    """8 distinct keys, 2 a query: 4 queries. With 3 allowed, 3 are open at once (each held until 3 are: an event,
    not a timing); the negative control, max-concurrent-requests=1, never has two open. The rows are one query's,
    in the batch's order, whatever order the queries complete in."""
    ids = [3, 1, 2, 5, 2, 7, 1, 4, 6, 8]
    whole, _ = plan_lookup(SCHEMA, "clickhouse", ch.opts(users), "id", "left", None)
    split, _ = plan_lookup(SCHEMA, "clickhouse", ch.opts(users, **{"lookup.max-keys-per-request": "2",
                           "lookup.max-concurrent-requests": str(concurrency)}), "id", "left", None)
    with observe_requests(concurrency if concurrency > 1 else None) as counter:
        rows = run(split, ids)
        seen = (counter.sent, counter.peak)
    assert seen == (4, concurrency)
    assert rows == run(whole, ids)
    assert sorted(map(str, rows["name"])) == sorted(map(str, [None, "ann", "bo", "bea", None, "bo", "bea", None,
                                                               "ann", None, None, None]))


def test_bad_input_is_named_before_any_work(ch, users):
    def refused(options=None, on="id", schema=SCHEMA, columns=None):
        with pytest.raises(sluice.OptionError) as failed:
            plan_lookup(schema, "clickhouse", {**ch.opts(users), **(options or {})}, on, "left", columns)
        return str(failed.value)

    message = refused({"lookup.max-retry": "1"})
    assert "unknown option 'lookup.max-retry'" in message and "Did you mean 'lookup.max-retries'?" in message
    assert ch.password not in message
    assert f"key column 'event' is not a column of table default.{users}" in refused(on="event")
    assert f"looked-up column 'nope' is not a column of table default.{users}" in refused(columns=["nope"])
    text_keys = StructType([StructField("id", StringType())])
    assert "key column 'id' is string in the DataFrame, but the key id of table" in refused(schema=text_keys)
    assert "does not exist" in refused({"table": "no_such_table"})
    floats = ch.table("id Float64, v String")
    message = refused({"table": floats})
    assert f"key column 'id' of table default.{floats} is Float64: a lookup takes keys of type Int8" in message


@pytest.mark.spark
def test_a_server_killed_mid_stream_fails_the_query_after_the_retries_and_one_back_within_them_answers(spark,
                                                                                                       tmp_path):
    """A server of its own (the session's stays up), SIGKILLed after two streaming queries answered a micro-batch:
    the next micro-batch of the one with lookup.max-retries=1 fails it, naming the table and the server, writing no
    nulls. Negative control: the other, with lookup.max-retries=10, meets the same outage, the server is started
    again, and it answers the right rows (tests/lookup_faults.py)."""
    with clickhouse_server() as server:
        server.sql("CREATE TABLE users (id UInt64, name String) ENGINE = MergeTree() ORDER BY id")
        server.sql("INSERT INTO users VALUES (1, 'ann'), (2, 'bo')")
        lookup = Lookup("clickhouse", {"url": server.url, "table": "users", "password": server.password}, ["id"],
                        "name", "id long")
        message = a_store_killed_mid_stream(spark, tmp_path, Outage(server.kill, server.start, server.host,
                                                                    server.port), lookup,
                                            [{"id": 1}, {"id": 3}], [{"id": 1}, {"id": 2}, {"id": 3}],
                                            ["ann", None, "ann", "bo", None])
    assert (f"looking up 3 key(s) in table default.users on ClickHouse at {server.url} failed after 2 attempt(s) "
            "(lookup.max-retries=1)") in message, message
    assert "is unreachable" in message and server.password not in message


def test_keys_beyond_the_url_budget_are_sent_in_several_queries_and_all_found(ch):
    """20,000 keys take more than URL_BUDGET as a parameter: split, each query under it (the stand-in, as many
    proxies, refuses a request line over 64 KiB), every key found."""
    table = ch.table("id UInt32, v UInt32")
    ch.sql(f"INSERT INTO {table} SELECT number, number * 2 FROM numbers(20000)")
    plan, _ = plan_lookup(SCHEMA, "clickhouse", ch.opts(table), "id", "inner", None)
    keys = pa.array(range(20_000), pa.int64())
    chunks = list(_chunks([_elements(keys, plan.reader.kinds[0])]))
    assert len(chunks) > 1 and all(len(quote(params["param_k0"])) <= URL_BUDGET for params, _ in chunks)
    assert sum(count for _, count in chunks) == 20_000
    assert run(plan, list(range(20_000)))["v"] == [2 * i for i in range(20_000)]
