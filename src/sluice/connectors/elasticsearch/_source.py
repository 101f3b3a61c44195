"""`format("elasticsearch")` reads: a sliced point-in-time search (FLIP-27's split enumerator and split reader).

The enumerator opens one point in time (PIT) over the index: every split sees the index as it was at that moment,
whatever is written meanwhile. Each split is one slice of it (`slice: {id, max}`), read page by page with
`search_after` on the engine's tiebreaker (`_shard_doc`; `_doc` in slices of one shard on OpenSearch 2). Columns
are pruned through `_source`, Spark's filters on keyword, numeric, date and boolean fields become query-DSL
filters, and `read.query` adds a query of the user's.
The PIT is closed by its keep-alive (`read.keep-alive`): Spark tells a batch reader's driver side nothing when the
last split is read.
A document holding a value the read cannot type (a `_source` value the engine kept unparsed, with `ignore_malformed`
or in a field it does not index) fails the read, or with errors.tolerance=all goes to the read's dead letters as
its index, `_id` and `_source` (`build_or_aside`; the others are read).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from sluice.connector import (
    DeadLetterRoute,
    DeadLetterWriter,
    OptionError,
    ReadObserver,
    Split,
    SplitBatchReader,
    SplitEnumerator,
    SplitReader,
    ValueTypeError,
    build_or_aside,
    read_with_letters,
    to_arrow_schema,
)
from sluice.connectors.elasticsearch._client import Cluster, Connection

SCALARS = {"keyword": T.StringType(), "text": T.StringType(), "match_only_text": T.StringType(),
           "constant_keyword": T.StringType(), "wildcard": T.StringType(), "ip": T.StringType(),
           "version": T.StringType(), "long": T.LongType(), "integer": T.IntegerType(), "short": T.ShortType(),
           "byte": T.ByteType(), "unsigned_long": T.DecimalType(20, 0), "double": T.DoubleType(),
           "float": T.FloatType(), "half_float": T.FloatType(), "scaled_float": T.DoubleType(),
           "boolean": T.BooleanType(), "date": T.TimestampType(), "date_nanos": T.TimestampType(),
           "binary": T.BinaryType()}
# Fields whose stored value a term or range query matches as written (text is analyzed: Spark compares it).
FILTERABLE = {"keyword", "constant_keyword", "long", "integer", "short", "byte", "double", "float", "half_float",
              "scaled_float", "boolean", "date", "date_nanos", "ip"}


def spark_schema(properties: dict, arrays: frozenset[str], prefix: str = "") -> tuple[T.StructType, dict[str, str]]:
    """The Spark schema of a mapping's properties, and each top-level-or-nested field's mapping type by path."""
    fields, kinds = [], {}
    for name, definition in properties.items():
        path = f"{prefix}{name}"
        kind = definition.get("type", "object" if "properties" in definition else None)
        if kind in ("object", "nested"):
            inner, inner_kinds = spark_schema(definition.get("properties", {}), arrays, f"{path}.")
            kinds.update(inner_kinds)
            data_type: T.DataType = T.ArrayType(inner) if kind == "nested" else inner
        elif kind in SCALARS:
            data_type = SCALARS[kind]
        else:
            data_type = T.StringType()  # geo points, ranges and other structured fields: their JSON text
        kinds[path] = kind or "object"
        if path in arrays and not isinstance(data_type, T.ArrayType):
            data_type = T.ArrayType(data_type)
        fields.append(T.StructField(name, data_type))
    return T.StructType(fields), kinds


def _timestamp(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, int | float):  # epoch_millis
        return dt.datetime.fromtimestamp(value / 1000, dt.UTC)
    parsed = dt.datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def python_value(value: Any, data_type: T.DataType, path: str) -> Any:
    """A _source value as the Python value pyarrow builds `data_type` from."""
    if value is None:
        return None
    if isinstance(data_type, T.ArrayType):
        values = value if isinstance(value, list) else [value]
        return [python_value(v, data_type.elementType, path) for v in values]
    if isinstance(value, list):
        raise OptionError(f"field '{path}' holds several values in a document; read it as an array with "
                          f"read.array-columns={path}.")
    if isinstance(data_type, T.StructType):
        return {f.name: python_value(value.get(f.name), f.dataType, f"{path}.{f.name}") for f in data_type.fields}
    if isinstance(data_type, T.TimestampType):
        return _timestamp(value)
    if isinstance(data_type, T.BinaryType):
        return base64.b64decode(value)
    if isinstance(data_type, T.StringType):
        return value if isinstance(value, str) else json.dumps(value)
    if isinstance(data_type, T.IntegralType):
        return int(value)
    if isinstance(data_type, T.FractionalType) and not isinstance(data_type, T.DecimalType):
        return float(value)
    return value


_RANGES = {"GreaterThan": "gt", "GreaterThanOrEqual": "gte", "LessThan": "lt", "LessThanOrEqual": "lte"}


def filter_clause(f: Any, kinds: dict[str, str]) -> dict | None:
    """A Spark filter as a query-DSL clause, or None when the engine cannot apply it exactly."""
    kind = type(f).__name__
    attribute = getattr(f, "attribute", None)
    if attribute is None or kinds.get(".".join(attribute)) not in FILTERABLE:
        return None
    field = ".".join(attribute)
    value: Any = getattr(f, "value", None)  # a scalar, or In's tuple of them
    if isinstance(value, dt.datetime | dt.date):
        value = value.isoformat()
    if kind == "EqualTo" and value is not None:
        return {"term": {field: value}}
    if kind == "In" and None not in value:
        return {"terms": {field: [v.isoformat() if isinstance(v, dt.date) else v for v in value]}}
    if kind in _RANGES and value is not None:
        return {"range": {field: {_RANGES[kind]: value}}}
    if kind == "IsNotNull":
        return {"exists": {"field": field}}
    if kind == "IsNull":
        return {"bool": {"must_not": {"exists": {"field": field}}}}
    if kind == "StringStartsWith":
        return {"prefix": {field: value}}
    return None


@dataclass(frozen=True)
class PitLayout:
    """How point-in-time reads of an index are cut and paged: the engine, the slices and the sort that breaks ties
    (appended to a read's own sort keys). Learnt on the driver, pickled to tasks."""

    opensearch: bool
    slices: int
    tiebreak: list[dict]

    @classmethod
    def of(cls, conn: Connection, partitions: int | None) -> PitLayout:
        """`partitions`: the slices wanted (default: the primary shards)."""
        opensearch = Cluster.of(conn).engine == "opensearch"
        _, settings = conn.request("GET", f"/{conn.index}/_settings", filter_path="*.settings.index.number_of_shards")
        shards = sum(int(s["settings"]["index"]["number_of_shards"]) for s in settings.values())
        count = partitions or shards
        tiebreak: list[dict] = [{"_shard_doc": "asc"}]
        if opensearch:
            # OpenSearch 2 has no _shard_doc: _doc, unique within a shard, and slices of one shard each (a slice
            # count of at least the shard count cuts by shard first); over several indices _id breaks the ties.
            count = max(count, shards)
            tiebreak = [{"_doc": "asc"}] + ([{"_id": "asc"}] if len(settings) > 1 else [])
        return cls(opensearch, count, tiebreak)

    def open(self, conn: Connection, keep_alive: str) -> str:
        """A new point in time over the index: its id."""
        path = "_search/point_in_time" if self.opensearch else "_pit"
        _, answer = conn.request("POST", f"/{conn.index}/{path}", keep_alive=keep_alive)
        return answer.get("pit_id") or answer.get("id")

    def close(self, conn: Connection, pit: str) -> None:
        """Frees a point in time before its keep-alive ends (one already gone is no error)."""
        if self.opensearch:
            conn.request("DELETE", "/_search/point_in_time", {"pit_id": [pit]}, ok=(404,))
        else:
            conn.request("DELETE", "/_pit", {"id": pit}, ok=(404,))


class PitEnumerator(SplitEnumerator):
    """One point in time over the index, cut into `partitions` slices (default: the primary shards)."""

    def __init__(self, conn: Connection, partitions: int | None, keep_alive: str) -> None:
        self.conn, self.partitions, self.keep_alive = conn, partitions, keep_alive

    def discover(self) -> list[Split]:
        layout = PitLayout.of(self.conn, self.partitions)
        pit = layout.open(self.conn, self.keep_alive)
        return [Split(f"slice:{i}", {"pit": pit, "slice": i, "max": layout.slices, "sort": layout.tiebreak})
                for i in range(layout.slices)]

    def start_position(self, split: Split) -> int:
        return 0

    def end_position(self, split: Split) -> int:
        return 1


class SliceReader(SplitReader):
    """Reads one slice of the point in time, page by page with search_after, into Arrow batches."""

    def __init__(self, conn: Connection, schema: T.StructType, page_size: int, keep_alive: str,
                 query: dict | None, metadata: bool, kinds: dict[str, str], dead_letters: DeadLetterRoute | None = None,
                 read_id: str = "", streaming: bool = False) -> None:
        """`dead_letters`: where documents with a value the read cannot type go (errors.tolerance=all), named after
        the streaming query, else `read_id`."""
        self.dead_letters, self.read_id, self.streaming = dead_letters, read_id, streaming
        self.conn, self.schema, self.page_size, self.keep_alive = conn, schema, page_size, keep_alive
        self.query, self.metadata = query, metadata
        self.filters: list[dict] = []  # pushed by Spark
        # Top-level date fields come from doc values in one ISO format, whatever format the documents used.
        self.dates = [f.name for f in schema.fields if kinds.get(f.name) in ("date", "date_nanos")]

    def body(self, split: Split) -> dict:
        source = [f.name for f in self.schema.fields
                  if not (self.metadata and f.name == "_id") and f.name not in self.dates]
        clauses = [*self.filters, *([self.query] if self.query else [])]
        body: dict[str, Any] = {
            "size": self.page_size, "_source": source or False,
            "pit": {"id": split.info["pit"], "keep_alive": self.keep_alive},
            "sort": split.info["sort"], "track_total_hits": False,
            "query": {"bool": {"filter": clauses}} if clauses else {"match_all": {}}}
        if split.info["max"] > 1:
            body["slice"] = {"id": split.info["slice"], "max": split.info["max"]}
        if self.dates:
            body["docvalue_fields"] = [{"field": f, "format": "strict_date_optional_time_nanos"} for f in self.dates]
        return body

    def value(self, hit: dict, field: T.StructField) -> Any:
        if self.metadata and field.name == "_id":
            return hit["_id"]
        if field.name in self.dates:
            values = hit.get("fields", {}).get(field.name)
            if values is None:
                return None
            return values if isinstance(field.dataType, T.ArrayType) or len(values) > 1 else values[0]
        return hit.get("_source", {}).get(field.name)

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        return read_with_letters(self.dead_letters, self.read_id, self.streaming, self.conn.index,
                                 lambda letters: self.pages(split, letters))

    def pages(self, split: Split, letters: DeadLetterWriter | None) -> Iterator[pa.RecordBatch]:
        """The slice's documents, a page at a time; those with a value the read cannot type go to `letters` (None:
        they fail the read)."""
        arrow = to_arrow_schema(self.schema)
        body = self.body(split)
        while True:
            _, answer = self.conn.request("POST", "/_search", body)
            hits = answer["hits"]["hits"]
            if not hits:
                return
            batch = build_or_aside(hits, lambda some: self.batch(some, arrow), letters, self.described, _letter)
            if batch.num_rows:
                yield batch
            body["search_after"] = hits[-1]["sort"]
            body["pit"]["id"] = answer.get("pit_id", body["pit"]["id"])

    def batch(self, hits: Sequence[dict], arrow: pa.Schema) -> pa.RecordBatch:
        """The hits as one batch of the schema; a value that does not convert raises a ValueTypeError naming its
        field (and the value, for one hit)."""
        arrays = []
        for f in self.schema.fields:
            kind = arrow.field(f.name).type
            try:
                arrays.append(pa.array([python_value(self.value(hit, f), f.dataType, f.name) for hit in hits], kind))
            except (ValueError, TypeError, ArithmeticError, pa.ArrowException) as e:
                shown = f"the value {_shown(self.value(hits[0], f))} of" if len(hits) == 1 else "a value of"
                raise ValueTypeError(f"{shown} field '{f.name}' does not convert to {f.dataType.simpleString()}: "
                                     f"{e}") from None
        return pa.RecordBatch.from_arrays(arrays, schema=arrow)

    def described(self, hit: dict) -> str:
        return f"elasticsearch index '{hit.get('_index', self.conn.index)}', document '{hit.get('_id')}'"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


def _letter(hit: dict) -> dict[str, Any]:
    """A refused document's dead letter: its index, id and _source (the fields the read asked for) as it came."""
    return {"_index": hit.get("_index"), "_id": hit.get("_id"), "_source": hit.get("_source")}


class PitBatchReader(SplitBatchReader):
    """The batch read: slices of one point-in-time search."""

    enumerator: PitEnumerator
    reader: SliceReader

    def __init__(self, enumerator: PitEnumerator, reader: SliceReader, kinds: dict[str, str],
                 reads: ReadObserver | None) -> None:
        super().__init__(enumerator, reader, None, reads=reads)
        self.kinds = kinds  # each field's mapping type, by dotted path


class PitPushdownReader(PitBatchReader):
    """pushdown=true: Spark's filters on exact-valued fields go into the query (Spark 4.1+ hands Python readers their
    filters)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        for f in filters:
            clause = filter_clause(f, self.kinds)
            if clause is None:
                yield f
            else:
                self.reader.filters.append(clause)


def parse_query(text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        query = json.loads(text)
    except ValueError as e:
        raise OptionError(f"read.query is not JSON ({e}); give a query-DSL object, e.g. "
                          "{\"match\": {\"title\": \"spark\"}}.") from None
    if not isinstance(query, dict):
        raise OptionError("read.query must be a JSON object (a query-DSL query).")
    return query
