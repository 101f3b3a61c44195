"""`sluice.lookup(df, format, options, on=...)`: a lookup join planned on the driver and run by `mapInArrow`.

Why `mapInArrow`: the DataFrame's rows reach the Python worker as Arrow batches and leave as Arrow batches, so
keys are deduplicated, looked up and joined back without a row becoming a Python object (a UDF per row would open
the way to a request per row; `applyInArrow` would need a grouping and a shuffle the lookup does not need). It works
alike on batch and streaming DataFrames and on Spark Connect (a DataFrame operation, no RDD and no SparkContext),
and keeps the DataFrame's partitioning: each task looks up its own rows' keys, unless the reader places keys
(`LookupReader.placement`: Cassandra's replicas), when the rows are shuffled by it first (_lookup_placement.py).

Everything that can be refused is refused here, before any work: the options (unknown ones with a did-you-mean,
secrets never shown), the key columns missing from the DataFrame, the table's lack of a key or looked-up column,
a key type the store's key does not take, a looked-up column whose name the DataFrame already has.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.types import DataType, DecimalType, IntegralType, StringType, StructField, StructType

from sluice._errors import OptionError
from sluice._names import case_hint
from sluice.metrics._lookups import LookupObserver
from sluice.source._lookup import LookupCacheSettings, arrow_rows
from sluice.source._lookup_join import LookupPlan
from sluice.spark._compat import to_arrow_schema
from sluice.spark._registry import FORMATS, data_source_class

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

HOW = ("left", "inner")


def _takes(store: DataType, given: DataType) -> bool:
    """Whether a key of the DataFrame's type `given` can be looked up against the store's key of type `store`: the
    same type, or both integers (a value out of the store's range matches nothing; an unsigned 64-bit key, read as
    decimal(20,0), takes any integer), or both strings."""
    if store == given:
        return True
    whole = isinstance(store, IntegralType) or (isinstance(store, DecimalType) and store.scale == 0 and
                                                store.precision >= 20)
    return (whole and isinstance(given, IntegralType)) or \
        (isinstance(store, StringType) and isinstance(given, StringType))


def plan_lookup(df_schema: StructType, format: str, options: Mapping[str, object], on: str | Sequence[str],
                how: str, columns: Sequence[str] | None) -> tuple[LookupPlan, StructType]:
    """(the plan the workers run, the output schema), everything checked; see the module's docstring."""
    from sluice.source._datasource import SourceDataSource

    if how not in HOW:
        raise OptionError(f"how={how!r}: a lookup join is 'left' (rows without a match keep nulls) or 'inner' (they "
                          "are dropped)")
    keys = (on,) if isinstance(on, str) else tuple(on)
    if not keys or len(set(keys)) != len(keys):
        raise OptionError(f"on={on!r}: name the key columns, each once")
    source_class = data_source_class(format)
    if not issubclass(source_class, SourceDataSource) or source_class.lookup_spec is None:
        able = sorted(name for name in FORMATS if _has_lookups(name))
        raise OptionError(f"format '{format}' has no lookup joins; formats that have: {', '.join(able)}")
    source = source_class(options={k: str(v) for k, v in options.items()})
    opts = source.lookup_options()  # options first: an unknown one is refused before anything is asked
    names = df_schema.fieldNames()
    for key in keys:
        if key not in names:
            raise OptionError(f"key column '{key}' (on=) is not a DataFrame column"
                              f"{case_hint(key, names, 'the DataFrame')}; its columns: {names}")
    reader = source.lookup_reader(opts, keys, tuple(columns) if columns is not None else None)
    store = {f.name: f.dataType for f in reader.schema.fields}
    for key in keys:
        given = df_schema[key].dataType
        if not _takes(store[key], given):
            raise OptionError(
                f"key column '{key}' is {given.simpleString()} in the DataFrame, but the key {key} of "
                f"{reader.described} is read as {store[key].simpleString()}: cast it "
                f"(df.withColumn('{key}', df['{key}'].cast('{store[key].simpleString()}'))).")
    added = [f for f in reader.schema.fields if f.name not in keys]
    for field in added:
        if field.name in names:
            raise OptionError(f"looked-up column '{field.name}' of {reader.described} is already a DataFrame "
                              "column: rename the DataFrame's, or leave it out with columns=[...]")
    out = StructType([*df_schema.fields, *(StructField(f.name, f.dataType, True) for f in added)])
    rows = arrow_rows(reader.schema)
    looked_up = tuple(f.with_nullable(True) for f in to_arrow_schema(StructType(added)))
    lookup_id = uuid.uuid4().hex
    plan = LookupPlan(reader, keys, how, looked_up, rows, LookupCacheSettings.of(opts), lookup_id,
                      LookupObserver.on_driver(format, lookup_id))
    return plan, out


def _has_lookups(name: str) -> bool:
    from sluice.source._datasource import SourceDataSource

    try:
        cls = data_source_class(name)
    except ImportError:  # a format whose client library is not installed
        return False
    return issubclass(cls, SourceDataSource) and cls.lookup_spec is not None


def lookup(df: DataFrame, format: str, options: Mapping[str, object], on: str | Sequence[str], how: str = "left",
           columns: Sequence[str] | None = None) -> DataFrame:
    plan, out = plan_lookup(df.schema, format, options, on, how, columns)
    return planned(df, plan, out)


def planned(df: DataFrame, plan: LookupPlan, out: StructType) -> DataFrame:
    """The lookup `plan_lookup` planned, run on `df`: shuffled first when the reader places keys (a shuffle: the
    DataFrame's partitioning and its rows' order within a task are then the placement's)."""
    from sluice.source._lookup_placement import placed

    placement = plan.reader.placement()
    if placement is not None:
        df = placed(df, placement, plan.on, tuple(plan.rows.field(name).type for name in plan.on))
    return df.mapInArrow(plan.run, out)
