"""The dead-letter route (errors.tolerance=all): records a store refuses, and records a source cannot decode, go to a
target of any sluice format with their reason, through that format's own write plan.

The driver plans the target once, beside the write (`plan_dead_letters`): the `errors.deadletter.*` options are the
target format's options, and its rows have a fixed shape (`DEAD_LETTER_COLUMNS`; a Kafka target takes the record as the
value and the rest as headers, as Kafka Connect's dead-letter queue does; an S2 target the whole dead letter as
JSON). Each task opens a `DeadLetterWriter` on the route: the engine hands it refused entries with their errors on
its manager thread, the store turns them back into the rows they came from (`Store.refused_rows`), and the task's
thread writes them to the target through a second engine writer. A transactional target is staged by the task and
committed by the driver with the write, per (write id, epoch), so a retried task or a replayed micro-batch sends
each refused record aside once.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sluice._errors import OptionError
from sluice._options import Options
from sluice.engine import AsyncSinkWriter, Committer, WriteContext
from sluice.engine._refusals import ErrorPolicy
from sluice.sink._plan import TaskWriter, WritePlan
from sluice.spark._compat import to_arrow_schema

log = logging.getLogger("sluice.sink")

# The dead letter's columns, in a table-like target (tablestore, postgres, clickhouse, ...).
DEAD_LETTER_COLUMNS = StructType([
    StructField("record", StringType()),  # the refused row, as JSON of the user's columns
    StructField("error_class", StringType()),
    StructField("error_message", StringType()),
    StructField("connector", StringType()),  # the format that refused it (or could not decode it)
    StructField("target", StringType()),  # the table, topic, stream or index it was for
    StructField("write_id", StringType()),  # the write (a streaming query's id)
    StructField("micro_batch", LongType()),  # None for batch writes
    StructField("task", IntegerType()),  # the Spark partition
    StructField("failed_at", TimestampType()),
])
_ARROW_COLUMNS = to_arrow_schema(DEAD_LETTER_COLUMNS)  # the batches the tasks make of them
_KAFKA_HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
# Kafka Connect's names for a dead letter's headers (DeadLetterQueueReporter), under sluice's own prefix.
_HEADER_PREFIX = "__sluice.errors."
_TARGET_OPTIONS = ("table", "topic", "stream", "index")  # the options that name a target, in the formats that have them
_MESSAGE_LIMIT = 2000  # characters of an error message kept: a store's message may quote a whole batch


def _shape(format_name: str) -> str:
    """How the target holds a dead letter: 'kafka' (the record as value, the rest as headers), 'body' (one text
    column: S2's record body), else the columns of DEAD_LETTER_COLUMNS."""
    if format_name == "sluice_kafka":
        return "kafka"
    if format_name in ("s2", "s2_upsert"):
        return "body"
    return "columns"


def _spark_schema(shape: str) -> StructType:
    if shape == "kafka":
        return StructType([StructField("value", StringType()), StructField("headers", _KAFKA_HEADERS)])
    if shape == "body":
        return StructType([StructField("body", StringType())])
    return DEAD_LETTER_COLUMNS


@dataclass(frozen=True)
class DeadLetterRoute:
    """The dead-letter target of one write or read, planned on the driver and pickled to every task."""

    plan: WritePlan  # the target format's write plan
    connector: str  # the format whose records are sent aside
    shape: str
    meta: str | None = None  # errors.meta: where the driver notes the records sent aside (sluice doctor)
    # errors.record-as=columns: the write's own columns, kept as they are beside the dead letter's (else JSON)
    columns: pa.Schema | None = None
    # A read's errors.max-records / errors.max-ratio, checked by its tasks (a write's are in its SinkConfig).
    read_bounds: ErrorPolicy | None = None

    @property
    def target_format(self) -> str:
        return self.plan.format_name

    def open(self, context: WriteContext, target: str) -> DeadLetterWriter:
        """A task's writer of dead letters for records meant for `target` (a table, topic, stream or index)."""
        return DeadLetterWriter(self, context, target)

    def committer(self) -> Committer | None:
        """The driver's committer of the target's staged rows, when the target commits on the driver."""
        return self.plan.committer() if self.plan.commits_on_driver else None

    @property
    def where(self) -> str:
        """The target for people: its format and the table, topic, stream or index its options name."""
        named = next((str(self.plan.options[k]) for k in _TARGET_OPTIONS
                      if self.plan.options.get(k)), "")
        return f"{self.target_format} {named}".strip()

    def record(self, records: int, write_id: str) -> None:
        """On the driver, after a commit that sent `records` aside: note it in the MetaService that `sluice doctor`
        reads (errors.meta, else $SLUICE_META, else a table-store target's own `meta`), where one is configured.
        Never fails the write, which is committed: a failure to note it is logged."""
        url = self.meta or os.environ.get("SLUICE_META") or (
            self.plan.options.get("meta") if self.target_format == "tablestore" else None)
        if not url or not records:
            return
        try:
            from sluice.meta import MetaService

            MetaService(url).record_dead_letters(self.where, self.connector, records, write_id)
        except Exception as e:  # observability of a committed write: say so, do not fail it
            log.warning("sluice: %d dead letters of %s were written to %s, but noting them in the MetaService "
                        "failed (sluice doctor will not list them): %s", records, self.connector, self.where, e)


def plan_dead_letters(opts: Options, connector: str, streaming: bool,
                      schema: StructType | None = None) -> DeadLetterRoute | None:
    """On the driver: the write's dead-letter route from its errors.* options; None unless errors.tolerance=all.
    `schema`: the write's columns (errors.record-as=columns keeps them as they are; a read has none to keep)."""
    if opts.get("errors.tolerance", "none") != "all":  # a format without the errors.* options sends nothing aside
        return None
    from sluice.spark._registry import data_source_class

    target = opts["errors.deadletter.format"]
    cls = data_source_class(target)
    if not hasattr(cls, "plan_write"):  # a SinkDataSource (imported here, it would import this module round a circle)
        raise OptionError(f"errors.deadletter.format={target!r} is not a format sluice writes; choose one that is "
                          "(sluice_kafka, tablestore, postgres, s2, ...).")
    settings = {k: v for k, v in dict(opts["errors.deadletter.*"]).items() if k.lower() != "format"}
    if any(k.lower().startswith("errors.") for k in settings):
        raise OptionError("the dead-letter target's own errors.* options cannot be set: a record the dead-letter "
                          "target refuses fails the write (nothing is dropped). Remove errors.deadletter.errors.*.")
    shape = _shape(cls.format_name)
    if cls.format_name == "s2":
        # The body column is the record's body as it is (format=raw): S2's default, json, would write it as the
        # text of {"body": ...}. The target's own `format` cannot be set: errors.deadletter.format names the target.
        settings["format"] = "raw"
    letter_schema = _spark_schema(shape)
    columns = None
    if opts["errors.record-as"] == "columns":
        letter_schema, columns = _with_columns(cls.format_name, shape, schema)
    try:
        plan = cls(settings)._plan(letter_schema, overwrite=False, streaming=streaming)  # type: ignore[attr-defined]
    except OptionError as e:
        raise OptionError(f"the dead-letter target (errors.deadletter.format={target}): {e} Its options are set "
                          "with the errors.deadletter. prefix, e.g. errors.deadletter.table.") from None
    return DeadLetterRoute(plan, connector, shape, opts["errors.meta"], columns)


def _with_columns(target: str, shape: str, schema: StructType | None) -> tuple[StructType, pa.Schema]:
    """errors.record-as=columns: the dead letter's columns with the write's own in place of `record`."""
    if schema is None:
        raise OptionError("errors.record-as=columns keeps a written row's columns, and a read's records that do not "
                          "decode have none: use errors.record-as=json.")
    if shape != "columns":
        raise OptionError(f"errors.record-as=columns needs a table target; errors.deadletter.format={target} holds "
                          "a dead letter as one message: use errors.record-as=json.")
    context = [f for f in DEAD_LETTER_COLUMNS.fields if f.name != "record"]
    clash = sorted({f.name for f in context} & set(schema.fieldNames()))
    if clash:
        raise OptionError(f"errors.record-as=columns: the DataFrame's column(s) {clash} have the names of the dead "
                          "letter's own; rename them, or use errors.record-as=json.")
    return StructType([*schema.fields, *context]), to_arrow_schema(schema)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | datetime.timedelta):
        return str(value)
    return repr(value)


