"""Options of the S2 formats (names from flink-connector-s2's README): declared once, and parsed once on the driver
into the typed write options of each record kind and the read options; the connection's are in _client.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from sluice.connector import (
    ERROR_OPTIONS,
    PARTITION_ORDERED,
    SINK_SPEC,
    Option,
    OptionError,
    Options,
    OptionSpec,
    TypedOptions,
    check_error_options,
)
from sluice.connectors.s2._client import CONNECTION_OPTIONS
from sluice.connectors.s2._kinds import RecordKind

_TEMPLATE_FIELD = re.compile(r"\{([^{}]+)\}")

SINK_ONLY_OPTIONS = (
    Option("s2.stream", "str", None,
           "Stream to write to; a template over columns routes rows, e.g. orders/{region}.", required=True),
    Option("s2.create-streams", "bool", False, "Create streams that do not exist yet."),
    Option("s2.create-basin", "bool", False, "Create the basin if it does not exist yet."),
    Option("s2.max-append-sessions", "int", 200,
           "Append sessions one task keeps open (one per target stream, up to this many); appends to further "
           "streams go as single requests. Keeps a task within S2's concurrent-stream limit per connection.",
           minimum=0, maximum=900),
    Option("s2.stamp-writer", "bool", False,
           "Add @writer (write/epoch/partition) and @wseq headers so readers can rebuild per-writer order."),
)

APPEND_OPTIONS = (
    Option("format", "choice", "json",
           "Record body: json (one object per row) or raw (a string/binary column, or the column 'body').",
           choices=("json", "raw")),
)

UPSERT_OPTIONS = (
    Option("primary-key", "list", (), "Key columns of the changelog (@key header).", required=True),
    Option("upsert.op-column", "str", None, "Column whose value d, delete, D or -D makes the row a delete."),
    Option("upsert.reduce", "bool", True,
           "Keep only the last change per key within each Arrow batch (as flink-connector-s2 does per request)."),
)


def _check_endpoints(opts: Options) -> None:
    account, basin = opts["s2.endpoints.account"], opts["s2.endpoints.basin"]
    if (account is None) != (basin is None):
        raise OptionError("set both s2.endpoints.account and s2.endpoints.basin, or neither")


def _check_exactly_once(opts: Options) -> None:
    if opts["sink.transactional"] and opts["s2.append-retry-policy"] == "ALL" and opts.is_set("s2.append-retry-policy"):
        raise OptionError(
            "sink.transactional=true with s2.append-retry-policy=ALL: ALL lets the SDK resend appends that may have "
            "landed, which exactly-once cannot allow. Remove s2.append-retry-policy (exactly-once uses "
            "NO_SIDE_EFFECTS) or set it to NO_SIDE_EFFECTS."
        )


def template_columns(template: str) -> list[str]:
    return _TEMPLATE_FIELD.findall(template)


APPEND_SPEC = SINK_SPEC.extend((*CONNECTION_OPTIONS, *SINK_ONLY_OPTIONS, *APPEND_OPTIONS),
                               (_check_endpoints, _check_exactly_once)).renamed("s2")
UPSERT_SPEC = SINK_SPEC.extend((*CONNECTION_OPTIONS, *SINK_ONLY_OPTIONS, *UPSERT_OPTIONS),
                               (_check_endpoints, _check_exactly_once),
                               sink_mode=PARTITION_ORDERED).renamed("s2_upsert")


@dataclass(frozen=True)
class WriteOptions(TypedOptions):
    """The write options both formats have (SINK_ONLY_OPTIONS), parsed and checked once, one field per option; each
    format's own are in its subclass, whose `declared` every field and option must match."""

    kind: ClassVar[RecordKind]
    declared: ClassVar[tuple[Option, ...]] = SINK_ONLY_OPTIONS

    s2_stream: str
    s2_create_streams: bool
    s2_create_basin: bool
    s2_max_append_sessions: int
    s2_stamp_writer: bool


@dataclass(frozen=True)
class AppendWriteOptions(WriteOptions):
    """format("s2") (APPEND_SPEC): one record per row."""

    kind = RecordKind.APPEND
    declared = (*SINK_ONLY_OPTIONS, *APPEND_OPTIONS)

    format: str


@dataclass(frozen=True)
class UpsertWriteOptions(WriteOptions):
    """format("s2_upsert") (UPSERT_SPEC): the upsert changelog."""

    kind = RecordKind.UPSERT
    declared = (*SINK_ONLY_OPTIONS, *UPSERT_OPTIONS)

    primary_key: tuple[str, ...]
    upsert_op_column: str | None
    upsert_reduce: bool


FormatWriteOptions = AppendWriteOptions | UpsertWriteOptions  # what a write plan carries: one format's options


