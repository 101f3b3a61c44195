"""Documents the cluster refuses for what they hold go to the dead-letter route with errors.tolerance=all (as the
rows they came from, with the server's reason) and the rest is indexed; without it the write fails naming the
document and the reason. write.error-index is a shorthand for the same route into an index of the same cluster. A
value JSON cannot carry is refused by the encoder, before anything is sent. (A document alone over
http.max_content_length, and refusals among 429s: test_faults.py.) Reading, a document with a value the read cannot
type (text kept in a long field by ignore_malformed) goes to a dead-letter index with errors.tolerance=all, in a batch
read and in a tracking stream, and the others are read; without it the read fails naming the document."""

import json
import re

import pytest

import sluice

pytestmark = pytest.mark.spark

BAD = {7: "seven", 150: "1.5e", 299: "n/a"}  # values a long field cannot parse
REASON = r"400 (mapper|document)_parsing_exception: failed to parse field \[n\] of type \[long\]"


def conflicting(spark, search):
    """An index whose field n is a long, and 300 rows whose n is text: 3 of them do not parse as a number."""
    index = search.index_name()
    search.call("PUT", f"/{index}", {"mappings": {"properties": {"id": {"type": "long"}, "n": {"type": "long"}}}})
    rows = [(i, BAD.get(i, str(i * 10)), f"note {i}") for i in range(300)]
    return index, spark.createDataFrame(rows, "id long, n string, note string").repartition(2)


def test_elasticsearch_a_mapping_conflict(spark, search, tmp_path):
    index, df = conflicting(spark, search)
    # mapping.exclude: the dead letter holds the user's row, not the document sent (which lacks the note)
    opts = search.opts(index, **{"mapping.id": "id", "mapping.exclude": "note"})
    with pytest.raises(Exception, match=rf"document '({'|'.join(map(str, BAD))})' of index '{index}': {REASON}"):
        sluice.write(df, "elasticsearch", opts)  # the negative control: errors.tolerance=none fails the write

    store = {"warehouse": str(tmp_path / "warehouse"), "meta": str(tmp_path / "meta.db")}
    sluice.write(df, "elasticsearch", {
        **opts, "errors.tolerance": "all", "errors.deadletter.format": "tablestore",
        "errors.deadletter.table": "refused", **{f"errors.deadletter.{k}": v for k, v in store.items()}})

    assert set(search.docs(index)) == {str(i) for i in range(300) if i not in BAD}
    assert sluice.last_write_summary()["dead_letters"] == 3
    letters = spark.read.format("tablestore").option("table", "refused").options(**store).load().collect()
    records = {json.loads(letter.record)["id"]: letter for letter in letters}
    assert sorted(records) == sorted(BAD)  # exactly the 3, once each
    for i, letter in records.items():
        assert json.loads(letter.record) == {"id": i, "n": BAD[i], "note": f"note {i}"}
        assert letter.error_class == "ElasticsearchError"
        assert letter.connector == "elasticsearch" and letter.target.endswith(f"/{index}")
        assert re.search(f"document '{i}' of index '{index}': {REASON}", letter.error_message), letter.error_message


def test_write_error_index_is_a_shorthand_for_a_dead_letter_index_on_the_same_cluster(spark, search):
    index, df = conflicting(spark, search)
    errors = search.index_name()
    opts = search.opts(index, **{"mapping.id": "id", "write.error-index": errors})
    with pytest.raises(Exception, match=rf"write.error-index='{errors}' stands for errors.tolerance=all, "
                                        r"errors.deadletter.format=elasticsearch .* cannot be set together with "
                                        r"errors.tolerance"):
        sluice.write(df, "elasticsearch", {**opts, "errors.tolerance": "all"})  # two routes named: refused
    assert search.count(index) == 0

    sluice.write(df, "elasticsearch", opts)
    assert len(search.docs(index)) == 297
    assert sluice.last_write_summary()["dead_letters"] == 3
    letters = list(search.docs(errors).values())
    assert sorted(json.loads(letter["record"])["id"] for letter in letters) == sorted(BAD)
    assert all("mapper_parsing_exception" in letter["error_message"]
               or "document_parsing_exception" in letter["error_message"] for letter in letters)
    # The bounds of the route apply to the shorthand too.
    with pytest.raises(Exception, match=r"3 records were refused, more than errors.max-records=2"):
        sluice.write(df, "elasticsearch", {**opts, "errors.max-records": "2"})


