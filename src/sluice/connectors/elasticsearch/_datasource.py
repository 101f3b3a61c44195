"""`format("elasticsearch")`: the Spark data source (Elasticsearch and OpenSearch alike); writes in _sink.py."""

from __future__ import annotations

import uuid
from dataclasses import replace

from pyspark.sql import types as T
from pyspark.sql.types import StructType

from sluice.connector import (
    UNORDERED,
    OptionError,
    Options,
    SinkConfig,
    SinkDataSource,
    SourceDataSource,
    TrackingSettings,
    TrackingStreamReader,
    check_option_columns,
    check_pushdown,
    refuse_batch_options_in_stream,
    refuse_tracking_in_batch,
)
from sluice.connectors.elasticsearch._client import Cluster, Connection
from sluice.connectors.elasticsearch._lookup import SearchLookupReader, plan_lookup
from sluice.connectors.elasticsearch._options import (
    LOOKUP_SPEC,
    READ_SPEC,
    WRITE_SPEC,
    ReadOptions,
    WriteOptions,
    error_index_route,
)
from sluice.connectors.elasticsearch._sink import DocPlan, ElasticsearchWritePlan
from sluice.connectors.elasticsearch._source import (
    PitBatchReader,
    PitEnumerator,
    PitLayout,
    PitPushdownReader,
    SliceReader,
    parse_query,
    spark_schema,
)
from sluice.connectors.elasticsearch._tracking import (
    SearchPositions,
    SearchTrackingEnumerator,
    SearchTrackingReader,
    tracking_kind,
)
from sluice.connectors.elasticsearch._types import mapping

NO_TRANSACTIONS = (
    "sink.transactional=true: Elasticsearch and OpenSearch have no transactions across documents. Give documents "
    "ids (mapping.id) and versions (mapping.version or write.version=micro-batch): a retried or replayed write then "
    "changes nothing (docs/elasticsearch.md). Remove sink.transactional."
)
ORDER_OPTIONS = ("sink.mode", "sink.partition-key", "sink.parallelism", "sink.flush-on-checkpoint", "sink.batch-by")