SOURCE_OPTIONS = (
    Option("s2.streams", "list", (), "Streams to read (comma-separated); or use s2.discovery-prefix."),
    Option("s2.discovery-prefix", "str", None, "Read every stream whose name starts with this (new ones too)."),
    Option("s2.discovery-interval-ms", "int", 10_000, "How often streaming reads look for new streams.", minimum=0),
    Option("s2.start", "str", "earliest",
           "earliest (first available record), latest (the tail), a seq num, or a timestamp (ISO 8601 or "
           "timestamp:<epoch ms>)."),
    Option("s2.end", "str", "latest", "Batch reads: where to stop (exclusive): latest, a seq num or a timestamp."),
    Option("s2.read-committed", "bool", True,
           "Read an exactly-once writer's streams up to the last micro-batch it committed, never part of one "
           "(false: up to the tail, a micro-batch still being appended included)."),
    Option("failOnDataLoss", "bool", True,
           "Fail when records to read were trimmed or the stream deleted (false: warn and skip ahead)."),
    Option("max-records-per-trigger", "int", None, "Streaming: most records per micro-batch.", minimum=1),
    Option("max-bytes-per-trigger", "int", None, "Streaming: most metered bytes per micro-batch.", minimum=1),
    Option("s2.max-records-per-partition", "int", 500_000,
           "Cut a stream into partitions of at most this many records, read in parallel (0: never).", minimum=0),
    Option("format", "choice", "binary",
           "binary: the raw record (body as bytes); json: parse bodies into the columns of the given schema.",
           choices=("binary", "json")),
    Option("mode", "choice", "PERMISSIVE",
           "format=json: PERMISSIVE (bad bodies give nulls and _corrupt_record) or FAILFAST (fail).",
           choices=("PERMISSIVE", "FAILFAST")),
)


def _check_streams(opts: Options) -> None:
    if bool(opts["s2.streams"]) == bool(opts["s2.discovery-prefix"]):
        raise OptionError("set exactly one of s2.streams (a list) or s2.discovery-prefix")


UPSERT_SOURCE_OPTIONS = (
    Option("primary-key", "list", (), "Key columns: parsed from the @key header.", required=True),
)


def _check_tolerance(opts: Options) -> None:
    """errors.tolerance=all sends aside bodies that do not parse: they replace mode's handling of them."""
    if opts["errors.tolerance"] != "all":
        return
    if opts.is_set("mode"):
        raise OptionError(f"mode={opts['mode']} and errors.tolerance=all both say what a body that does not parse "
                          "does; errors.tolerance=all sends it to the dead-letter target. Remove one of them.")


def _check_json_tolerance(opts: Options) -> None:
    if opts["errors.tolerance"] == "all" and opts["format"] != "json":
        raise OptionError(f"errors.tolerance=all sends records whose body does not parse aside, and format="
                          f"{opts['format']} parses nothing; set .option('format', 'json') or remove errors.*.")


# errors.*: a record whose body does not parse as a JSON object of the schema goes to a dead-letter target.
READ_SPEC = OptionSpec("s2", (*CONNECTION_OPTIONS, *SOURCE_OPTIONS, *ERROR_OPTIONS),
                       (_check_streams, check_error_options, _check_tolerance, _check_json_tolerance))


UPSERT_READ_SPEC = OptionSpec("s2_upsert", (*CONNECTION_OPTIONS, *SOURCE_OPTIONS, *UPSERT_SOURCE_OPTIONS,
                                            *ERROR_OPTIONS), (_check_streams, check_error_options, _check_tolerance))


@dataclass(frozen=True)
class ReadOptions(TypedOptions):
    """The read options of format("s2") (SOURCE_OPTIONS), parsed and checked once, one field per option; the
    connection's are in Connection."""

    kind: ClassVar[RecordKind] = RecordKind.APPEND
    declared: ClassVar[tuple[Option, ...]] = SOURCE_OPTIONS

    s2_streams: tuple[str, ...]
    s2_discovery_prefix: str | None
    s2_discovery_interval_ms: int
    s2_start: str
    s2_end: str
    s2_read_committed: bool
    fail_on_data_loss: bool
    max_records_per_trigger: int | None
    max_bytes_per_trigger: int | None
    s2_max_records_per_partition: int
    format: str
    mode: str


@dataclass(frozen=True)
class UpsertReadOptions(ReadOptions):
    """The read options of format("s2_upsert"): those of format("s2") and the key columns."""

    kind = RecordKind.UPSERT
    declared = (*SOURCE_OPTIONS, *UPSERT_SOURCE_OPTIONS)

    primary_key: tuple[str, ...]
