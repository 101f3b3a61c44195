"""spark.readStream.format("elasticsearch"): an index streamed by a tracking field of the user's, on a real node of
each engine (OpenSearch 2.19 and Elasticsearch 7.17, conftest.py). Most tests drive the stream reader as Spark's
micro-batch loop does; the first runs the query in Spark (on OpenSearch: it is the one run on every Spark line)."""

import json

import pytest

from sluice import OptionError
from sluice.connectors.elasticsearch import ElasticsearchDataSource
from sluice.spark._compat import ReadMaxRows
from tests.connectors.elasticsearch.conftest import Search
from tests.faults import poll_until
from tests.tracking_stream import drain, run_stop_and_restart

MAPPING = {"id": {"type": "long"}, "seq": {"type": "long"}, "at": {"type": "date_nanos"},
           "ts": {"type": "date"}, "k": {"type": "keyword"}, "title": {"type": "text"}, "score": {"type": "double"}}


def new_index(search: Search, shards: int = 2) -> str:
    """An index of MAPPING's fields, over `shards` shards (a PIT read then spans several), refreshed every 200 ms."""
    index = search.index_name()
    search.call("PUT", f"/{index}", {"settings": {"number_of_shards": shards, "number_of_replicas": 0,
                                                  "refresh_interval": "200ms"},
                                     "mappings": {"properties": MAPPING}})
    return index


def put(search: Search, index: str, *docs: dict) -> None:
    """Index documents by their id, searchable when this returns (refresh=true)."""
    lines = "".join(f'{{"index": {{"_id": "{d["id"]}"}}}}\n{json.dumps(d)}\n' for d in docs)
    response = search.http.request("POST", f"{search.server.url}/{index}/_bulk?refresh=true", body=lines.encode(),
                                   headers={"Content-Type": "application/x-ndjson"})
    assert response.status == 200 and b'"errors":false' in response.data, response.data[:500]


def stream(search, index, **options):
    source = ElasticsearchDataSource(search.opts(index, **options))
    schema = source.schema()
    return source.streamReader(schema), schema


def ids(table):
    return [int(i) for i in table.column("id").to_pylist()]


@pytest.mark.lines  # Spark 4.0/4.1: sluice's own caps and a one-micro-batch AvailableNow after the first window
@pytest.mark.spark
@pytest.mark.parametrize("search", ["opensearch"], indirect=True)
def test_documents_written_while_the_query_runs_appear_and_a_restart_misses_and_repeats_nothing(spark, search,
                                                                                                  tmp_path):
    index = new_index(search)
    # 12 documents of one millisecond: micro-batches of 10 cut that group by the tie-breaker.
    put(search, index, *({"id": i, "at": "2026-01-01T00:00:00.000123Z", "k": f"{i:03}"} for i in range(1, 13)))
    put(search, index, *({"id": i, "at": f"2026-01-01T00:00:01.{i:03}Z", "k": f"{i:03}"} for i in range(13, 21)))

    def frame():
        return (spark.readStream.format("elasticsearch").options(**search.opts(index))
                .option("tracking.column", "at").option("tracking.tie-breaker", "k")
                .option("tracking.lag-window-ms", "300").option("max-records-per-trigger", "10").load()
                .select("id", "at"))

    def write(first, second):
        put(search, index, *({"id": i, "at": f"2026-01-01T00:00:0{second}.{i:03}Z", "k": f"{i:03}"}
                              for i in range(first, first + 10)))

    sizes, got = run_stop_and_restart(spark, frame, tmp_path, while_running=lambda: write(21, 2),
                                      while_stopped=lambda: write(31, 3), what="documents")
    assert sizes[0] == 10 and max(sizes) <= 10, sizes
    assert [int(i) for i in got] == list(range(1, 41)), "no document missing and none twice across the restart"


def late_write(search, index, window_ms):
    """Writer B indexes a document of a greater tracking value first; writer A's document of a smaller one becomes
    searchable after the stream has seen B's (a timestamp taken before B's, indexed after it). The ids read."""
    reader, schema = stream(search, index, **{"tracking.column": "ts", "tracking.lag-window-ms": str(window_ms)})
    start, _, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: True)  # a query's first
    # planning waits one window; the writers start after it
    put(search, index, {"id": 2, "ts": "2026-02-01T00:00:02Z"})
    start, first, _ = drain(reader, start, schema, until=lambda read: True)
    assert ids(first) == ([2] if window_ms == 0 else []), "without a window B's document is read at once, else held"
    put(search, index, {"id": 1, "ts": "2026-02-01T00:00:01Z"})
    put(search, index, {"id": 3, "ts": "2026-02-01T00:00:03Z"})
    _, rest, _ = drain(reader, start, schema, until=lambda read: 3 in ids(read))
    return sorted(ids(first)) + sorted(ids(rest))


