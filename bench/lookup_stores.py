"""Requests in flight at once on ClickHouse, OpenSearch and HBase: one task's lookups/s at
lookup.max-concurrent-requests 1 against the default (4), and one request a batch, beside the store's bare client.

Run: `.venv/bin/python -m bench.lookup --measure concurrency --store clickhouse|opensearch|hbase [--rows 200000]
[--keys-high 10000] [--batches 10]` (bench/lookup.py's PostgreSQL measure, `--store postgres`, for the other stores).
The table `dim` of --rows rows (id 1 .. rows; name 'name-<id>', value id x 7), --batches batches of --keys-high keys
drawn uniformly over 1 .. 1.1 x rows (about one in eleven missing; bench/lookup.py's draw, seed 11), in one process
without Spark, against a server on the same 2 cores:
- clickhouse: ClickHouse 26.9's engine (chdb-core) behind the tests' HTTP stand-in (tests/clickhouse_chdb/; the
  only server binary the registries offer, Debian's 18.16, is one sluice refuses), `dim` a MergeTree ordered by id;
  sluice's `IN (SELECT arrayJoin({k0:Array(Int64)}))` queries with the keys as a query parameter, against
  clickhouse-connect (ClickHouse's Python client) sending one `SELECT ... WHERE id IN (k1, ...)` a batch with the
  keys in the statement, `query_arrow`.
- opensearch: one OpenSearch 2.19 node (`LocalOpenSearch`, full JIT, 1 GiB heap), index `dim` (1 shard, 0 replicas;
  name keyword, value long; documents' _id the id's text), looked up by `_id` (an `_mget` a request); against
  opensearch-py (OpenSearch's Python client) sending one `mget` of the batch's ids, `_source_includes` name, value,
  the found documents to Arrow columns.
- hbase: one standalone HBase 2.6 (`LocalHBase`, full JIT, 1 GiB heap, one region server) and its Thrift2 gateway,
  `dim` (row key id long; name, value in family d) pre-split into 8 regions of equal id ranges; sluice's
  `getMultiple` calls (a call per region and at most lookup.max-keys-per-request keys, sent concurrently; one call
  of the batch's keys at lookup.max-concurrent-requests 1), against a bare thriftpy2 client (the Thrift runtime
  sluice's client and happybase are built on, with the same Cython codecs) sending one `getMultiple` of the batch's
  keys, the cells decoded to Arrow columns in Python.
sluice's path is `enrich` as one task runs it (dedupe, the requests, rows to Arrow, the join back); the bare loops
take the batch's distinct keys and build Arrow columns, no join. Each setting and the bare loop run alternately after
an untimed pass, the best of three each; keys looked up per second are the batches' distinct keys over the seconds.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np
import pyarrow as pa

from bench.lookup_cassandra import keys_of

REGIONS = 8  # hbase: the table's regions, as bench/lookup_hbase.py's default


def sluice_seconds(store: str, options: dict[str, str], key: str, batches: list[pa.RecordBatch]) -> float:
    """Seconds for sluice's worker path (one task's `enrich`) over the batches; every key's row checked once."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from sluice.metrics._lookups import LookupTally
    from sluice.source._lookup_dataframe import plan_lookup
    from sluice.source._lookup_join import enrich

    schema = StructType([StructField(key, StringType() if key == "_id" else LongType())])
    plan, _ = plan_lookup(schema, FORMATS[store], {**options, "lookup.cache": "none"}, key, "left", None)
    try:
        started = time.perf_counter()
        out = [enrich(plan, batch, None, LookupTally()) for batch in batches]
        seconds = time.perf_counter() - started
    finally:
        plan.reader.close(clean=True)
    check(out[0], key)
    return seconds


def check(enriched: pa.RecordBatch | pa.Table, key: str) -> None:
    """The looked-up rows are the table's: name-<id> and id x 7 for every key found, and most keys found."""
    ids = [int(k) for k in enriched.column(key).to_pylist()]
    names, values = enriched.column("name").to_pylist(), enriched.column("value").to_pylist()
    found = [(i, n, v) for i, n, v in zip(ids, names, values, strict=True) if n is not None]
    wrong = [f for f in found if f[1] != f"name-{f[0]}" or f[2] != f[0] * 7]
    if wrong or len(found) < 0.8 * len(ids):
        raise RuntimeError(f"the lookup found {len(found)} of {len(ids)} keys, {len(wrong)} wrong: {wrong[:3]}")