def record_json(rows: pa.Table | Sequence[Mapping[str, object]]) -> list[str]:
    """Each row as JSON text (bytes as UTF-8 text or base64, times in ISO 8601, decimals as text)."""
    listed = rows.to_pylist() if isinstance(rows, pa.Table) else list(rows)
    return [json.dumps(row, default=_json_default, ensure_ascii=False) for row in listed]


class DeadLetterWriter:
    """One task's dead letters: `add` (any thread) collects refused rows with their errors; `drain` (the task's
    thread) writes what was collected to the target; `finish` drains and returns the target's pre-commit message.
    The target's writer opens at the first dead letter: a task that refuses nothing opens nothing."""

    def __init__(self, route: DeadLetterRoute, context: WriteContext, target: str) -> None:
        self.route = route
        self.context = context
        self.target = target
        self._lock = threading.Lock()
        self._pending: list[tuple[list[str] | pa.Table, list[BaseException], float]] = []
        self._task: TaskWriter | None = None
        self._writer: AsyncSinkWriter | None = None
        self.count = 0

    def add(self, rows: pa.Table | Sequence[Mapping[str, object]], errors: Sequence[BaseException]) -> None:
        columns = self.route.columns
        kept: list[str] | pa.Table
        if columns is None:
            kept = record_json(rows)
        else:  # the write's columns as they are (an encoder's refused rows come as dicts of them)
            kept = rows.cast(columns) if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), columns)
        if len(kept) != len(errors):
            raise ValueError(f"{len(kept)} refused rows but {len(errors)} errors")
        with self._lock:
            self._pending.append((kept, list(errors), time.time()))

    def drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for records, errors, at in pending:
            self._write(self._batch(records, errors, at))

    def finish(self) -> Any:
        """Everything collected written and acknowledged; the target's pre-commit message (None: nothing sent)."""
        self.drain()
        if self._writer is None:
            return None
        return self._writer.finish()

    def commit(self) -> None:
        """For a source's read task, which no driver commit follows: finish, and commit what the target staged (a
        target that commits on the driver) here, as the task's own write. A re-read of the same records (a retried
        task, a replayed micro-batch) sends them aside again unless the target's commit is idempotent per the
        task's (write id, epoch, partition): at least once."""
        message = self.finish()
        committer = self.route.committer()
        if committer is not None and message is not None:
            committer.commit([message], self.context)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def _write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._task = self.route.plan.open_task(self.context)
            self._writer = AsyncSinkWriter(self._task.store, self.route.plan.config, context=self.context)
        assert self._task is not None
        encoded = self._task.encode(batch)
        self._writer.write_chunk(encoded.entries, encoded.sizes, running=encoded.running)
        self.count += batch.num_rows

    def _batch(self, records: list[str] | pa.Table, errors: list[BaseException], at: float) -> pa.RecordBatch:
        n = len(records)
        ctx = self.context
        classes = [type(e).__name__ for e in errors]
        messages = [str(e)[:_MESSAGE_LIMIT] for e in errors]
        stamp = datetime.datetime.fromtimestamp(at, datetime.UTC)
        columns = {
            "record": records, "error_class": classes, "error_message": messages,
            "connector": [self.route.connector] * n, "target": [self.target] * n,
            "write_id": [ctx.write_id] * n, "micro_batch": [ctx.epoch] * n, "task": [ctx.partition_id] * n,
            "failed_at": [stamp] * n,
        }
        if isinstance(records, pa.Table):  # errors.record-as=columns: the row's own columns, then the context
            context = _ARROW_COLUMNS.remove(_ARROW_COLUMNS.get_field_index("record"))
            del columns["record"]
            (kept,) = records.combine_chunks().to_batches()
            return pa.RecordBatch.from_arrays([*kept.columns, *pa.RecordBatch.from_pydict(columns, context).columns],
                                              schema=pa.unify_schemas([kept.schema, context]))
        letters = pa.RecordBatch.from_pydict(columns, schema=_ARROW_COLUMNS)
        if self.route.shape == "columns":
            return letters
        if self.route.shape == "body":
            whole = record_json(letters.to_pylist())
            return pa.RecordBatch.from_pydict({"body": whole}, schema=pa.schema([("body", pa.string())]))
        context_names = [name for name in _ARROW_COLUMNS.names if name != "record"]
        headers = [[{"key": _HEADER_PREFIX + name, "value": _header_value(value)}
                    for name, value in row.items() if value is not None]
                   for row in letters.select(context_names).to_pylist()]
        header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
        return pa.RecordBatch.from_pydict({"value": records, "headers": headers},
                                          schema=pa.schema([("value", pa.string()), ("headers", header_type)]))


def _header_value(value: Any) -> bytes:
    return (value.isoformat() if isinstance(value, datetime.datetime) else str(value)).encode()