def test_a_document_written_late_with_a_smaller_value_is_read_once_within_the_window_and_lost_without_it(search):
    assert late_write(search, new_index(search), 1500) == [1, 2, 3], "every document exactly once"
    # Negative control: without a window the stream passes A's value before A's document is searchable, and never
    # reads it.
    assert late_write(search, new_index(search), 0) == [2, 3], "the late document is lost without the window"


def test_caps_take_whole_groups_without_a_tie_breaker_and_a_restarted_reader_goes_on(search):
    index = new_index(search)
    put(search, index, *({"id": i, "seq": i // 5} for i in range(20)))  # groups of 5 of one seq
    options = {"tracking.column": "seq", "tracking.lag-window-ms": "0"}
    reader, schema = stream(search, index, **options)
    middle, first, sizes = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 10,
                                 limit=ReadMaxRows(3))
    assert sizes == [5, 5], "a cap of 3 never cuts a group of one tracking value"
    restarted, _ = stream(search, index, **options)  # a new driver from the checkpoint's offset
    _, rest, _ = drain(restarted, middle, schema, until=lambda read: first.num_rows + read.num_rows >= 20)
    assert sorted(ids(first) + ids(rest)) == list(range(20)), "each document once across the restart"
    now, _ = stream(search, index, **options, **{"tracking.start": "now"})
    at = now.initialOffset()
    put(search, index, {"id": 20, "seq": 4}, {"id": 21, "seq": 9})
    _, read, _ = drain(now, at, schema, until=lambda read: read.num_rows >= 2)
    assert sorted(ids(read)) == [20, 21], "start now: the documents written after it"
    tied, _ = stream(search, index, **options, **{"tracking.tie-breaker": "id", "tracking.rows-per-task": "4"})
    _, read, sizes = drain(tied, tied.initialOffset(), schema, until=lambda read: read.num_rows >= 22,
                           limit=ReadMaxRows(7))
    assert sorted(ids(read)) == list(range(22)) and max(sizes) == 7, "a tie-breaker cuts groups; tasks of 4"


@pytest.mark.parametrize("search", ["opensearch"], indirect=True)
def test_a_node_restart_during_a_stream_loses_and_repeats_nothing(search):
    index = new_index(search)
    search.call("PUT", f"/{index}/_settings", {"index": {"translog.durability": "request"}})
    put(search, index, *({"id": i, "seq": i} for i in range(10)))
    reader, schema = stream(search, index, **{"tracking.column": "seq", "tracking.lag-window-ms": "0",
                                              "http.timeout-ms": "2000"})
    start, first, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 10)
    server = search.server
    server.kill()
    with pytest.raises(Exception, match="unreachable"):
        reader.latestOffset(start, reader.getDefaultReadLimit())  # Spark fails the micro-batch; its offset stays
    server.start()  # on its data
    poll_until(lambda: search.count(index) == 10, 120, "the node back with its 10 documents", 0.2)
    put(search, index, *({"id": i, "seq": i} for i in range(10, 20)))
    _, rest, _ = drain(reader, start, schema, until=lambda read: read.num_rows >= 10)
    assert sorted(ids(first) + ids(rest)) == list(range(20)), "every document once across the node's restart"


def test_bad_tracking_fields_are_refused_before_the_query_starts_naming_the_field(spark, search):
    index = new_index(search)
    load = spark.readStream.format("elasticsearch").options(**search.opts(index))
    # The first through Spark (load() asks the source's schema() on the driver), the others as load() would.
    with pytest.raises(Exception, match=r"tracking.column 'updated_at' is not a field of index"):
        load.option("tracking.column", "updated_at").load()

    def refused(match, **options):
        with pytest.raises(OptionError, match=match):
            ElasticsearchDataSource(search.opts(index, **options)).schema()

    refused(r"tracking.column 'title' is a text field \(a text field is analyzed", **{"tracking.column": "title"})
    refused(r"tracking.column 'score' is a double field", **{"tracking.column": "score"})
    refused(r"tracking.column 'AT' is not a field .* \(the mapping has 'at'", **{"tracking.column": "AT"})
    refused(r"tracking.tie-breaker 'title' is a text field", **{"tracking.column": "at", "tracking.tie-breaker":
                                                                 "title"})
    refused(r"tracking.tie-breaker 'key' is not a field", **{"tracking.column": "at", "tracking.tie-breaker": "key"})
    refused(r"option 'tracking.start' must be .* ISO 8601", **{"tracking.column": "at", "tracking.start": "soon"})
    with pytest.raises(OptionError, match=r"needs option 'tracking.column'"):
        ElasticsearchDataSource(search.opts(index)).streamReader(None)
    with pytest.raises(OptionError, match=r"apply to spark.readStream.format\('elasticsearch'\) only"):
        ElasticsearchDataSource(search.opts(index, **{"tracking.column": "at"})).reader(None)
    with pytest.raises(OptionError, match=r"option\(s\) \['partitions'\] apply to spark.read"):
        ElasticsearchDataSource(search.opts(index, **{"tracking.column": "at", "partitions": "2"})).streamReader(None)