class ElasticsearchDataSource(SinkDataSource, SourceDataSource):
    """`format("elasticsearch")`: see the package docstring for usage."""

    format_name = "elasticsearch"
    no_transactions = NO_TRANSACTIONS
    write_spec = WRITE_SPEC
    read_spec = READ_SPEC
    lookup_spec = LOOKUP_SPEC
    refused_writes = (
        "A document the bulk response refuses with a 4xx other than 429 (a mapping conflict, a value that does not "
        "parse, an id that exists under create or is missing under update), one alone over http.max_content_length, "
        "or a value JSON cannot carry (NaN, infinity)."
    )
    refused_reads = ("a document with a value that does not convert to its field's Spark type (a _source value the "
                     "engine kept unparsed with ignore_malformed or in a field it does not index, several values in "
                     "a field not read as an array), sent aside as its _index, _id and _source")

    def write_options(self) -> Options:
        """write.error-index is a shorthand for the dead-letter route (_options.error_index_route)."""
        return WRITE_SPEC.parse(error_index_route(self.options))

    def primary_key(self, opts: Options) -> tuple[str, ...]:
        """The id columns: one id's changes share a task and keep their order."""
        return tuple(opts["mapping.id"])

    def sink_config(self, opts: Options, schema: StructType) -> SinkConfig:
        if not self.primary_key(opts) and not any(opts.is_set(o) for o in ORDER_OPTIONS):
            # Generated ids: no document has a later change to keep in order.
            return replace(SinkConfig.of(opts), mode=UNORDERED, partition_key=())
        return super().sink_config(opts, schema)

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig,
                   overwrite: bool) -> ElasticsearchWritePlan:
        if overwrite:
            raise OptionError("format 'elasticsearch' cannot overwrite an index atomically; delete the index (or "
                              "write into a new one and move an alias), then use mode('append').")
        conn = Connection.from_options(opts)
        options = WriteOptions.of(opts)
        docs = _doc_plan(options, opts.is_set("write.version"), schema)
        Cluster.of(conn)  # reachable, and the credentials are accepted, before any task starts
        _ensure_index(conn, options, StructType([schema[c] for c in docs.source_columns]))
        return ElasticsearchWritePlan(self.format_name, opts, schema, config, conn, docs, options)


    # ------------------------------------------------------------------ reading
    def _read_parts(self) -> tuple[ReadOptions, StructType, dict[str, str]]:
        """The read's options, and the index's fields as a Spark schema (with each field's mapping type): the union
        of the mappings of every index the name covers (an alias or pattern may name several)."""
        options = ReadOptions.of(self.read_options())
        check_pushdown(options.pushdown)
        conn = options.conn
        _, answer = self.learn_once(("mapping", conn), lambda: conn.request("GET", f"/{conn.index}/_mapping"))
        properties: dict = {}
        for definition in (answer or {}).values():
            properties.update(definition.get("mappings", {}).get("properties", {}))
        schema, kinds = spark_schema(properties, options.read_array_columns)
        if options.read_metadata:
            schema = StructType([T.StructField("_id", T.StringType(), False), *schema.fields])
        return options, schema, kinds

    def schema(self) -> StructType:
        options, schema, kinds = self._read_parts()
        if self.read_options()["tracking.column"]:  # a readStream's (a batch read refuses it): checked at load()
            self._tracking(options, kinds)
        return schema

    def _slice_reader(self, options: ReadOptions, known: StructType, kinds: dict[str, str], schema: StructType,
                      query: dict | None, streaming: bool = False) -> SliceReader:
        conn = options.conn
        missing = [n for n in schema.fieldNames() if n not in known.fieldNames()]
        if missing:
            raise OptionError(f"column(s) {missing} of the given schema are not fields of index '{conn.index}'; its "
                              f"fields: {known.fieldNames()}.")
        return SliceReader(conn, schema, options.read_page_size, options.read_keep_alive, query,
                           options.read_metadata, kinds, self.dead_letters(self.read_options(), streaming),
                           f"read-{uuid.uuid4().hex[:12]}", streaming)

    def reader(self, schema: StructType) -> PitBatchReader:
        refuse_tracking_in_batch(self.read_options(), self.format_name)
        options, known, kinds = self._read_parts()
        conn = options.conn
        reader = self._slice_reader(options, known, kinds, schema, parse_query(options.read_query))
        kind = PitPushdownReader if options.pushdown else PitBatchReader
        return kind(PitEnumerator(conn, options.partitions, options.read_keep_alive), reader, kinds,
                    self.read_observer())

    def _tracking(self, options: ReadOptions, kinds: dict[str, str]) -> tuple[TrackingSettings, SearchPositions]:
        opts = self.read_options()
        settings = TrackingSettings.of(opts, self.format_name)
        tie_breaker = opts["tracking.tie-breaker"]
        kind, key_type = tracking_kind(kinds, settings, tie_breaker, options.conn.index)
        query = parse_query(options.read_query)
        return settings, SearchPositions(settings.column, kind, tie_breaker, key_type, [query] if query else [])

    def streamReader(self, schema: StructType) -> TrackingStreamReader:
        """readStream: the documents a tracking field finds (_tracking.py, docs/tracking.md)."""
        opts = self.read_options()
        refuse_batch_options_in_stream(opts, self.format_name, ("partitions", "pushdown"))
        options, known, kinds = self._read_parts()
        settings, positions = self._tracking(options, kinds)
        conn = options.conn
        rows = self._slice_reader(options, known, kinds, schema, None, streaming=True)
        reads = self.read_observer(event_time=settings.column if positions.kind == "timestamp" else None)
        return TrackingStreamReader(SearchTrackingEnumerator(conn, positions),
                                    SearchTrackingReader(rows, positions, PitLayout.of(conn, None)), settings,
                                    source=(self.format_name, conn.index), reads=reads)

    # ------------------------------------------------------------------ lookup joins
    def lookup_reader(self, opts: Options, on: tuple[str, ...],
                      columns: tuple[str, ...] | None) -> SearchLookupReader:
        """sluice.lookup(df, "elasticsearch", ...): `_mget` by _id, or one `terms` search by a field (_lookup.py)."""
        return plan_lookup(opts, on, columns)


