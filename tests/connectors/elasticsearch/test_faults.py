"""format("elasticsearch") when the node pushes back or fails: a node whose write queue holds one request (a storm
of 429 es_rejected_execution_exception) slows the write down and only the refused documents go again, every
document ends up stored; without retries the same storm fails the write naming the 429 (the negative control);
with errors.tolerance=all, documents refused in the storm for what they hold go aside and the rest is stored.
A node SIGKILLed mid-write and started again on its data: the write retries through the outage and the index
equals the input; a re-run converges. A node SIGKILLed under a streaming lookup fails the query's next
micro-batch after lookup.max-retries, never with nulls; started again within them, the micro-batch is answered. The
node asks for a password (OpenSearch's security plugin): a wrong one is refused clearly and never shown."""

import json
import threading
import time

import pytest

import sluice
from sluice.testing import LocalOpenSearch
from tests.connectors.elasticsearch.conftest import Search
from tests.faults import Striker, held_at, wait_for_a_client
from tests.lookup_faults import Lookup, Outage, a_store_killed_mid_stream

pytestmark = pytest.mark.spark

DOCS = 2000


@pytest.fixture(scope="module")
def search():
    # One write thread with a queue of one: concurrent shard bulks beyond that are rejected with 429. Requests of
    # at most 64 KiB.
    settings = {"thread_pool.write.size": 1, "thread_pool.write.queue_size": 1, "http.max_content_length": "64kb"}
    with LocalOpenSearch(settings=settings) as server:
        yield Search(server)


def docs_df(spark, partitions: int = 2):
    return spark.range(0, DOCS, 1, partitions).selectExpr("id", "repeat('x', 100) AS pad")


def storm_opts(search: Search, index: str, **more: str) -> dict[str, str]:
    # Three shards, small bulks, many in flight: more shard-level bulks at once than the write queue takes.
    search.call("PUT", f"/{index}", {"settings": {"number_of_shards": 3, "number_of_replicas": 0}})
    return search.opts(index, **{"mapping.id": "id", "sink.batch.max-size": "50", "connections-per-task": "8",
                                 "sink.parallelism": "32", **more})


def test_a_storm_of_429s_is_ridden_out_resending_only_the_refused_documents(spark, search):
    index = search.index_name()
    sluice.write(docs_df(spark), "elasticsearch", storm_opts(search, index, **{
        "sink.max-retries": "30", "sink.retry-delay-ms": "50"}))
    summary = sluice.last_write_summary("elasticsearch")
    assert summary["throttles"] > 0, summary  # the node did refuse
    assert summary["records"] == DOCS
    assert set(search.docs(index)) == {str(i) for i in range(DOCS)}
    # Each document was indexed once: a bulk's stored documents were not sent again with its refused ones.
    indexed = search.call("GET", f"/{index}/_stats/indexing")["_all"]["primaries"]["indexing"]["index_total"]
    assert indexed == DOCS


def test_in_a_storm_refused_documents_go_aside_and_throttled_ones_go_again(spark, search, tmp_path):
    index = search.index_name()
    opts = storm_opts(search, index, **{"sink.max-retries": "30", "sink.retry-delay-ms": "50"})
    search.call("PUT", f"/{index}/_mapping", {"properties": {"n": {"type": "long"}}})
    bad = {5, 1000, 1999}  # n does not parse as a long: refused in bulks whose other documents may get 429s
    df = docs_df(spark).selectExpr("*", f"IF(id IN ({','.join(map(str, bad))}), 'x', CAST(id AS STRING)) AS n")
    store = {"warehouse": str(tmp_path / "warehouse"), "meta": str(tmp_path / "meta.db")}
    sluice.write(df, "elasticsearch", {**opts, "errors.tolerance": "all", "errors.deadletter.format": "tablestore",
                                       "errors.deadletter.table": "refused",
                                       **{f"errors.deadletter.{k}": v for k, v in store.items()}})
    summary = sluice.last_write_summary("elasticsearch")
    assert summary["throttles"] > 0 and summary["dead_letters"] == 3, summary
    assert summary["records"] == DOCS - 3
    assert set(search.docs(index)) == {str(i) for i in range(DOCS) if i not in bad}
    letters = spark.read.format("tablestore").option("table", "refused").options(**store).load().collect()
    assert sorted(json.loads(letter.record)["id"] for letter in letters) == sorted(bad)


def test_without_retries_the_storm_fails_the_write_and_says_429(spark, search):
    index = search.index_name()
    with pytest.raises(Exception, match=r"(?s)sink\.max-retries=0.*429"):
        sluice.write(docs_df(spark), "elasticsearch", storm_opts(search, index, **{"sink.max-retries": "0"}))


