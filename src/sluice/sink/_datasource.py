"""`SinkDataSource`: an engine-based store as the sink of a Spark Python Data Source with Arrow writers.

A sink subclasses it and implements:
  - `write_spec`   its options (usually SINK_SPEC.extend(...): the engine's sink.* options too; a sink that
                   declares none takes the sink.* options alone),
  - `plan_write()` on the driver, once: validate, then return a `WritePlan` (sluice/sink/_plan.py) whose
                   `open_task()` gives each task its encoder and Store, and whose `committer()` gives the
                   driver its Committer for transactional writes,
  - optionally `primary_key()`, `resolve_options()`, `partitioning()` and `write_order()`.
Everything a task needs travels in the plan; the tasks' side is sluice/sink/_arrow_writers.py.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark.sql.types import StructType

from sluice._errors import OptionError
from sluice._options import Options, OptionSpec
from sluice.engine import PARTITION_ORDERED, SINK_SPEC, SinkConfig, Store
from sluice.metrics._server import find_target
from sluice.sink._arrow_writers import EngineArrowWriter, EngineStreamArrowWriter, check_batching
from sluice.sink._deadletters import plan_dead_letters
from sluice.sink._encoding import check_writable
from sluice.sink._plan import WritePlan
from sluice.spark._datasource import SluiceDataSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class SinkDataSource(SluiceDataSource):
    # The connector's Store class where it has hard limits (max_record_bytes, max_batch_records, max_batch_bytes):
    # the sink.* options are checked against them on the driver, before any task. None: no limits.
    store_type: ClassVar[type[Store] | None] = None
    # Why the store has no transactions and what gives exactly-once results instead: said when a write sets
    # sink.transactional=true, before the store is asked anything. None: the plan's committer() decides.
    no_transactions: ClassVar[str | None] = None
    # Whether any column type is fine (sluice_null drops everything); else check_writable() refuses some.
    writes_any_type: ClassVar[bool] = False
    write_spec: ClassVar[OptionSpec]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.write_spec is None or cls.write_spec.options is SINK_SPEC.options:  # declared none: sink.* alone
            cls.write_spec = SINK_SPEC.renamed(cls.format_name)

    def write_options(self) -> Options:
        return self.write_spec.parse(self.options)

    # ---- connector hooks
    def primary_key(self, opts: Options) -> tuple[str, ...]:
        return ()

    def resolve_options(self, opts: Options) -> Options:
        """On the driver, before the write: fill in what comes from the driver's environment (e.g. tokens)."""
        return opts

    def partitioning(self, opts: Options, schema: StructType) -> tuple[str, ...] | None:
        """Columns whose rows must share a task for the mode's guarantee; () = one task; None = any layout."""
        config = self._sink_config(opts, schema)
        return config.partition_key if config.mode == PARTITION_ORDERED else None

    def with_layout_columns(self, opts: Options, df: DataFrame) -> DataFrame:
        """`df` with the columns `partitioning` names that the store computes from each row (Kafka's partition of a
        key), for `sluice.write` to lay the rows out by; `df` itself when there are none."""
        return df

    def write_order(self, opts: Options, schema: StructType) -> tuple[str, ...]:
        """Columns `sluice.write` sorts each task's rows by after partitioning, so that a batch creator grouping
        rows by them finds each group's rows together rather than scattered over the task; () = input order."""
        return ()

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig, overwrite: bool) -> WritePlan:
        """On the driver, once per write: validate the schema, options and mode against the store, then return
        the plan every task opens its writer from. Refuse what cannot be written here, before any task starts."""
        raise NotImplementedError

    def refuse_overwrite(self, overwrite: bool) -> None:
        if overwrite:
            raise OptionError(
                f"format '{self.format_name}' does not support mode('overwrite'); use mode('append')."
            )

    # ---- Spark entry points
    def _sink_config(self, opts: Options, schema: StructType) -> SinkConfig:
        """The write's SinkConfig: a format without transactions refuses them first, then the connector decides."""
        if self.no_transactions is not None and opts["sink.transactional"]:
            raise OptionError(self.no_transactions)
        return self.sink_config(opts, schema)

    def sink_config(self, opts: Options, schema: StructType) -> SinkConfig:
        config = SinkConfig.of(opts)
        if config.mode != PARTITION_ORDERED:
            return config
        key = config.partition_key or self.primary_key(opts)
        if not key:
            raise OptionError(
                f"sink.mode=partition-ordered needs sink.partition-key (columns whose order is kept) for "
                f"format '{self.format_name}'. Set .option('sink.partition-key', 'col1,col2')."
            )
        missing = [c for c in key if c not in schema.fieldNames()]
        if missing:
            option = "sink.partition-key" if config.partition_key else "primary-key"  # where the key came from
            raise OptionError(
                f"{option} column(s) {missing} are not in the DataFrame "
                f"(columns: {schema.fieldNames()})."
            )
        return SinkConfig(**{**config.__dict__, "partition_key": tuple(key)})

    def _plan(self, schema: StructType, overwrite: bool, streaming: bool) -> WritePlan:
        opts = self.resolve_options(self.write_options())
        if streaming and opts.get("sink.write-id"):
            raise OptionError("sink.write-id is for batch writes: a streaming query's writes are identified by its "
                              "checkpoint (query id and batch id). Remove sink.write-id.")
        if not self.writes_any_type:
            check_writable(self.format_name, schema)
        config = dataclasses.replace(self._sink_config(opts, schema), streaming=streaming)
        if self.store_type is not None:
            config.check_store_limits(self.format_name, self.store_type)
        plan = self.plan_write(opts, schema, config, overwrite)
        if config.transactional and plan.committer() is None:
            raise OptionError(
                f"sink.transactional=true, but format '{self.format_name}' has no transactions; "
                "remove sink.transactional."
            )
        check_batching(plan)
        return plan

    def writer(self, schema: StructType, overwrite: bool) -> EngineArrowWriter:
        plan = self._plan(schema, overwrite, streaming=False)
        return EngineArrowWriter(plan, plan.options.get("sink.write-id") or uuid.uuid4().hex, find_target(),
                                 plan_dead_letters(plan.options, self.format_name, streaming=False, schema=schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> EngineStreamArrowWriter:
        plan = self._plan(schema, overwrite, streaming=True)
        return EngineStreamArrowWriter(plan, uuid.uuid4().hex, find_target(),
                                       plan_dead_letters(plan.options, self.format_name, streaming=True, schema=schema))