def _doc_plan(options: WriteOptions, version_set: bool, schema: StructType) -> DocPlan:
    """How rows become documents; `version_set`: the user set write.version (it may not join mapping.version)."""
    names = schema.fieldNames()
    ids = options.mapping_id
    single = {"mapping.routing": options.mapping_routing, "mapping.version": options.mapping_version,
              "upsert.op-column": options.upsert_op_column}
    check_option_columns({**single, "mapping.id": ids, "mapping.exclude": options.mapping_exclude,
                          "mapping.text-columns": options.mapping_text_columns}, names)
    operation = options.write_operation
    if not ids and (operation in ("update", "upsert") or options.upsert_op_column):
        what = f"write.operation={operation}" if operation in ("update", "upsert") else "upsert.op-column"
        raise OptionError(f"{what} changes documents by id: set mapping.id to the column(s) that make the id.")
    versioned = options.mapping_version is not None or options.write_version == "micro-batch"
    if options.mapping_version is not None and version_set:
        raise OptionError("mapping.version and write.version both say where versions come from; keep one.")
    if versioned and not ids:
        raise OptionError("external versions (mapping.version, write.version=micro-batch) belong to documents "
                          "with ids: set mapping.id.")
    if versioned and operation != "index":
        why = "the update API takes none" if operation != "create" else "create only succeeds once anyway"
        raise OptionError(f"write.operation={operation} cannot carry external versions ({why}): use "
                          "write.operation=index with whole documents, or drop the versions.")
    version = options.mapping_version
    if version is not None and not isinstance(schema[version].dataType, T.LongType | T.IntegerType | T.ShortType):
        raise OptionError(f"mapping.version '{version}' is {schema[version].dataType.simpleString()}; it must be a "
                          "long (or int) >= 0.")
    for column in options.mapping_text_columns:
        if not isinstance(schema[column].dataType, T.StringType):
            raise OptionError(f"mapping.text-columns '{column}' is {schema[column].dataType.simpleString()}; only "
                              "string columns can be mapped as text.")
    hidden = {*options.mapping_exclude, *(c for c in single.values() if c is not None)}
    source = tuple(c for c in names if c not in hidden)
    return DocPlan(options.index, operation, source, ids, options.mapping_routing, version,
                   options.write_version == "micro-batch", options.upsert_op_column)


def _ensure_index(conn: Connection, options: WriteOptions, source: StructType) -> None:
    """The index exists (created from the schema with index.create=schema), and takes the DataFrame's fields."""
    index = conn.index
    status, _ = conn.request("HEAD", f"/{index}", ok=(404,))
    if status == 404:
        how = options.index_create
        if how == "never":
            raise OptionError(f"index '{index}' does not exist (index.create=never). Create it, or set "
                              "index.create=schema (a mapping from the DataFrame) or server (templates and dynamic "
                              "mapping).")
        if how == "schema":
            body = {"mappings": mapping(source, frozenset(options.mapping_text_columns))}
            status, answer = conn.request("PUT", f"/{index}", body, ok=(400,))
            if status == 400 and "resource_already_exists" not in str(answer):  # another writer made it first
                raise OptionError(f"index '{index}' could not be created from the DataFrame's schema: {answer}")
        return
    _, answer = conn.request("GET", f"/{index}/_mapping")
    for name, definition in (answer or {}).items():
        found = definition.get("mappings", {})
        if str(found.get("dynamic", "true")) == "strict":
            missing = [c for c in source.fieldNames() if c not in found.get("properties", {})]
            if missing:
                raise OptionError(f"index '{name}' has a strict mapping without field(s) {missing} of the "
                                  "DataFrame: add them to the mapping, or leave them out (mapping.exclude).")
