"""Lookup joins on HBase (`sluice.lookup(df, "hbase", ...)`, docs/lookup.md): a `LookupReader` that reads the rows
of an Arrow batch's distinct row keys with Thrift2 `getMultiple` calls, one per region, several in flight at once.

`on` is the row key: the columns the rowkey option names, all of them for a composite key, and nothing else (a Get
reads one whole row key; a part of one is a range of rows, a scan). HBase cells are bytes, so the columns' types
come from the `schema` option (Spark DDL, what `.schema(...)` gives a batch read), and the catalog options (rowkey,
family, columns) place them as for `spark.read.format("hbase")`: the keys are encoded by the connector's key codec
(_keys.py) and the results decoded by the batch read's own code (`HBaseReader.decoded`), so a looked-up column is
typed and decoded exactly as the read types and decodes it.

The TGets go sorted by row key and grouped by the region holding them (the regions' start keys, read once on the
driver), at most `lookup.max-keys-per-request` a call; up to `lookup.max-concurrent-requests` calls are in flight at
once (run_requests), each from a thread of the worker process with its own Thrift2 connection (_client.py's
`Connection.client` is per thread), reused by the worker's later tasks and micro-batches. The gateway's Java client
(`Table.get(List<Get>)`) would split one call by region server itself; a call per region lets several regions'
reads proceed on several gateway handlers at once. With `lookup.max-concurrent-requests=1` the batch is not split by
region (a call per region, one after the other, would only add round trips). With
`lookup.repartition-by-region`, `placement()` shuffles the rows by the region holding each key first (_regions.py),
so a task's call goes to one region server.

What a lookup reads: each row as an HBase Get reads it, the newest cell of each looked-up column, committed only
(HBase's per-row MVCC: a Get sees a row's puts whole, never part of one). HBase has no snapshot across rows: two
keys of one batch are two reads. A failure that passes (no answer from the gateway, a region moving, busy or its
server restarting) sends that getMultiple again `lookup.max-retries` times, backing off; then the task fails
naming the table and the gateway. A lookup never returns no rows for a key it could not ask about.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

import pyarrow as pa
from pyspark.sql.types import DataType, StructField, StructType

from sluice.connector import (
    KeyPlacement,
    LookupReader,
    OptionError,
    Options,
    RetryableError,
    ValueTypeError,
    lookup_retry_pause,
    require_name,
    run_requests,
    slices,
    to_arrow_schema,
)
from sluice.connectors.hbase._catalog import Catalog
from sluice.connectors.hbase._cells import decoder
from sluice.connectors.hbase._client import Connection, HBaseError, describe, regions, thrift
from sluice.connectors.hbase._keys import KeyCodec
from sluice.connectors.hbase._options import LookupOptions
from sluice.connectors.hbase._regions import RegionMap, RegionPlacement
from sluice.connectors.hbase._source import HBaseReader


class HBaseLookupReader(LookupReader):
    """Rows of one table by row key: see the module's docstring. Made by `plan_lookup` on the driver."""

    def __init__(self, conn: Connection, rows: HBaseReader, schema: StructType, retries: int,
                 starts: tuple[bytes, ...] = (b"",), concurrency: int = 1, keys_per_request: int = 1_000) -> None:
        self.conn, self.rows, self.retries = conn, rows, retries
        self._schema = schema
        self.table = rows.catalog.table
        self.starts = starts  # the regions' start keys, in key order, read on the driver
        self.concurrency, self.keys_per_request = concurrency, keys_per_request
        self._placement: RegionPlacement | None = None

    @property
    def schema(self) -> StructType:
        return self._schema

    @property
    def described(self) -> str:
        return f"HBase table {self.table} at {self.conn.display(self.table)}"

    def placement(self) -> KeyPlacement | None:
        return self._placement

    def lookup(self, keys: pa.Table) -> pa.Table:
        arrow = self.rows.schema
        batch = pa.RecordBatch.from_arrays([keys.column(name).combine_chunks() for name in keys.column_names],
                                           names=keys.column_names)
        keyless = self.rows.key.keyless(batch)
        if keyless.any():  # keys the codec cannot encode: no row has them
            batch = batch.filter(pa.array(~keyless))
        if batch.num_rows == 0:
            return arrow.empty_table()
        module = thrift()
        cells = self.rows.catalog.cells
        columns = [module.TColumn(family=c.family, qualifier=c.qualifier) for _, c in cells] or None
        encoded = sorted(self.rows.key.encode(batch))
        gets = [module.TGet(row=row, columns=columns, maxVersions=1) for row in encoded]
        starts = self.starts if self.concurrency > 1 else (b"",)
        requests = _by_region(encoded, gets, starts, self.keys_per_request)
        answers = run_requests(("hbase", self.conn.display(self.table)), self.concurrency, self._get, requests)
        found = [r for answer in answers for r in answer if r.row and r.columnValues]
        if not found:
            return arrow.empty_table()
        try:
            return pa.Table.from_batches([self.rows.decoded(found)], schema=arrow)
        except ValueTypeError as e:
            raise HBaseError(f"a row looked up in {self.described} does not decode as the schema option types it: "
                             f"{e}. Give each column the type it was written with, or leave it out with "
                             "columns=[...].", store="hbase", target=self.conn.display(self.table)) from None

    def _get(self, gets: list[Any]) -> list[Any]:
        """The getMultiple's results, in the order of `gets` (an empty result for a row the table lacks); the call
        again on a failure that passes."""
        gateway = _task_index()
        table = self.table.encode()
        for attempt in range(self.retries + 1):
            try:
                return list(self.conn.call("getMultiple", table, gets, index=gateway))
            except RetryableError as e:  # ThrottledError too: a busy region
                error: Exception = e
            except HBaseError as e:  # the gateway answered with a refusal: the same call fails again
                raise HBaseError(f"looking up {len(gets)} key(s) in {self.described} failed: {e}", store="hbase",
                                 target=self.conn.display(self.table)) from None
            if attempt == self.retries:
                break
            lookup_retry_pause(self.described, len(gets), attempt, self.retries, error)
        raise HBaseError(f"looking up {len(gets)} key(s) in {self.described} failed after {self.retries + 1} "
                         f"attempt(s) (lookup.max-retries={self.retries}): {error}", store="hbase",
                         target=self.conn.display(self.table))