def distinct(batch: pa.RecordBatch) -> list[Any]:
    return list(set(batch.column(0).to_pylist()))


def clickhouse(stack: ExitStack, rows: int) -> tuple[dict[str, str], str, Callable[[list[pa.RecordBatch]], float]]:
    import clickhouse_connect

    from tests.clickhouse_chdb import ChdbClickHouse

    server = stack.enter_context(ChdbClickHouse())
    server.sql("CREATE TABLE dim (id Int64, name String, value Int64) ENGINE = MergeTree ORDER BY id")
    server.sql(f"INSERT INTO dim SELECT number + 1, concat('name-', toString(number + 1)), (number + 1) * 7 "
               f"FROM numbers({rows})")
    host, port = server.url.removeprefix("http://").split(":")
    client = clickhouse_connect.get_client(host=host, port=int(port), username="default", password=server.password,
                                           autogenerate_session_id=False, compress=False)
    stack.callback(client.close)
    uncompressed = {"output_format_arrow_compression_method": "none"}

    def bare(batches: list[pa.RecordBatch]) -> float:
        started = time.perf_counter()
        for batch in batches:
            keys = ",".join(str(k) for k in distinct(batch))
            client.query_arrow(f"SELECT id, name, value FROM dim WHERE id IN ({keys})", settings=uncompressed)
        return time.perf_counter() - started

    return {"url": server.url, "password": server.password, "table": "dim"}, "id", bare


def opensearch(stack: ExitStack, rows: int) -> tuple[dict[str, str], str, Callable[[list[pa.RecordBatch]], float]]:
    from opensearchpy import OpenSearch
    from opensearchpy.helpers import bulk

    from sluice.testing import LocalOpenSearch

    server = stack.enter_context(LocalOpenSearch(full_jit=True, heap="1g", cluster_name="sluice-bench"))
    client = OpenSearch(hosts=[server.url], timeout=300)
    client.indices.create(index="dim", body={
        "settings": {"number_of_shards": 1, "number_of_replicas": 0, "refresh_interval": "-1"},
        "mappings": {"properties": {"name": {"type": "keyword"}, "value": {"type": "long"}}}})
    step = 10_000
    for low in range(1, rows + 1, step):
        bulk(client, ({"_index": "dim", "_id": str(i), "name": f"name-{i}", "value": i * 7}
                      for i in range(low, min(rows, low + step - 1) + 1)), chunk_size=step)
    client.indices.refresh(index="dim")
    client.indices.forcemerge(index="dim", max_num_segments=1)

    def bare(batches: list[pa.RecordBatch]) -> float:
        started = time.perf_counter()
        for batch in batches:
            docs = [d for d in client.mget(index="dim", body={"ids": distinct(batch)},
                                           params={"_source_includes": "name,value"})["docs"] if d.get("found")]
            pa.table({"_id": pa.array([d["_id"] for d in docs], pa.string()),
                      "name": pa.array([d["_source"]["name"] for d in docs], pa.string()),
                      "value": pa.array([d["_source"]["value"] for d in docs], pa.int64())})
        return time.perf_counter() - started

    return {"nodes": server.url, "index": "dim"}, "_id", bare


def row_key(i: int) -> bytes:
    """A long row key as sluice's key codec writes it: big-endian, sign bit flipped."""
    return (i ^ (1 << 63)).to_bytes(8, "big")


