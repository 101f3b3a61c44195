"""The connector SDK: everything a connector implements and may call, in one public module (docs/connectors.md).

A sink is a `SinkDataSource` subclass with an `OptionSpec` and a `plan_write()` that returns a `WritePlan`;
the plan's `open_task()` gives each Spark task an encoder (Arrow RecordBatch -> `Encoded`) and a `Store`
(one `submit(batch)` per request; `BlockingStore` for blocking clients). Transactional sinks add a `Committer`.
The engine does the buffering, batching (`BatchCreator`/`RequestBuffer`, FLIP-509), ordering, retries and
back-pressure. A store declares which failures are per record: a `RecordError` for a batch it refused for one of its
records (the engine splits the batch to find it), `RefusedRecords` for the entries a per-item response refused; with
errors.tolerance=all they go to the dead-letter target, as the rows `Store.refused_rows` gives back.
A source is a `SplitEnumerator` (driver) and a `SplitReader` (executors), served to Spark by
`SplitBatchReader` / `SplitStreamReader` (FLIP-27) from a `SourceDataSource` subclass; a format that is both
subclasses both. A store without a change feed streams by a tracking column: a `TrackingEnumerator` and a
`TrackingReader` served by `TrackingStreamReader`, its options `tracking_options()` (docs/tracking.md). A stream
reader with per-trigger caps is an `AdmissionControlledReader`; reads report live metrics through the data
source's `read_observer()` (`observed`), a stream's lag through `SourceReporter`; a read that cannot decode or type a
record sends it to the route `SourceDataSource.dead_letters()` planned, its task run by `read_with_letters`
(`conform_or_aside`: rows with a value that does not convert to the schema go aside; `build_or_aside`: records a
reader builds its batch from, one holding a value it cannot type going aside as it came). A store that serves
lookup joins (`sluice.lookup`, docs/lookup.md) declares `SourceDataSource.lookup_spec` (with `LOOKUP_OPTIONS`, the
cache's, typed by `LookupCacheSettings`) and returns a `LookupReader` from `lookup_reader()`: rows by distinct keys,
in bulk, in Arrow; its `placement()` may return a `KeyPlacement`, by which the rows are shuffled first. A batch's
keys go as requests of `lookup.max-keys-per-request` (`slices`), up to `lookup.max-concurrent-requests` in flight
(`run_requests`: the worker process's pool of the store client; results in the requests' order).
`to_arrow_schema` / `from_arrow_schema` convert schemas the same way on every Spark line, and `require` refuses an
option the running line cannot honour. `register_format` makes a format known to `sluice.write()` and
`sluice.register()`. Payload formats through a schema registry (sluice/formats): a `PayloadFormat` decodes and
encodes `RegisteredSchema`s' records in bulk on Arrow (`PayloadError` naming the record), a `RegistryClient` on
`RegistrySettings` resolves schemas, `subject_name` applies Confluent's subject name strategies, and
`split_payloads` / `frame_payloads` take Confluent's wire format off and put it on whole arrays.

Built-in connectors (ClickHouse, ...) are written on these names only.
"""