def _by_region(keys: list[bytes], gets: list[Any], starts: tuple[bytes, ...], size: int) -> list[list[Any]]:
    """`gets` (sorted by their row keys, `keys`) in requests of one region's keys, at most `size` a request. The
    regions are those read when the lookup was planned: a region split since only makes a request span two."""
    requests: list[list[Any]] = []
    begin = 0
    while begin < len(keys):
        region = bisect.bisect_right(starts, keys[begin]) - 1
        end = (bisect.bisect_left(keys, starts[region + 1], begin) if region + 1 < len(starts) else len(keys))
        requests += [gets[begin + start:begin + start + length] for start, length in slices(end - begin, size)]
        begin = end
    return requests


def _task_index() -> int:
    """Which gateway of `host` a task asks: by its partition id, as reads and writes pick theirs."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def parse_schema(ddl: str) -> StructType:
    """The `schema` option (Spark DDL) as a StructType, parsed by Spark as `.schema(...)` parses it."""
    from pyspark.errors import ParseException

    try:
        parsed = DataType.fromDDL(ddl)
    except ParseException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OptionError(f"schema={ddl!r} is no list of columns and types ({first[:300]}); give it as .schema(...) "
                          "takes one, e.g. 'id long, name string'.") from None
    if not isinstance(parsed, StructType):
        raise OptionError(f"schema={ddl!r} is a type, not a list of columns and types; name the row key's columns "
                          "and the looked-up ones, e.g. 'id long, name string'.")
    return parsed


def key_columns(on: tuple[str, ...], catalog: Catalog) -> None:
    """Refuses an `on` that is not the row key, every column of the rowkey option (a Get reads one whole key)."""
    for key in on:
        require_name(key, catalog.key, "key column", f"the row key of HBase table {catalog.table} (option rowkey)",
                     advice="A lookup reads rows by their row key (an HBase Get); on= names the rowkey option's "
                     "columns, as the DataFrame names them.")
    missing = [c for c in catalog.key if c not in on]
    if missing:
        raise OptionError(f"on={list(on)} is part of the row key of HBase table {catalog.table}, whose columns are "
                          f"{list(catalog.key)} (option rowkey); missing: {missing}. A lookup reads rows by their "
                          "whole row key (an HBase Get); rows sharing a part of it are a range: read it with "
                          "spark.read.format('hbase') and a filter.")


def plan_lookup(opts: Options, on: tuple[str, ...], columns: tuple[str, ...] | None) -> HBaseLookupReader:
    """The reader of a lookup in the table the options name: the schema, the key, the looked-up columns and their
    types checked on the driver, and the table and its families asked for, so that each is refused here, named."""
    options = LookupOptions.of(opts)
    schema = parse_schema(options.schema)
    catalog = Catalog.from_options(opts, schema.fieldNames())
    key_columns(on, catalog)
    cells = [name for name, _ in catalog.cells]
    for name in columns or ():
        if name not in catalog.key:
            require_name(name, cells, "looked-up column", f"the schema option of HBase table {catalog.table}",
                         advice="Add it to the schema option with its type, or leave it out of columns=[...].")
    wanted = [n for n in dict.fromkeys(columns if columns is not None else cells) if n not in catalog.key]
    fields = [StructField(f.name, f.dataType, True) for f in (schema[n] for n in [*on, *wanted])]
    spark_schema = StructType(fields)
    arrow = to_arrow_schema(spark_schema)
    key = KeyCodec.for_schema(catalog.key, arrow)  # refuses a key column of a type no row key has
    for name in wanted:  # refuses a type no cell holds
        decoder(arrow.field(name).type, name)
    read = dataclasses.replace(catalog, cells=tuple((n, c) for n, c in catalog.cells if n in wanted))
    conn = Connection.from_options(opts)
    read.check_families(describe(conn, catalog.table).families)  # refuses a table or family that does not exist
    rows = HBaseReader(conn, read, key, arrow, rows_per_fetch=1, time_range=None)
    region_map = RegionMap.of(regions(conn, catalog.table))
    reader = HBaseLookupReader(conn, rows, spark_schema, options.lookup_max_retries, region_map.starts,
                               options.lookup_max_concurrent_requests, options.lookup_max_keys_per_request)
    if options.lookup_repartition_by_region:
        reader._placement = RegionPlacement(region_map, key, options.lookup_partitions_per_server)
    return reader
