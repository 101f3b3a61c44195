"""`format("s2")` and `format("s2_upsert")`: the Spark data sources; writes in _sink.py, reads in _source.py (the
driver's side) and _reader.py."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import ClassVar

from pyspark.sql.types import StructType

from sluice.connector import (
    PARTITION_ORDERED,
    UNORDERED,
    OptionError,
    Options,
    SinkConfig,
    SinkDataSource,
    SourceDataSource,
    SplitBatchReader,
    SplitStreamReader,
    WriteContext,
)
from sluice.connectors.s2._client import Connection
from sluice.connectors.s2._codec import S2Encoder, StreamRouter
from sluice.connectors.s2._options import (
    APPEND_SPEC,
    READ_SPEC,
    UPSERT_READ_SPEC,
    UPSERT_SPEC,
    AppendWriteOptions,
    FormatWriteOptions,
    ReadOptions,
    UpsertReadOptions,
    UpsertWriteOptions,
)
from sluice.connectors.s2._reader import S2Reader
from sluice.connectors.s2._sink import S2WritePlan
from sluice.connectors.s2._source import DEFAULT_SCHEMA, S2Enumerator
from sluice.connectors.s2._store import S2Store

ROUTED_PARALLELISM = 4096  # the most sink.parallelism allows: buckets ~ streams
ROUTED_MAX_BUFFERED = 50_000


class _S2Base(SinkDataSource, SourceDataSource):
    read_spec = READ_SPEC
    write_spec = APPEND_SPEC
    # The typed form of each spec's options (the record kind comes with it).
    read_options_type: ClassVar[type[ReadOptions]] = ReadOptions
    write_options_type: ClassVar[type[FormatWriteOptions]] = AppendWriteOptions
    store_type = S2Store

    def resolve_options(self, opts: Options) -> Options:
        conn = Connection.from_options(opts)  # reads S2_* from the driver's environment, validates
        return opts.with_values(s2_auth_token=conn.token, s2_endpoints_account=conn.account_endpoint,
                                s2_endpoints_basin=conn.basin_endpoint)

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig, overwrite: bool) -> S2WritePlan:
        if overwrite:
            raise OptionError(f"format '{self.format_name}' cannot overwrite: S2 streams are append-only. "
                              "Use mode('append').")
        write = self.write_options_type.of(opts)
        # Build an encoder once on the driver so column problems surface before any task starts.
        S2Encoder(write, schema.fieldNames(), WriteContext(), stamp=False)
        # From the options resolve_options filled in: executors need no S2_* environment of their own.
        conn = Connection.from_options(opts, exactly_once=config.transactional)
        return S2WritePlan(self.format_name, opts, schema, config, write, conn)

    def write_order(self, opts: Options, schema: StructType) -> tuple[str, ...]:
        """Rows routed over a template, one stream's side by side in its task (`sluice.write`): a stream's batch is
        then cut from its own rows as they come, not from the few of them a buffer shared with thousands of other
        streams holds when it fills (10,000 streams: an append per ~30 rows, bench/stores/s2_many_streams.py)."""
        return tuple(StreamRouter(self.write_options_type.of(opts).s2_stream, schema.fieldNames()).columns)

    def sink_config(self, opts: Options, schema: StructType) -> SinkConfig:
        config = super().sink_config(opts, schema)
        columns = tuple(StreamRouter(self.write_options_type.of(opts).s2_stream, schema.fieldNames()).columns)
        if not columns or config.mode != UNORDERED:
            return config
        # Rows routed over a template (the sink-modes design's split table): batch per target stream, as FLIP-509's
        # per-key batches do, or every append would carry a row or two of each stream (1,000 streams: 57 s instead of
        # 4 s for 100k rows, bench/stores/s2_many_streams.py). Keyed batching also keeps each stream's order per task,
        # which only strengthens `unordered`. A larger buffer lets per-stream batches fill up.
        return replace(
            config, mode=PARTITION_ORDERED, partition_key=columns,
            parallelism=config.parallelism if opts.is_set("sink.parallelism") else ROUTED_PARALLELISM,
            requests_max_buffered=config.requests_max_buffered if opts.is_set("sink.requests.max-buffered")
            else ROUTED_MAX_BUFFERED)

    def partitioning(self, opts: Options, schema: StructType) -> tuple[str, ...] | None:
        if SinkConfig.of(opts).transactional:
            # Exactly-once: each stream has one writer per micro-batch.
            return tuple(StreamRouter(self.write_options_type.of(opts).s2_stream, schema.fieldNames()).columns)
        return super().partitioning(opts, schema)

    # ------------------------------------------------------------------ reading
    def schema(self) -> str:
        return DEFAULT_SCHEMA

    def _read_parts(self, schema: StructType, batch: bool) -> tuple[S2Enumerator, S2Reader, int | None, ReadOptions]:
        opts = self.read_options()
        conn = Connection.from_options(opts)  # resolved on the driver; executors get it with the reader
        options = self.read_options_type.of(opts)
        upsert = isinstance(options, UpsertReadOptions)
        materialize = batch and upsert  # the latest row per key, as a table
        if isinstance(options, UpsertReadOptions):
            missing = [c for c in options.primary_key if c not in schema.fieldNames()]
            if missing:
                raise OptionError(f"primary-key column(s) {missing} are not in the schema {schema.simpleString()}")
        per_partition = options.s2_max_records_per_partition or None
        if materialize:
            per_partition = None  # a stream is materialized as a whole
        route = self.dead_letters(opts, streaming=not batch)  # a batch read's dead letters: named by a read id
        reader = S2Reader(conn, schema, options, materialize=materialize, dead_letters=route,
                          read_id=f"read-{uuid.uuid4().hex[:12]}", streaming=not batch)
        return S2Enumerator(conn, options, batch), reader, per_partition, options

    def reader(self, schema: StructType) -> SplitBatchReader:
        enumerator, reader, per_partition, _ = self._read_parts(schema, batch=True)
        return SplitBatchReader(enumerator, reader, per_partition,
                                reads=self.read_observer(event_time="timestamp"))

    def streamReader(self, schema: StructType) -> SplitStreamReader:
        enumerator, reader, per_partition, options = self._read_parts(schema, batch=False)
        what = options.s2_streams or [f"{options.s2_discovery_prefix or ''}*"]
        return SplitStreamReader(enumerator, reader, per_partition, options.max_records_per_trigger,
                                 options.max_bytes_per_trigger,
                                 source=(self.format_name, f"{enumerator.conn.basin}/{','.join(what)}"),
                                 reads=self.read_observer(event_time="timestamp"))


class S2DataSource(_S2Base):
    """Insert-only appends: one record per row, body = the row as JSON (or a raw column)."""

    format_name = "s2"
    refused_reads = ("with format=json, a record whose body is not a JSON object of the read's schema, sent aside "
                     "as its stream, seq num, timestamp, headers and body")
    refused_writes = ("A record over S2's limit of 1 MiB of metered bytes, and with format=raw a row whose body is "
                      "NULL; S2 refuses no record for its content otherwise (an append is all or nothing).")


class S2UpsertDataSource(_S2Base):
    """An upsert changelog compatible with flink-connector-s2: @key and @action headers, body = non-key columns."""

    format_name = "s2_upsert"
    refused_writes = ("A record over S2's limit of 1 MiB of metered bytes, and a row with a NULL primary-key "
                      "column; S2 refuses no record for its content otherwise (an append is all or nothing).")
    write_spec = UPSERT_SPEC
    read_spec = UPSERT_READ_SPEC
    read_options_type = UpsertReadOptions
    write_options_type = UpsertWriteOptions
    refused_reads = ("a change whose @key header or body is not a JSON object of the read's schema, sent aside as "
                     "its stream, seq num, timestamp, headers and body")

    def schema(self) -> str:
        raise OptionError("reading format 's2_upsert' needs a schema of the key and value columns: "
                          "spark.read.format('s2_upsert').schema('id long, status string, amount double')...; "
                          "for streaming reads add '_op string' to get each change's action (u or d)")

    def primary_key(self, opts: Options) -> tuple[str, ...]:
        return UpsertWriteOptions.of(opts).primary_key
