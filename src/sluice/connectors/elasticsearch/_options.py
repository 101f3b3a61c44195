"""The options of format("elasticsearch"), declared once and typed once on the driver: the cluster and index
(_client.py's), how columns map to documents (ids, routing, versions) and how bulk writes act, how sliced reads
page."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.connector import (
    ERROR_OPTIONS,
    LOOKUP_OPTIONS,
    PARTITION_ORDERED,
    SINK_SPEC,
    Option,
    OptionError,
    Options,
    OptionSpec,
    TypedOptions,
    check_error_options,
    lookup_max_concurrent_requests,
    lookup_max_keys_per_request,
    lookup_max_retries,
    pushdown_option,
    tracking_options,
)
from sluice.connectors.elasticsearch._client import CONNECTION_OPTIONS, Connection

MiB = 1024 * 1024
OPERATIONS = ("index", "create", "update", "upsert")

WRITE_OPTIONS = (
    Option("write.operation", "choice", "index",
           "index: the row replaces the document; create: only new documents (an existing id is an error); update: "
           "the row's fields are merged into an existing document; upsert: merged, or created when missing "
           "(es.write.operation).", choices=OPERATIONS),
    Option("mapping.id", "list", (),
           "Columns whose values make the document id (es.mapping.id): one column's text, or several as a JSON "
           "array, e.g. [\"eu\",42]. Without it the engine generates ids (index and create only).",),
    Option("mapping.routing", "str", None, "Column whose value routes each document to its shard "
           "(es.mapping.routing). Not written into the document."),
    Option("mapping.version", "str", None,
           "Column (long, >= 0) holding each document's external version (es.mapping.version): the engine keeps "
           "the highest, so a replayed or late write never overwrites a newer one. Not written."),
    Option("mapping.exclude", "list", (), "Columns not written into the document (es.mapping.exclude)."),
    Option("mapping.text-columns", "list", (),
           "String columns mapped as full-text `text` when sluice creates the index (others: `keyword`)."),
    Option("write.version", "choice", "none",
           "micro-batch (streaming): each row's external version is its micro-batch id and position, so a replayed "
           "micro-batch never overwrites a later one. none: the engine's own versions (the last write wins).",
           choices=("none", "micro-batch")),
    Option("write.replay-guard", "bool", True,
           "Streaming: keep the last micro-batch committed per query in write.replay-guard-index, and write nothing "
           "for an older one replayed (a restart from an older checkpoint copy), so a replay never brings back a "
           "document a later micro-batch deleted, however long ago (a delete's version lasts index.gc_deletes)."),
    Option("write.replay-guard-index", "str", "sluice-replay-guard",
           "The index of write.replay-guard's markers: a document per query and target index."),
    Option("upsert.op-column", "str", None,
           "Column whose value d, delete, D or -D deletes the document (by its id). Not written."),
    Option("write.refresh", "choice", "false",
           "true: refresh the index at Spark's commit of each write or micro-batch, so searches see it; wait_for: "
           "every bulk request waits until its documents are searchable; false: the index's refresh_interval.",
           choices=("false", "true", "wait_for")),
    Option("write.error-index", "str", None,
           "Shorthand for errors.tolerance=all with errors.deadletter.format=elasticsearch and "
           "errors.deadletter.index=<this index> on the same cluster: documents the cluster refuses for what they "
           "hold (mapping errors, conflicts) go there as dead letters (the row, the reason) and the write goes on. "
           "Not together with errors.tolerance or errors.deadletter.*; errors.max-records and errors.max-ratio apply."),
    Option("index.create", "choice", "schema",
           "When the index is missing: schema creates it with a mapping derived from the DataFrame's schema; server "
           "lets the cluster create it on the first write (index templates and dynamic mapping apply); never "
           "fails the write.", choices=("schema", "server", "never")),
    Option("connections-per-task", "int", 2, "Concurrent bulk requests per Spark task.", minimum=1, maximum=32),
)


# Bulk requests of 1,000 documents or 5 MiB (the size Elastic's tuning guide starts from). Partition-ordered by the
# id columns by default (unordered when documents have no ids: the data source decides).
WRITE_SPEC = SINK_SPEC.extend(
    (*CONNECTION_OPTIONS, *WRITE_OPTIONS),
    sink_batch_max_size=1000, sink_flush_buffer_size=5 * MiB, sink_requests_max_buffered=32_000,
    sink_mode=PARTITION_ORDERED,
).renamed("elasticsearch")


@dataclass(frozen=True)
class WriteOptions(TypedOptions):
    """The write options of format("elasticsearch") (WRITE_OPTIONS), parsed and checked once, one field per
    option; `index`: the target (a connection option)."""

    declared = WRITE_OPTIONS

    write_operation: str
    mapping_id: tuple[str, ...]
    mapping_routing: str | None
    mapping_version: str | None
    mapping_exclude: tuple[str, ...]
    mapping_text_columns: tuple[str, ...]
    write_version: str
    write_replay_guard: bool
    write_replay_guard_index: str
    upsert_op_column: str | None
    write_refresh: str
    write_error_index: str | None
    index_create: str
    connections_per_task: int
    index: str


def error_index_route(raw: Mapping[str, str]) -> Mapping[str, str]:
    """Spark's options of a write with write.error-index turned into the dead-letter route it stands for (the
    errors.* options, the target on the write's own cluster); unchanged without it. One route: refused documents
    count in the write's summary and metrics and within its bounds like any sink's dead letters."""
    keys = {k.lower(): k for k in raw}
    if "write.error-index" not in keys:
        return raw
    index = raw[keys["write.error-index"]]
    clash = sorted(keys[k] for k in keys if k == "errors.tolerance" or k.startswith("errors.deadletter."))
    if clash:
        raise OptionError(f"write.error-index={index!r} stands for errors.tolerance=all, "
                          f"errors.deadletter.format=elasticsearch and errors.deadletter.index={index!r} on this "
                          f"cluster, so it cannot be set together with {clash[0]}: keep write.error-index alone, or "
                          "remove it and set the errors.* options (a dead-letter target of any format).")
    # The record and the reason as full text: a keyword field refuses a term over 32 KiB, and a refused document
    # may be bigger.
    route = {"errors.tolerance": "all", "errors.deadletter.format": "elasticsearch",
             "errors.deadletter.index": index, "errors.deadletter.mapping.text-columns": "record,error_message"}
    for option in CONNECTION_OPTIONS:
        name = option.name.lower()
        if name != "index" and name in keys:
            route[f"errors.deadletter.{option.name}"] = raw[keys[name]]
    return {**raw, **route}


ARRAY_COLUMNS = Option("read.array-columns", "list", (),
                       "Fields read as arrays (a search-engine field may hold one value or several; the mapping does "
                       "not say which; es.read.field.as.array.include).")

READ_OPTIONS = (
    Option("partitions", "int", None, "Splits (Spark partitions) of a read: slices of one point-in-time search; "
           "default: the index's primary shards.", minimum=1, maximum=1024),
    Option("read.page-size", "int", 2000, "Documents per search request of a split.", minimum=1, maximum=10_000),
    Option("read.keep-alive", "str", "5m", "How long the point in time outlives each request (e.g. 5m, 1h)."),
    Option("read.query", "str", None, "A query in the query DSL, as JSON ({\"match\": {\"title\": \"spark\"}}), "
           "that documents must match too."),
    Option("read.metadata", "bool", False, "Add a column _id with each document's id."),
    ARRAY_COLUMNS,
    pushdown_option("query-DSL filters on exact fields (keyword, numbers, dates, boolean, ip)"),
)


# readStream: a tracking-field stream (docs/tracking.md), typed by sluice.connector.TrackingSettings.
STREAM_OPTIONS = (
    *tracking_options("a long/integer/short/byte or date/date_nanos field whose values grow as documents are "
                      "written (dates compared by the millisecond)"),
    Option("tracking.tie-breaker", "str", None,
           "readStream: a keyword or integer field that tells documents of one tracking value apart, so "
           "max-records-per-trigger can cut between them; none: a micro-batch takes every document of a value."),
)


# errors.*: documents with a value the read cannot type go to a dead-letter target (errors.tolerance=all).
READ_SPEC = OptionSpec("elasticsearch", (*CONNECTION_OPTIONS, *READ_OPTIONS, *STREAM_OPTIONS, *ERROR_OPTIONS),
                       (check_error_options,))


@dataclass(frozen=True)
class ReadOptions(TypedOptions):
    """The read options of format("elasticsearch") (READ_OPTIONS), parsed and checked once, one field per option;
    `conn`: the cluster and index."""

    declared = READ_OPTIONS
    conn_from = Connection.from_options

    partitions: int | None
    read_page_size: int
    read_keep_alive: str
    read_query: str | None
    read_metadata: bool
    read_array_columns: frozenset[str]
    pushdown: bool
    conn: Connection

    @classmethod
    def derived(cls, opts: Options) -> dict[str, Any]:
        return {"read_array_columns": frozenset(opts["read.array-columns"])}


# sluice.lookup(df, "elasticsearch", ...): documents looked up by _id or by a field (docs/lookup.md), typed as the
# batch read types them (read.array-columns), and the cache's options.
LOOKUP_SPEC = OptionSpec("elasticsearch", (
    *CONNECTION_OPTIONS,
    ARRAY_COLUMNS,
    lookup_max_retries("to the next node when a node cannot be reached or answers 429 or 502-504"),
    lookup_max_concurrent_requests("Requests (_mget of a batch's ids, or _search of its terms, over the worker "
                                   "process's pooled HTTP connections)"),
    lookup_max_keys_per_request("request (_mget or terms)"),
    *LOOKUP_OPTIONS,
))


@dataclass(frozen=True)
class LookupOptions(TypedOptions):
    """The lookup options of format("elasticsearch") besides the cache's; `conn`: the cluster and index."""

    declared = (ARRAY_COLUMNS, *(LOOKUP_SPEC.get(name) for name in ("lookup.max-retries",
                "lookup.max-concurrent-requests", "lookup.max-keys-per-request")))
    conn_from = Connection.from_options

    read_array_columns: frozenset[str]
    lookup_max_retries: int
    lookup_max_concurrent_requests: int
    lookup_max_keys_per_request: int
    conn: Connection

    @classmethod
    def derived(cls, opts: Options) -> dict[str, Any]:
        return {"read_array_columns": frozenset(opts["read.array-columns"])}