@pytest.mark.parametrize("search", ["opensearch"], indirect=True)  # the encoder's refusal: the same on both engines
def test_a_value_json_cannot_carry_goes_aside_before_anything_is_sent(spark, search, tmp_path):
    index = search.index_name()
    df = spark.createDataFrame([(1, 1.0), (2, float("nan")), (3, 3.0)], "id long, x double").coalesce(1)
    opts = search.opts(index, **{"mapping.id": "id"})
    with pytest.raises(Exception, match=r"document '2' has \['x'\] that JSON cannot carry"):
        sluice.write(df, "elasticsearch", opts)  # the negative control
    store = {"warehouse": str(tmp_path / "warehouse"), "meta": str(tmp_path / "meta.db")}
    sluice.write(df, "elasticsearch", {
        **opts, "errors.tolerance": "all", "errors.deadletter.format": "tablestore",
        "errors.deadletter.table": "refused", **{f"errors.deadletter.{k}": v for k, v in store.items()}})
    assert set(search.docs(index)) == {"1", "3"}
    (letter,) = spark.read.format("tablestore").option("table", "refused").options(**store).load().collect()
    assert json.loads(letter.record)["id"] == 2 and "that JSON cannot carry" in letter.error_message


def malformed(search) -> str:
    """An index whose long field n keeps a value that does not parse (ignore_malformed: the document is indexed, the
    text stays in its _source): documents 1 and 3 read, document 2's n cannot be typed as the read's long."""
    index = search.index_name()
    search.call("PUT", f"/{index}", {"settings": {"number_of_shards": 1, "number_of_replicas": 0},
                                     "mappings": {"properties": {"id": {"type": "long"},
                                                                 "n": {"type": "long", "ignore_malformed": True}}}})
    lines = "".join(f'{{"index": {{"_id": "{d["id"]}"}}}}\n{json.dumps(d)}\n'
                    for d in ({"id": 1, "n": 10}, {"id": 2, "n": "abc"}, {"id": 3, "n": 30}))
    response = search.http.request("POST", f"{search.server.url}/{index}/_bulk?refresh=true", body=lines.encode(),
                                   headers={"Content-Type": "application/x-ndjson"})
    assert response.status == 200 and b'"errors":false' in response.data, response.data[:500]
    return index


def read_letters(search, index: str) -> dict[str, str]:
    """errors.tolerance=all into a dead-letter index of the same cluster (its tasks write it; no driver commit)."""
    return {"errors.tolerance": "all", "errors.deadletter.format": "elasticsearch",
            "errors.deadletter.nodes": search.server.url, "errors.deadletter.index": index,
            "errors.deadletter.mapping.text-columns": "record,error_message"}


def assert_one_letter(search, letters: str, index: str) -> None:
    (letter,) = search.docs(letters).values()
    assert json.loads(letter["record"]) == {"_index": index, "_id": "2", "_source": {"id": 2, "n": "abc"}}
    assert (letter["error_class"], letter["connector"], letter["target"]) == ("ValueTypeError", "elasticsearch", index)
    assert f"elasticsearch index '{index}', document '2': the value 'abc' of field 'n' does not convert to " \
           "bigint" in letter["error_message"], letter["error_message"]


UNTYPED = r"(?s)document '2': the value 'abc' of field 'n' does not convert to bigint.*errors\.tolerance"


@pytest.mark.parametrize("search", ["opensearch"], indirect=True)  # the client code is the same on both engines
def test_a_batch_read_sends_a_document_it_cannot_type_aside_and_reads_the_others(spark, search):
    index, letters = malformed(search), search.index_name()
    with pytest.raises(Exception, match=UNTYPED):  # the negative control: errors.tolerance=none fails the read
        spark.read.format("elasticsearch").options(**search.opts(index)).load().collect()
    rows = spark.read.format("elasticsearch").options(**search.opts(index, **read_letters(search, letters))).load()
    assert sorted((r.id, r.n) for r in rows.collect()) == [(1, 10), (3, 30)]
    assert_one_letter(search, letters, index)


@pytest.mark.parametrize("search", ["opensearch"], indirect=True)
@pytest.mark.parametrize("tolerance", ["all", "none"])
def test_a_tracking_stream_sends_a_document_it_cannot_type_aside_and_goes_on(spark, search, tmp_path, tolerance):
    from pyspark.errors import StreamingQueryException

    index, letters = malformed(search), search.index_name()
    options = {"tracking.column": "id", "tracking.lag-window-ms": "0"}
    if tolerance == "all":
        options |= read_letters(search, letters)
    query = spark.readStream.format("elasticsearch").options(**search.opts(index, **options)).load() \
        .writeStream.format("memory").queryName(f"es_untyped_{tolerance}").trigger(availableNow=True) \
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    if tolerance == "none":  # the negative control
        with pytest.raises(StreamingQueryException, match=UNTYPED):
            query.awaitTermination(120)
        return
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted((r.id, r.n) for r in spark.table(f"es_untyped_{tolerance}").collect()) == [(1, 10), (3, 30)]
    assert_one_letter(search, letters, index)
