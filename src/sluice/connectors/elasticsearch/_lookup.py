"""Lookup joins on Elasticsearch and OpenSearch (`sluice.lookup(df, "elasticsearch", ...)`, docs/lookup.md): a
`LookupReader` that finds an Arrow batch's keys, `lookup.max-keys-per-request` a request, up to
`lookup.max-concurrent-requests` of them in flight at once (run_requests).

- `on="_id"`, the document id (the column `read.metadata` adds to a batch read, and the id `mapping.id` gives a
  written document): an `_mget` of the request's ids. A multi-get is a real-time GET: it sees every document the
  index has acknowledged, refreshed or not.
- `on=<a field>` (keyword, long, integer, short or byte): a `_search` with a `terms` filter on the request's keys,
  `size` up to the index's `index.max_result_window` (10,000 unless set): a request whose keys match more than that
  fails, naming the limit, rather than return part of them. A search sees the documents of the last refresh
  (`refresh_interval`, 1 s by default): one written since then is not found yet.

Fields are typed as `spark.read.format("elasticsearch")` types them (the index's mapping, `read.array-columns`),
from each document's `_source` (dates as ISO text or epoch milliseconds). A key field holding several values in a
document fails the batch, as the batch read does for a field not read as an array.

Requests go through the process's pooled client (_client.py). A node that cannot be reached, answers 502-504 or
429, or answers for part of the keys only (an `_mget` document with an `error`, a search whose shards did not all
answer: a shard not started yet, as on a node restarting), is asked again, the next node in turn,
`lookup.max-retries` times (backoff from 0.5 s), then the task fails naming the index and the node; a lookup never
returns no rows for a key it could not ask about.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from sluice.connector import (
    LookupReader,
    OptionError,
    Options,
    RetryableError,
    ThrottledError,
    lookup_retry_pause,
    require_name,
    run_requests,
    slices,
    to_arrow_schema,
)
from sluice.connectors.elasticsearch._client import Cluster, Connection, ElasticsearchError
from sluice.connectors.elasticsearch._options import LookupOptions
from sluice.connectors.elasticsearch._source import python_value, spark_schema

ID = "_id"
TERM_KINDS = ("keyword", "constant_keyword", "long", "integer", "short", "byte")
DEFAULT_WINDOW = 10_000  # index.max_result_window's default in both engines


class SearchLookupReader(LookupReader):
    """Documents of one index by id (`_mget`) or by a field's value (`terms`): see the module's docstring."""

    def __init__(self, conn: Connection, described: str, key: str, schema: T.StructType, window: int,
                 retries: int, concurrency: int = 1, keys_per_request: int = 1_000) -> None:
        self.conn, self._described, self.key, self._schema = conn, described, key, schema
        self.window, self.retries = window, retries
        self.concurrency, self.keys_per_request = concurrency, keys_per_request
        self.arrow = to_arrow_schema(schema)
        self.source = [f.name for f in schema.fields if f.name != ID]

    @property
    def schema(self) -> T.StructType:
        return self._schema

    @property
    def described(self) -> str:
        return self._described

    def lookup(self, keys: pa.Table) -> pa.Table:
        values = keys.column(self.key).to_pylist()
        requests = [values[start:start + length] for start, length in slices(len(values), self.keys_per_request)]
        # Concurrent requests on the worker process's HTTP pool (urllib3's, thread-safe); answers in requests' order.
        answers = run_requests(("elasticsearch", self.conn.display), self.concurrency, self._hits, requests)
        return self._rows([hit for hits in answers for hit in hits])

    def _hits(self, values: list[Any]) -> list[dict[str, Any]]:
        """The documents of one request's keys: one _mget of ids, or one _search of a field's terms."""
        if self.key == ID:
            # _mget takes the fields to return as URL parameters, not in its body.
            fields = {"_source_includes": ",".join(self.source)} if self.source else {"_source": "false"}
            answer = self._request("_mget", {"ids": values}, len(values), **fields)
            return [doc for doc in answer["docs"] if doc.get("found")]
        body = {"size": self.window, "track_total_hits": self.window + 1, "_source": self.source,
                "query": {"bool": {"filter": [{"terms": {self.key: values}}]}}}
        answer = self._request("_search", body, len(values))
        total = answer["hits"]["total"]
        if (total["value"] if isinstance(total, dict) else total) > self.window:
            raise ElasticsearchError(
                f"looking up {len(values)} key(s) in {self.described}: they match more than {self.window} "
                "documents, the index's index.max_result_window. Lower lookup.max-keys-per-request (fewer keys "
                "per request), or raise index.max_result_window.")
        hits: list[dict[str, Any]] = answer["hits"]["hits"]
        return hits

    def _request(self, endpoint: str, body: dict[str, Any], count: int, **params: Any) -> Any:
        """The answer to one request; a node that cannot answer is replaced by the next, lookup.max-retries times."""
        for attempt in range(self.retries + 1):
            try:
                _, answer = self.conn.request("POST", f"/{self.conn.index}/{endpoint}", body, node=attempt,
                                             **params)
                missing = _unanswered(answer)
                if missing:  # a shard not (yet) started: its keys were not looked at, so none is known missing
                    raise RetryableError(f"the answer covered part of the keys only: {missing}")
                return answer
            except (RetryableError, ThrottledError) as e:
                if attempt == self.retries:
                    raise ElasticsearchError(f"looking up {count} key(s) in {self.described} failed after "
                                             f"{attempt + 1} attempt(s) (lookup.max-retries={self.retries}): {e}"
                                             ) from None
                lookup_retry_pause(self.described, count, attempt, self.retries, e)
            except ElasticsearchError as e:
                raise ElasticsearchError(f"looking up {count} key(s) in {self.described} failed: {e}",
                                         e.status) from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _rows(self, hits: list[dict[str, Any]]) -> pa.Table:
        arrays = []
        for field, arrow in zip(self._schema.fields, self.arrow, strict=True):
            if field.name == ID:
                values = [hit["_id"] for hit in hits]
            else:
                values = [python_value(hit.get("_source", {}).get(field.name), field.dataType, field.name)
                          for hit in hits]
            arrays.append(pa.array(values, arrow.type))
        return pa.Table.from_arrays(arrays, schema=self.arrow)


def _window(conn: Connection) -> int:
    """The smallest index.max_result_window of the indices the name covers (set, else the default)."""
    _, answer = conn.request("GET", f"/{conn.index}/_settings", include_defaults="true",
                             filter_path="*.settings.index.max_result_window,*.defaults.index.max_result_window")
    windows = []
    for found in (answer or {}).values():
        given = found.get("settings", {}).get("index", {}).get("max_result_window")
        default = found.get("defaults", {}).get("index", {}).get("max_result_window", DEFAULT_WINDOW)
        windows.append(int(given if given is not None else default))
    return min(windows, default=DEFAULT_WINDOW)


def plan_lookup(opts: Options, on: tuple[str, ...], columns: tuple[str, ...] | None) -> SearchLookupReader:
    """The reader of a lookup in the index the options name, its key and looked-up fields checked against the
    index's mapping on the driver."""
    options = LookupOptions.of(opts)
    conn = options.conn
    of = f"index '{conn.index}'"
    if len(on) != 1:
        raise OptionError(f"on={list(on)}: a lookup in {of} takes one key column: _id (the document id) or one "
                          "field. For a document id made of several columns (mapping.id), look up by _id, the "
                          "id's JSON text, e.g. [\"eu\",42].")
    key = on[0]
    status, answer = conn.request("GET", f"/{conn.index}/_mapping", ok=(404,))
    if status == 404:
        raise OptionError(f"{of} does not exist on {conn.nodes[0]} (option 'index'): create it first, or name an "
                          "existing index or alias.")
    engine = "OpenSearch" if Cluster.of(conn).engine == "opensearch" else "Elasticsearch"
    described = f"{engine} {of} on {conn.nodes[0]}"
    properties: dict[str, Any] = {}
    for definition in (answer or {}).values():
        properties.update(definition.get("mappings", {}).get("properties", {}))
    fields, kinds = spark_schema(properties, options.read_array_columns)
    known = {ID: T.StringType(), **{f.name: f.dataType for f in fields.fields}}
    require_name(key, known, "key column", of, advice="Name _id (the document id) or a keyword or integer field in "
                 "on=, as the DataFrame names it.")
    if key != ID and (kinds.get(key) not in TERM_KINDS or isinstance(known[key], T.ArrayType)):
        raise OptionError(f"key column '{key}' of {of} is a {kinds.get(key)} field"
                          f"{' read as an array' if isinstance(known[key], T.ArrayType) else ''}: a lookup takes "
                          f"_id or a single-valued field of type {', '.join(TERM_KINDS)} (a text field is analyzed: "
                          "look up by its keyword sub-field's source field instead)")
    for name in columns or ():
        require_name(name, known, "looked-up column", of, advice="Leave it out of columns=[...].")
    wanted = [key, *(columns if columns is not None else [f.name for f in fields.fields])]
    wanted = list(dict.fromkeys(name for name in wanted if name == key or name not in on))
    schema = T.StructType([T.StructField(name, known[name], True) for name in wanted])
    return SearchLookupReader(conn, described, key, schema, _window(conn), options.lookup_max_retries,
                              options.lookup_max_concurrent_requests, options.lookup_max_keys_per_request)


def _unanswered(answer: Any) -> str | None:
    """What a 200 answer left unread, or None: an `_mget` document with an `error` (its shard not available, as while
    a restarted node recovers it) rather than `found`, or a `_search` whose shards did not all answer
    (`_shards.failed`, `timed_out`). Either would otherwise look like keys the index lacks: nulls."""
    if "docs" in answer:
        errors = [doc["error"] for doc in answer["docs"] if "error" in doc]
        if errors:
            first = errors[0]
            reason = first.get("reason", first) if isinstance(first, dict) else first
            return f"{len(errors)} document(s) not read ({reason})"
        return None
    shards = answer.get("_shards", {})
    if shards.get("failed"):
        failures = shards.get("failures") or [{}]
        reason = failures[0].get("reason", {})
        return (f"{shards['failed']} of {shards.get('total')} shard(s) failed "
                f"({reason.get('reason', reason) if isinstance(reason, dict) else reason})")
    if answer.get("timed_out"):
        return "the search timed out on some shards"
    return None