def hbase(stack: ExitStack, rows: int) -> tuple[dict[str, str], str, Callable[[list[pa.RecordBatch]], float]]:
    from thriftpy2.protocol import TCyBinaryProtocolFactory
    from thriftpy2.rpc import make_client
    from thriftpy2.transport import TCyBufferedTransportFactory

    import sluice
    from bench.lookup_hbase import split_keys
    from sluice.connectors.hbase._client import Connection, thrift
    from sluice.testing import LocalHBase

    # The lookup's planning parses the schema option (Spark DDL) through a session's JVM; idle while timed.
    spark = sluice.session("bench-lookup-stores", master="local[1]")
    stack.callback(spark.stop)
    t = thrift()
    server = stack.enter_context(LocalHBase(full_jit=True, heap="1g", gateway_heap="256m"))
    conn = Connection((server.host,), server.port, 60.0)
    conn.call("createTable", t.TTableDescriptor(tableName=t.TTableName(ns=b"default", qualifier=b"dim"),
                                                columns=[t.TColumnFamilyDescriptor(name=b"d")]),
              split_keys(rows, REGIONS))
    for low in range(1, rows + 1, 10_000):
        conn.call("putMultiple", b"dim", [t.TPut(row=row_key(i), columnValues=[
            t.TColumnValue(family=b"d", qualifier=b"name", value=f"name-{i}".encode()),
            t.TColumnValue(family=b"d", qualifier=b"value", value=(i * 7).to_bytes(8, "big", signed=True))])
            for i in range(low, min(rows, low + 9_999) + 1)])
    client = make_client(t.THBaseService, server.host, server.port, timeout=60_000,
                         proto_factory=TCyBinaryProtocolFactory(), trans_factory=TCyBufferedTransportFactory())
    stack.callback(client.close)
    columns = [t.TColumn(family=b"d", qualifier=b"name"), t.TColumn(family=b"d", qualifier=b"value")]

    def bare(batches: list[pa.RecordBatch]) -> float:
        started = time.perf_counter()
        for batch in batches:
            gets = [t.TGet(row=row_key(k), columns=columns, maxVersions=1) for k in distinct(batch)]
            ids, names, values = [], [], []
            for result in client.getMultiple(b"dim", gets):
                if not result.row:
                    continue
                cells = {c.qualifier: c.value for c in result.columnValues}
                ids.append(int.from_bytes(result.row, "big") ^ (1 << 63))
                names.append(cells[b"name"].decode())
                values.append(int.from_bytes(cells[b"value"], "big", signed=True))
            pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()),
                      "value": pa.array(values, pa.int64())})
        return time.perf_counter() - started

    return {"host": server.host, "port": str(server.port), "table": "default:dim", "rowkey": "id", "family": "d",
            "schema": "id long, name string, value long"}, "id", bare


STORES = {"clickhouse": clickhouse, "opensearch": opensearch, "hbase": hbase}
FORMATS = {"clickhouse": "clickhouse", "opensearch": "elasticsearch", "hbase": "hbase"}
BARE = {"clickhouse": "clickhouse-connect, one IN query a batch (the keys in the statement), query_arrow",
        "opensearch": "opensearch-py, one mget a batch, rows to Arrow columns",
        "hbase": "thriftpy2, one getMultiple a batch, cells to Arrow columns"}


def run(store: str, rows: int, keys: int, batches: int) -> dict[str, object]:
    from sluice.source._lookup_requests import DEFAULT_CONCURRENT_REQUESTS as C
    from sluice.source._lookup_requests import DEFAULT_KEYS_PER_REQUEST as K

    report: dict[str, object] = {"store": store, "rows": rows, "keys_per_batch": keys, "batches": batches,
                                 "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                 "cores": os.cpu_count(), "load_average_start": os.getloadavg()}
    drawn = keys_of(np.random.default_rng(11), rows, keys, batches)
    with ExitStack() as stack:
        started = time.perf_counter()
        options, key, bare = STORES[store](stack, rows)
        report["start_and_load_seconds"] = round(time.perf_counter() - started, 1)
        print(f"{store}: started and loaded in {report['start_and_load_seconds']} s", file=sys.stderr, flush=True)
        arrow = [pa.record_batch({key: pa.array([str(k) for k in b] if key == "_id" else b)}) for b in drawn]
        settings = {f"concurrency 1, {K} keys a request": (1, K),
                    f"concurrency {C} (default), {K} keys a request (default)": (C, K),
                    f"concurrency {C}, 2500 keys a request": (C, 2500),
                    f"concurrency 1, {keys} keys a request (one a batch)": (1, keys)}
        sluice_seconds(store, options, key, arrow[:1])  # untimed: connections, the server's caches, the JIT
        bare(arrow[:1])
        best: dict[str, float] = {}
        for _ in range(3):
            for name, (requests, size) in settings.items():
                seconds = sluice_seconds(store, {**options, "lookup.max-concurrent-requests": str(requests),
                                                 "lookup.max-keys-per-request": str(size)}, key, arrow)
                best[name] = min(best.get(name, seconds), seconds)
            best["bare"] = min(best.get("bare", float("inf")), bare(arrow))
        looked_up = sum(len(set(b.tolist())) for b in drawn)
        report["distinct_keys"] = looked_up
        report["sluice_keys_per_s"] = {name: round(looked_up / best[name]) for name in settings}
        report["bare_client"] = BARE[store]
        report["bare_client_keys_per_s"] = round(looked_up / best["bare"])
    report["load_average_end"] = os.getloadavg()
    return report