def test_a_bulk_or_a_document_over_the_nodes_content_length_limit_is_an_error_naming_what_to_change(spark, search,
                                                                                                     tmp_path):
    index = search.index_name()
    df = spark.range(0, 200, 1, 1).selectExpr("id", "repeat('x', 1000) AS pad")  # 100 KiB a task, in one bulk
    with pytest.raises(Exception, match=r"bulk request of \d+ bytes \(\d+ documents\) is over the node's "
                                        r"http.max_content_length \(413\): lower sink.flush-buffer.size"):
        sluice.write(df, "elasticsearch", search.opts(index, **{"mapping.id": "id", "sink.parallelism": "1"}))
    sluice.write(df, "elasticsearch", search.opts(index, **{"mapping.id": "id", "sink.parallelism": "1",
                                                            "sink.flush-buffer.size": "32768"}))
    assert len(search.docs(index)) == 200  # the write within the limit
    big = spark.range(1).selectExpr("id", "repeat('x', 100000) AS pad")
    with pytest.raises(Exception, match=r"one document of \d+ bytes is over the node's http.max_content_length "
                                        r"\(413\), alone in its bulk request \(.*\"_id\":\"0\""):
        sluice.write(big, "elasticsearch", search.opts(index, **{"mapping.id": "id"}))
    # A document alone over the limit is a refused record: with errors.tolerance=all it goes aside, as its row.
    store = {"warehouse": str(tmp_path / "warehouse"), "meta": str(tmp_path / "meta.db")}
    aside = search.index_name()
    mixed = spark.range(0, 3, 1, 1).selectExpr("id", "IF(id = 1, repeat('x', 100000), 'small') AS pad")
    sluice.write(mixed, "elasticsearch", search.opts(aside, **{
        "mapping.id": "id", "sink.batch.max-size": "1", "errors.tolerance": "all",
        "errors.deadletter.format": "tablestore", "errors.deadletter.table": "refused",
        **{f"errors.deadletter.{k}": v for k, v in store.items()}}))
    assert set(search.docs(aside)) == {"0", "2"}
    (letter,) = spark.read.format("tablestore").option("table", "refused").options(**store).load().collect()
    assert letter.record == '{"id": 1, "pad": "' + "x" * 100000 + '"}'
    assert "over the node's http.max_content_length (413), alone in its bulk request" in letter.error_message


def test_a_node_killed_and_restarted_mid_write_loses_nothing_and_a_rerun_converges(spark, search, tmp_path):
    index = search.index_name()
    search.call("PUT", f"/{index}", {"settings": {"number_of_replicas": 0, "translog.durability": "request"}})
    # The second task's input stops at id 1500 until the node is killed: the write is still running when the
    # strike lands, however quick the machine.
    hold = tmp_path / "hold"
    hold.touch()
    df = docs_df(spark).mapInArrow(held_at(1500, str(hold), 50, 0.02), "id long, pad string")
    opts = search.opts(index, **{"mapping.id": "id", "sink.batch.max-size": "100", "sink.max-retries": "30",
                                 "sink.retry-delay-ms": "200", "http.timeout-ms": "5000"})
    server = search.server

    def strike() -> None:
        try:
            deadline = time.monotonic() + 120
            while search.count(index) < 500:
                assert time.monotonic() < deadline, "the write never stored 500 documents"
                threading.Event().wait(0.05)  # polling the index for the event: the documents are there
            server.kill()
            struck.set()
        finally:
            hold.unlink()
        wait_for_a_client(server.host, server.http_port)  # the write met the outage: only then heal it
        server.start()

    struck = threading.Event()
    striker = Striker(strike)
    striker.start()
    # Through df.write, not sluice.write: its repartition by id would hold the whole input back in the shuffle.
    df.write.format("elasticsearch").options(**opts).mode("append").save()
    striker.join(180)
    assert struck.is_set()
    assert sluice.last_write_summary("elasticsearch")["retries"] > 0
    assert set(search.docs(index)) == {str(i) for i in range(DOCS)}
    sluice.write(df, "elasticsearch", opts)  # a re-run: the same ids, indexed again in place
    assert len(search.docs(index)) == DOCS


def test_a_node_killed_mid_stream_fails_the_lookup_query_after_the_retries_and_one_back_within_them_answers(
        spark, search, tmp_path):
    """Two streaming queries answered a micro-batch through the lookup reader (Elasticsearch's and OpenSearch's are
    one class over one client), then the node is SIGKILLed: the next micro-batch of the one with
    lookup.max-retries=1 fails it, naming the index and the node, writing no nulls. Negative control: the other,
    with lookup.max-retries=10, meets the same outage, the node is started again, and it answers the right rows
    (tests/lookup_faults.py)."""
    index = search.index_name()
    for doc_id, name in (("a", "ann"), ("b", "bo")):
        search.call("PUT", f"/{index}/_doc/{doc_id}", {"name": name})
    server = search.server
    lookup = Lookup("elasticsearch", search.opts(index), ["_id"], "name", "_id string")
    message = a_store_killed_mid_stream(spark, tmp_path, Outage(server.kill, server.start, server.host,
                                                                server.http_port), lookup,
                                        [{"_id": "a"}, {"_id": "zz"}], [{"_id": "a"}, {"_id": "b"}, {"_id": "zz"}],
                                        ["ann", None, "ann", "bo", None])
    assert (f"looking up 3 key(s) in OpenSearch index '{index}' on {server.url} failed after 2 attempt(s) "
            "(lookup.max-retries=1)") in message, message


def test_a_wrong_password_is_refused_clearly_and_never_shown(spark):
    with LocalOpenSearch(auth=True) as server:
        df = spark.range(3)
        opts = {"nodes": server.url, "index": "secured", "username": server.username, "mapping.id": "id"}
        sluice.write(df, "elasticsearch", {**opts, "password": server.password, "write.refresh": "true"})
        status, answer = server.request("GET", "/secured/_count")
        assert status == 200 and answer["count"] == 3
        with pytest.raises(Exception, match=r"refused user 'sluice' \(401\)") as raised:
            sluice.write(df, "elasticsearch", {**opts, "password": "not-the-password-xyz"})
        assert "not-the-password-xyz" not in str(raised.value)
