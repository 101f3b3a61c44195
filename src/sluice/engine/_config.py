"""The sink.* options every sluice sink shares, and the validated SinkConfig the engine runs on: their typed form,
one field per option (its name without 'sink.'), defaults as declared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice._errors import OptionError
from sluice._options import Option, Options, OptionSpec, TypedOptions, attribute
from sluice.engine._batch import BatchCreator, PartitionKeyBatchCreator, SimpleBatchCreator
from sluice.engine._buffer import DequeRequestBuffer, KeyedRequestBuffer, RequestBuffer
from sluice.engine._refusals import ERROR_OPTIONS, ErrorPolicy, check_error_options

if TYPE_CHECKING:
    from sluice.engine._store import Store

UNORDERED = "unordered"
PARTITION_ORDERED = "partition-ordered"
GLOBAL_ORDERED = "global-ordered"
MODES = (UNORDERED, PARTITION_ORDERED, GLOBAL_ORDERED)

MiB = 1024 * 1024

# Names and defaults follow flink-connector-s2 where it has them (batch 1000, 1 MiB, 1000 ms, 2000, 500).
SINK_OPTIONS: tuple[Option, ...] = (
    Option("sink.batch.max-size", "int", 1000, "Most records in one request to the store.", minimum=1),
    Option("sink.flush-buffer.size", "int", MiB, "Most bytes in one request to the store.", minimum=1),
    Option(
        "sink.flush-buffer.timeout", "int", 1000,
        "Milliseconds an entry may wait in the buffer before everything buffered is flushed.", minimum=1,
    ),
    Option(
        "sink.requests.max-buffered", "int", 2000,
        "Entries buffered before write() blocks (back-pressure). Must exceed sink.batch.max-size.",
        minimum=2,
    ),
    Option("sink.requests.max-inflight", "int", 500, "Most requests in flight at once per task.", minimum=1),
    Option("sink.mode", "choice", UNORDERED, "Delivery mode (see docs/engine.md).", choices=MODES),
    Option(
        "sink.partition-key", "list", (),
        "Columns whose values keep their order (partition-ordered); default: the store's primary key.",
    ),
    Option(
        "sink.parallelism", "int", 16,
        "Buckets (hash of the partition key modulo this) flushed concurrently in partition-ordered mode.",
        minimum=1, maximum=4096,
    ),
    Option(
        "sink.batch-by", "choice", "bucket",
        "partition-ordered only: 'bucket' batches rows of one hash bucket (several keys may share a batch); 'key' "
        "makes every batch hold exactly one partition-key value (FLIP-509's per-partition batches).",
        choices=("bucket", "key"),
    ),
    Option(
        "sink.batch-creator", "str", None,
        "A BatchCreator class to cut batches with, as 'module:Class' (importable on the executors; no-argument "
        "constructor). Default: the connector's, else the mode's (docs/engine.md).",
    ),
    Option(
        "sink.request-buffer", "str", None,
        "A RequestBuffer class to buffer entries in, as 'module:Class' (importable on the executors; no-argument "
        "constructor). Default: the connector's, else the mode's.",
    ),
    Option(
        "sink.transactional", "bool", False,
        "Exactly-once through the store's transactions (needs sink.mode=global-ordered).",
    ),
    Option(
        "sink.flush-on-checkpoint", "bool", False,
        "partition-ordered only: hold data until the end of the task or micro-batch (or max-buffered).",
    ),
    Option("sink.max-retries", "int", 3, "Retries of one batch before the task fails.", minimum=0, maximum=100),
    Option("sink.write-id", "str", None,
           "Batch writes: an id of your choosing for this write. Re-running a failed or uncertain transactional "
           "write with the same id finishes it without duplicates (the same rows in the same order). Streaming "
           "queries use their checkpoint's query id instead."),
    Option(
        "sink.retry-delay-ms", "int", 1000,
        "First retry delay in ms; doubles per attempt, with jitter.", minimum=0,
    ),
    Option(
        "sink.rate.records-per-second", "int", None,
        "A cap on the whole write's records per second, shared evenly by sink.rate.tasks tasks; enforced before "
        "each request, beneath it the engine still slows down when the store says so. Default: no cap.",
        minimum=1,
    ),
    Option(
        "sink.rate.bytes-per-second", "int", None,
        "A cap on the whole write's bytes per second (as encoded for the store), shared like "
        "sink.rate.records-per-second. Default: no cap.",
        minimum=1,
    ),
    Option(
        "sink.rate.tasks", "int", None,
        "The tasks that write at once, among which a rate cap is shared: each gets cap / this. sluice.write sets "
        "it to the smaller of the write's partitions and Spark's default parallelism; other writes with a cap "
        "must set it.",
        minimum=1,
    ),
)

_CAPS = ("sink.rate.records-per-second", "sink.rate.bytes-per-second")


def _check_combinations(opts: Options) -> None:
    mode = opts["sink.mode"]
    if opts["sink.transactional"] and mode != GLOBAL_ORDERED:
        raise OptionError(
            f"sink.transactional=true needs sink.mode=global-ordered (got sink.mode={mode}): "
            "transactions commit one ordered stream of batches per task. Set .option('sink.mode', 'global-ordered')."
        )
    if mode != PARTITION_ORDERED:
        for key in ("sink.partition-key", "sink.parallelism", "sink.flush-on-checkpoint", "sink.batch-by"):
            if opts.is_set(key):
                raise OptionError(
                    f"{key} only applies to sink.mode=partition-ordered (got sink.mode={mode}). "
                    f"Remove {key} or set .option('sink.mode', 'partition-ordered')."
                )
    if opts["sink.batch-creator"]:
        load_class("sink.batch-creator", opts["sink.batch-creator"], BatchCreator)
    if opts["sink.request-buffer"]:
        load_class("sink.request-buffer", opts["sink.request-buffer"], RequestBuffer)
    _check_rate(opts)
    if opts["sink.requests.max-buffered"] <= opts["sink.batch.max-size"]:
        raise OptionError(
            f"sink.requests.max-buffered ({opts['sink.requests.max-buffered']}) must be greater than "
            f"sink.batch.max-size ({opts['sink.batch.max-size']}); raise the first or lower the second."
        )


def _check_rate(opts: Options) -> None:
    caps = [key for key in _CAPS if opts[key] is not None]
    if opts["sink.rate.tasks"] is not None and not caps:
        raise OptionError("sink.rate.tasks only shares a rate cap among tasks, and no cap is set: set "
                          "sink.rate.records-per-second or sink.rate.bytes-per-second, or remove sink.rate.tasks.")
    if caps and opts["sink.rate.tasks"] is None:
        raise OptionError(
            f"{caps[0]} caps the whole write, so each task needs to know its share: set sink.rate.tasks to the "
            "number of tasks that write at once (the smaller of the DataFrame's partitions and the cluster's task "
            "slots), or write with sluice.write(), which sets it."
        )
    for key in caps:
        if opts[key] < opts["sink.rate.tasks"]:
            raise OptionError(
                f"{key}={opts[key]} shared by sink.rate.tasks={opts['sink.rate.tasks']} tasks leaves each less "
                f"than 1 per second; raise {key} or lower sink.rate.tasks."
            )


def load_class(option: str, path: str, base: type) -> type:
    """The class `path` ('module:Class' or 'module.Class') names, checked to subclass `base`; errors name `option`."""
    import importlib

    module_name, _, class_name = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not class_name:
        raise OptionError(f"{option}={path!r} must name a class as 'module:Class', e.g. "
                          f"'sluice.engine:{base.__name__}'.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise OptionError(f"{option}={path!r}: module '{module_name}' cannot be imported ({e}). It must be "
                          "installed on the driver and every executor.") from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, base):
        what = "is not in" if cls is None else "is not a subclass of " + base.__name__ + " in"
        raise OptionError(f"{option}={path!r}: '{class_name}' {what} module '{module_name}'; name a "
                          f"{base.__name__} subclass.")
    return cls


SINK_SPEC = OptionSpec("sink", SINK_OPTIONS + ERROR_OPTIONS, (_check_combinations, check_error_options))


_NO_TOLERANCE = ErrorPolicy()  # errors.tolerance=none: a refused record fails the write

# Each field's default is its option's (direct construction, in the engine's own tests, starts from them too).
_DEFAULT = {attribute(o.name.removeprefix("sink.")): o.default for o in SINK_OPTIONS}


@dataclass(frozen=True)
class SinkConfig(TypedOptions):
    """What the engine needs, validated: `SinkConfig.of(opts)` from a write's parsed options (or directly, in the
    engine's own tests)."""

    declared = SINK_OPTIONS
    prefix = "sink."

    batch_max_size: int = _DEFAULT["batch_max_size"]  # records per request
    flush_buffer_size: int = _DEFAULT["flush_buffer_size"]  # bytes per request
    flush_buffer_timeout: int = _DEFAULT["flush_buffer_timeout"]  # ms an entry may wait
    requests_max_buffered: int = _DEFAULT["requests_max_buffered"]
    requests_max_inflight: int = _DEFAULT["requests_max_inflight"]
    mode: str = _DEFAULT["mode"]
    partition_key: tuple[str, ...] = _DEFAULT["partition_key"]
    parallelism: int = _DEFAULT["parallelism"]
    batch_by: str = _DEFAULT["batch_by"]
    batch_creator: str | None = _DEFAULT["batch_creator"]  # 'module:Class', instantiated per task
    request_buffer: str | None = _DEFAULT["request_buffer"]
    transactional: bool = _DEFAULT["transactional"]
    flush_on_checkpoint: bool = _DEFAULT["flush_on_checkpoint"]
    max_retries: int = _DEFAULT["max_retries"]
    write_id: str | None = _DEFAULT["write_id"]
    retry_delay_ms: int = _DEFAULT["retry_delay_ms"]
    rate_records_per_second: int | None = _DEFAULT["rate_records_per_second"]  # the whole write's cap
    rate_bytes_per_second: int | None = _DEFAULT["rate_bytes_per_second"]
    rate_tasks: int | None = _DEFAULT["rate_tasks"]  # tasks the caps are shared by, evenly
    # A streaming query's write: planned, run and committed again every micro-batch, so a store may keep its
    # connections between them (not an option: Spark decides).
    streaming: bool = False
    errors: ErrorPolicy = _NO_TOLERANCE  # the errors.* options: what a record the store refuses does

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise OptionError(f"sink.mode must be one of {', '.join(MODES)}; got {self.mode!r}")

    @classmethod
    def derived(cls, opts: Options) -> dict[str, Any]:
        return {"streaming": False, "errors": ErrorPolicy.of(opts)}

    def make_batch_creator(self) -> BatchCreator | None:
        """A new instance of the sink.batch-creator class, or None when the option is not set."""
        return load_class("sink.batch-creator", self.batch_creator, BatchCreator)() if self.batch_creator else None

    def make_request_buffer(self) -> RequestBuffer | None:
        """A new instance of the sink.request-buffer class, or None when the option is not set."""
        return load_class("sink.request-buffer", self.request_buffer, RequestBuffer)() if self.request_buffer \
            else None

    def mode_batching(self) -> tuple[BatchCreator, RequestBuffer]:
        """The mode's own BatchCreator and RequestBuffer, for a write whose options and connector choose none: per
        partition key in partition-ordered mode, else in arrival order."""
        if self.mode == PARTITION_ORDERED:
            return PartitionKeyBatchCreator(), KeyedRequestBuffer()
        return SimpleBatchCreator(), DequeRequestBuffer()

    def task_rate(self) -> tuple[float | None, float | None]:
        """One task's even share of the write's caps (records/s, bytes/s); None where no cap is set."""
        tasks = self.rate_tasks or 1
        return (None if self.rate_records_per_second is None else self.rate_records_per_second / tasks,
                None if self.rate_bytes_per_second is None else self.rate_bytes_per_second / tasks)

    @property
    def effective_max_inflight(self) -> int:
        # Global order means exactly one request in flight: the next one waits for the previous ack.
        return 1 if self.mode == GLOBAL_ORDERED else self.requests_max_inflight

    def check_store_limits(self, store_name: str, store: Store | type[Store]) -> None:
        """A store's hard limits, its class attributes, bound the options (e.g. S2: <= 1000 records and <= 1 MiB per
        batch). Checked on the driver before a write (SinkDataSource.store_type) and by the engine as it starts."""
        max_record_bytes, max_batch_records, max_batch_bytes = (store.max_record_bytes, store.max_batch_records,
                                                                store.max_batch_bytes)
        if max_batch_records is not None and self.batch_max_size > max_batch_records:
            raise OptionError(
                f"sink.batch.max-size={self.batch_max_size} exceeds {store_name}'s limit of "
                f"{max_batch_records} records per request; use a value <= {max_batch_records}."
            )
        if max_batch_bytes is not None and self.flush_buffer_size > max_batch_bytes:
            raise OptionError(
                f"sink.flush-buffer.size={self.flush_buffer_size} exceeds {store_name}'s limit of "
                f"{max_batch_bytes} bytes per request; use a value <= {max_batch_bytes}."
            )
        if max_record_bytes is not None and self.flush_buffer_size < max_record_bytes:
            raise OptionError(
                f"sink.flush-buffer.size={self.flush_buffer_size} is smaller than {store_name}'s largest record "
                f"({max_record_bytes} bytes), so a large record could never be sent; raise it to >= {max_record_bytes}."
            )