from sluice._client_certs import ClientCertificate, client_certificate, refused_certificate, server_alert
from sluice._errors import (
    ConflictError,
    DataLossError,
    OptionError,
    RecordError,
    RecordTooLargeError,
    RefusedRecords,
    RestartNeededError,
    RetryableError,
    RetryEntries,
    SinkError,
    SluiceError,
    ThrottledError,
)
from sluice._micro_batch import micro_batch_numbers
from sluice._names import case_hint, check_dataframe_columns, check_option_columns, require_name
from sluice._options import Option, Options, OptionSpec, PrefixSettings, TypedOptions, check_http_endpoint
from sluice._schema_evolution import (
    ADD_COLUMNS,
    FULL,
    SourceColumn,
    new_columns,
    schema_evolution_option,
    source_columns,
    source_metadata,
    without_source_marks,
)
from sluice._unchanged import (
    check_unchanged_column,
    fill_unchanged,
    marked_columns,
    marked_rows,
    refuse_unchanged,
    unchanged_column_option,
)
from sluice._upsert import (
    DELETE_OPS,
    DELETE_OPS_SQL,
    TRUNCATE_OP,
    VALUELESS_OPS_SQL,
    TruncateRefusedError,
    check_key_columns,
    delete_mask,
    first_null,
    refuse_truncate,
)
from sluice.engine import (
    GLOBAL_ORDERED,
    PARTITION_ORDERED,
    SINK_SPEC,
    UNORDERED,
    AlignedBatchCreator,
    Batch,
    BatchCreator,
    BatchRun,
    BlockingStore,
    Committer,
    DequeRequestBuffer,
    ErrorKind,
    KeyedRequestBuffer,
    PartitionKeyBatchCreator,
    RequestBuffer,
    RequestInfo,
    SimpleBatchCreator,
    SinkConfig,
    Store,
    WriteContext,
    completed_future,
)
from sluice.engine._refusals import ERROR_OPTIONS, ErrorPolicy, check_error_options
from sluice.formats._avro import AvroFormat
from sluice.formats._codec import PayloadError, PayloadFormat, RegisteredSchema, SchemaType
from sluice.formats._json_schema import JsonSchemaFormat
from sluice.formats._protobuf import ProtobufFormat
from sluice.formats._registry import RegistryClient, RegistrySettings
from sluice.formats._subjects import subject_name
from sluice.formats._wire import Framed
from sluice.formats._wire import frame as frame_payloads
from sluice.formats._wire import split as split_payloads
from sluice.meta import HoldingHeartbeat
from sluice.metrics._push import SourceReporter
from sluice.metrics._reads import ReadObserver, observed
from sluice.metrics._report import SourceReport
from sluice.sink._arrow_writers import EngineArrowWriter, EngineStreamArrowWriter, task_context
from sluice.sink._datasource import SinkDataSource
from sluice.sink._deadletters import DEAD_LETTER_COLUMNS, DeadLetterRoute, DeadLetterWriter, plan_dead_letters
from sluice.sink._encoding import (
    ArrowRows,
    binary_column,
    binary_running_sums,
    binary_sizes,
    body_column_name,
    check_writable,
    conform,
)
from sluice.sink._plan import Encoded, Encoder, TaskWriter, WritePlan
from sluice.sink._replay import ReplayGuard
from sluice.source import (
    Split,
    SplitBatchReader,
    SplitEnumerator,
    SplitGroup,
    SplitPartition,
    SplitReader,
    SplitStreamReader,
)
from sluice.source._bounds import forward_bounds
from sluice.source._datasource import SourceDataSource
from sluice.source._deadletters import (
    SEND_ASIDE,
    ValueTypeError,
    build_or_aside,
    conform_or_aside,
    read_with_letters,
)
from sluice.source._lookup import (
    LOOKUP_OPTIONS,
    KeyPlacement,
    LookupCacheSettings,
    LookupReader,
    lookup_max_retries,
    lookup_retry_pause,
)
from sluice.source._lookup_requests import (
    lookup_max_concurrent_requests,
    lookup_max_keys_per_request,
    run_requests,
    slices,
)
from sluice.source._offset import SparkOffset, check_offset_version
from sluice.source._pushdown import check_pushdown, pushdown_option
from sluice.source._stream import OpenStreamReaderCore, StreamReaderCore
from sluice.source._tracking import (
    TrackingEnumerator,
    TrackingPosition,
    TrackingReader,
    TrackingStreamReader,
    parse_value,
)
from sluice.source._tracking_column import tracking_column_kind
from sluice.source._tracking_options import (
    TrackingSettings,
    refuse_batch_options_in_stream,
    refuse_tracking_in_batch,
    tracking_options,
)
from sluice.source._tracking_sql import SqlTrackingEnumerator, TrackingSql
from sluice.spark._compat import (
    HAS_FILTER_PUSHDOWN,
    AdmissionControlledReader,
    Filter,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
    from_arrow_schema,
    require,
    to_arrow_schema,
)
from sluice.spark._registry import add_format as register_format

__all__ = [
    "ADD_COLUMNS",
    "DEAD_LETTER_COLUMNS",
    "DELETE_OPS",
    "DELETE_OPS_SQL",
    "ERROR_OPTIONS",
    "FULL",
    "GLOBAL_ORDERED",
    "HAS_FILTER_PUSHDOWN",
    "LOOKUP_OPTIONS",
    "PARTITION_ORDERED",
    "SEND_ASIDE",
    "SINK_SPEC",
    "TRUNCATE_OP",
    "UNORDERED",
    "VALUELESS_OPS_SQL",
    "AdmissionControlledReader",
    "AlignedBatchCreator",
    "ArrowRows",
    "AvroFormat",
    "Batch",
    "BatchCreator",
    "BatchRun",
    "BlockingStore",
    "ClientCertificate",
    "Committer",
    "ConflictError",
    "DataLossError",
    "DeadLetterRoute",
    "DeadLetterWriter",
    "DequeRequestBuffer",
    "Encoded",
    "Encoder",
    "EngineArrowWriter",
    "EngineStreamArrowWriter",
    "ErrorKind",
    "ErrorPolicy",
    "Filter",
    "Framed",
    "HoldingHeartbeat",
    "JsonSchemaFormat",
    "KeyPlacement",
    "KeyedRequestBuffer",
    "LookupCacheSettings",
    "LookupReader",
    "OpenStreamReaderCore",
    "Option",
    "OptionError",
    "OptionSpec",
    "Options",
    "PartitionKeyBatchCreator",
    "PayloadError",
    "PayloadFormat",
    "PrefixSettings",
    "ProtobufFormat",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxBytes",
    "ReadMaxRows",
    "ReadObserver",
    "RecordError",
    "RecordTooLargeError",
    "RefusedRecords",
    "RegisteredSchema",
    "RegistryClient",
    "RegistrySettings",
    "ReplayGuard",
    "RequestBuffer",
    "RequestInfo",
    "RestartNeededError",
    "RetryEntries",
    "RetryableError",
    "SchemaType",
    "SimpleBatchCreator",
    "SinkConfig",
    "SinkDataSource",
    "SinkError",
    "SluiceError",
    "SourceColumn",
    "SourceDataSource",
    "SourceReport",
    "SourceReporter",
    "SparkOffset",
    "Split",
    "SplitBatchReader",
    "SplitEnumerator",
    "SplitGroup",
    "SplitPartition",
    "SplitReader",
    "SplitStreamReader",
    "SqlTrackingEnumerator",
    "Store",
    "StreamReaderCore",
    "SupportsTriggerAvailableNow",
    "TaskWriter",
    "ThrottledError",
    "TrackingEnumerator",
    "TrackingPosition",
    "TrackingReader",
    "TrackingSettings",
    "TrackingSql",
    "TrackingStreamReader",
    "TruncateRefusedError",
    "TypedOptions",
    "ValueTypeError",
    "WriteContext",
    "WritePlan",
    "binary_column",
    "binary_running_sums",
    "binary_sizes",
    "body_column_name",
    "build_or_aside",
    "case_hint",
    "check_dataframe_columns",
    "check_error_options",
    "check_http_endpoint",
    "check_key_columns",
    "check_offset_version",
    "check_option_columns",
    "check_pushdown",
    "check_unchanged_column",
    "check_writable",
    "client_certificate",
    "completed_future",
    "conform",
    "conform_or_aside",
    "delete_mask",
    "fill_unchanged",
    "first_null",
    "forward_bounds",
    "frame_payloads",
    "from_arrow_schema",
    "lookup_max_concurrent_requests",
    "lookup_max_keys_per_request",
    "lookup_max_retries",
    "lookup_retry_pause",
    "marked_columns",
    "marked_rows",
    "micro_batch_numbers",
    "new_columns",
    "observed",
    "parse_value",
    "plan_dead_letters",
    "pushdown_option",
    "read_with_letters",
    "refuse_batch_options_in_stream",
    "refuse_tracking_in_batch",
    "refuse_truncate",
    "refuse_unchanged",
    "refused_certificate",
    "register_format",
    "require",
    "require_name",
    "run_requests",
    "schema_evolution_option",
    "server_alert",
    "slices",
    "source_columns",
    "source_metadata",
    "split_payloads",
    "subject_name",
    "task_context",
    "to_arrow_schema",
    "tracking_column_kind",
    "tracking_options",
    "unchanged_column_option",
    "without_source_marks",
]
