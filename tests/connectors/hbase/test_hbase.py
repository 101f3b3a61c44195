"""format("hbase") on a real HBase (standalone, Thrift2 gateway): puts by composite row key batched by region, every
Spark type both ways, deletes and null cells, cell timestamps and replays, region-split reads with key-range
pushdown, and refused input."""

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

import sluice
from sluice.connectors.hbase import HBaseDataSource
from sluice.connectors.hbase._wire import put_row
from sluice.engine import AsyncSinkWriter, WriteContext
from tests.faults import replay_first_micro_batch

pytestmark = pytest.mark.spark

SCHEMA = "region string, id long, amount double, note string"
SPLITS = (b"b", b"m", b"t")  # four regions: [,b) [b,m) [m,t) [t,)


def orders(spark, n: int = 400):
    regions = ["asia", "eu", "na", "us", "za"]
    rows = [(regions[i % 5], i, i * 1.5, None if i % 7 == 0 else f"n{i}") for i in range(n)]
    return spark.createDataFrame(rows, SCHEMA), rows


def read(spark, hbase, table: str, schema: str = SCHEMA, **more):
    return spark.read.format("hbase").options(**hbase.opts(table, rowkey="region,id", family="d", **more)) \
        .schema(schema).load()


def test_rows_go_by_composite_key_in_one_split_per_region_and_read_back(spark, hbase):
    table = hbase.table(splits=SPLITS)
    df, rows = orders(spark)
    sluice.write(df, "hbase", hbase.opts(table, rowkey="region,id", family="d"))
    stored = hbase.rows(table)
    assert len(stored) == 400
    # The key is region's UTF-8, a 0 byte, then id as a sign-flipped big-endian long; a null note is no cell.
    assert stored[b"eu\x00\x80" + (1).to_bytes(7, "big")] == {"d:amount": bytes.fromhex("3ff8000000000000"),
                                                             "d:note": b"n1"}
    assert stored[b"asia\x00\x80" + (0).to_bytes(7, "big")] == {"d:amount": bytes(8)}
    back = read(spark, hbase, table)
    assert back.rdd.getNumPartitions() == 4
    assert sorted(tuple(r) for r in back.collect()) == sorted(rows)
    assert read(spark, hbase, table, **{"read.splits-per-region": "3"}).rdd.getNumPartitions() >= 8


def test_every_batch_holds_one_regions_rows(spark, hbase):
    """The plan's tasks run on the engine here, with a store that notes each batch's row keys: every batch falls in
    one region, and all four regions were written. The control drops the region codes: batches then follow the
    hash buckets of the key and span regions."""
    table = hbase.table(splits=SPLITS)
    df, _ = orders(spark, 200)
    source = HBaseDataSource(hbase.opts(table, rowkey="region,id", family="d",
                                        **{"sink.batch.max-size": "1000"}))
    plan = source._plan(df.schema, overwrite=False, streaming=False)
    batch = pa.RecordBatch.from_pandas(df.toPandas(), preserve_index=False)

    def regions_per_batch(keep_regions: bool) -> list[set[int]]:
        task = plan.open_task(WriteContext())
        seen: list[set[int]] = []
        write_batch = task.store.write_batch

        def noting(b):
            seen.append({sum(k >= s for s in SPLITS) for k in (put_row(e) for e in b.entries)})
            write_batch(b)

        task.store.write_batch = noting
        with AsyncSinkWriter(task.store, plan.config) as writer:
            encoded = task.encode(batch)
            codes = encoded.groups if keep_regions else [hash(put_row(e)) % 16 for e in encoded.entries]
            writer.write_keyed(encoded.entries, encoded.sizes, codes)
            writer.finish()
        return seen

    grouped = regions_per_batch(True)
    assert all(len(s) == 1 for s in grouped) and set().union(*grouped) == {0, 1, 2, 3}, grouped
    assert any(len(s) > 1 for s in regions_per_batch(False))
    assert len(hbase.rows(table)) == 200


def test_every_spark_type_round_trips(spark, hbase):
    table = hbase.table(families=("d", "x"))
    schema = ("k int, s string, b binary, t boolean, i8 tinyint, i16 smallint, i64 long, f float, d double, "
              "day date, ts timestamp, m decimal(20,4)")
    row = (-7, "é", b"\x00\xff", True, -3, 300, -(2**40), 1.25, -2.5, dt.date(1969, 7, 20),
           dt.datetime(2026, 11, 26, 5, 0, 1, 123456), Decimal("-12345.6789"))
    df = spark.createDataFrame([row, (8, *([None] * 11))], schema)
    opts = hbase.opts(table, rowkey="k", family="d", columns="m=x:money")
    sluice.write(df, "hbase", opts)
    assert hbase.rows(table)[b"\x7f\xff\xff\xf9"]["x:money"] == b"\x00\x00\x00\x04" + (-123456789).to_bytes(
        4, "big", signed=True)
    back = spark.read.format("hbase").options(**opts).schema(schema).load()
    # A row whose every cell is null has no cell to write, and HBase has no rows without cells.
    assert [tuple(r) for r in back.collect()] == [row]


def test_deletes_null_cells_and_timestamps(spark, hbase):
    table = hbase.table()
    opts = hbase.opts(table, rowkey="id", family="d")
    first = spark.createDataFrame([(i, f"v{i}", i * 1.0) for i in range(6)], "id int, v string, x double")
    sluice.write(first, "hbase", opts)
    changes = spark.createDataFrame([(0, None, None, "d"), (1, None, 9.0, "u"), (2, "w", None, "u")],
                                    "id int, v string, x double, op string")
    sluice.write(changes, "hbase", {**opts, "upsert.op-column": "op"})  # skip: a null keeps the stored cell
    rows = hbase.rows(table)
    key = lambda i: (i ^ (1 << 31)).to_bytes(4, "big")  # noqa: E731 - an int key: sign-flipped big-endian
    assert key(0) not in rows and len(rows) == 5
    assert rows[key(1)]["d:v"] == b"v1" and rows[key(2)]["d:x"] == bytes.fromhex("4000000000000000")
    assert set(rows[key(1)]) == {"d:v", "d:x"}
    sluice.write(changes.where("op = 'u'"), "hbase", {**opts, "upsert.op-column": "op",
                                                      "write.null-cells": "delete"})
    rows = hbase.rows(table)
    assert set(rows[key(1)]) == {"d:x"} and set(rows[key(2)]) == {"d:v"}
    # Timestamps from the data: an older change loses to the stored cell, whatever the arrival order.
    at = spark.createDataFrame([(3, "old", 1_000)], "id int, v string, at long")
    sluice.write(at, "hbase", {**opts, "write.timestamp-column": "at"})
    assert hbase.rows(table)[key(3)]["d:v"] == b"v3"


def test_a_replayed_micro_batch_never_overwrites_a_later_one(spark, hbase, tmp_path):
    """A micro-batch whose write reached HBase but not the checkpoint's commit log is replayed after a later batch
    changed the same rows. With write.timestamp=micro-batch the replay's cells carry batch 0's timestamps and lose
    to batch 1's; with the executor's clock (the negative control) the replay is newer and overwrites batch 1."""

    def replay(timestamps: str) -> set[bytes]:
        table = hbase.table(splits=(b"\x80\x00\x00\x03",))

        def batch(n: int) -> pa.Table:
            return pa.table({"id": pa.array(range(6), pa.int32()), "v": [f"batch {n}"] * 6})

        after_batch_1, replayed = replay_first_micro_batch(
            spark, tmp_path / timestamps, "id int, v string", batch, "hbase",
            hbase.opts(table, rowkey="id", family="d",
                       **{"write.timestamp": timestamps, "write.replay-guard": "false"}),
            lambda: {r["d:v"] for r in hbase.rows(table).values()})
        assert after_batch_1 == {b"batch 1"}
        return replayed

    assert replay("micro-batch") == {b"batch 1"}
    assert replay("client") == {b"batch 0"}


def test_a_replay_after_a_major_compaction_brings_no_deleted_row_back(spark, hbase, tmp_path):
    """The same replay of micro-batch 0 after micro-batch 1 deleted half its rows, and after a flush and a major
    compaction dropped the delete markers (HBase's memory of the deletes). The replay guard's marker says micro-batch
    1 was committed, so the replay writes nothing; without the guard (the negative control) the deleted rows come
    back, micro-batch timestamps and all."""
    key = lambda i: (i ^ (1 << 31)).to_bytes(4, "big")  # noqa: E731 - an int key: sign-flipped big-endian

    def replay(guard: str) -> tuple[set[bytes], set[bytes]]:
        table = hbase.table()

        def batch(n: int) -> pa.Table:
            ids = range(10) if n == 0 else range(0, 10, 2)
            return pa.table({"id": pa.array(ids, pa.int32()), "v": ["x"] * len(ids),
                             "op": ["u" if n == 0 else "d"] * len(ids)})

        compacted = []

        def stored() -> set[bytes]:
            if not compacted:  # after micro-batch 1: its delete markers, and the cells they masked, are dropped
                hbase.server.major_compact(table)
                compacted.append(table)
            return set(hbase.rows(table))

        return replay_first_micro_batch(
            spark, tmp_path / guard, "id int, v string, op string", batch, "hbase",
            hbase.opts(table, rowkey="id", family="d", **{"write.timestamp": "micro-batch", "upsert.op-column": "op",
                                                          "write.replay-guard": guard}), stored)

    odd = {key(i) for i in range(1, 10, 2)}
    assert replay("true") == (odd, odd)
    summary = sluice.last_write_summary("hbase")
    assert summary["replays_skipped"] >= 1 and summary["records"] == 0, summary
    assert replay("false") == (odd, {key(i) for i in range(10)})


def test_filters_on_the_keys_first_column_narrow_the_scans(spark, hbase):
    table = hbase.table(splits=SPLITS)
    df, rows = orders(spark)
    sluice.write(df, "hbase", hbase.opts(table, rowkey="region,id", family="d"))

    def check(where: str, want, pushdown: str = "true") -> int:
        got = read(spark, hbase, table, pushdown=pushdown).where(where)
        assert sorted(tuple(r) for r in got.collect()) == sorted(filter(want, rows)), where
        return got.rdd.getNumPartitions()

    # Without pushdown (the default) every region is scanned and Spark filters: the same rows.
    assert check("region = 'eu'", lambda r: r[0] == "eu", pushdown="false") == 4

    assert check("region = 'eu'", lambda r: r[0] == "eu") == 1
    assert check("region >= 'na' AND region < 'us'", lambda r: "na" <= r[0] < "us") == 2
    assert check("region LIKE 'a%'", lambda r: r[0].startswith("a")) == 1
    assert check("region > 'zz'", lambda r: False) == 1
    assert check("id < 10", lambda r: r[1] < 10) == 4  # not the first key column: every region, Spark filters


def test_bad_input_is_refused_naming_what_to_change(spark, hbase):
    table = hbase.table()
    opts = hbase.opts(table, rowkey="id", family="d")
    df = spark.createDataFrame([(1, "a")], "id int, v string")
    with pytest.raises(Exception, match=r"unknown option 'rowkeys'.*Did you mean 'rowkey'"):
        sluice.write(df, "hbase", {**opts, "rowkeys": "id"})
    with pytest.raises(Exception, match=r"HBase table default:t_nope does not exist"):
        sluice.write(df, "hbase", hbase.opts("t_nope", rowkey="id", family="d"))
    with pytest.raises(Exception, match=r"has no column family \['e'\] \(its families: \['d'\]\)"):
        sluice.write(df, "hbase", {**opts, "family": "e"})
    with pytest.raises(Exception, match=r"row key column 'id' is null in row 0"):
        sluice.write(spark.createDataFrame([(None, "a")], "id int, v string"), "hbase", opts)
    with pytest.raises(Exception, match=r"column 'm' is map<string,int>.*to_json"):
        sluice.write(spark.createDataFrame([(1, {"a": 1})], "id int, m map<string,int>"), "hbase", opts)
    big = spark.createDataFrame([(1, "x" * 2_000)], "id int, v string")
    with pytest.raises(Exception, match=r"column 'v' holds 2000 bytes, over write\.max-cell-bytes=1000"):
        sluice.write(big, "hbase", {**opts, "write.max-cell-bytes": "1000"})
    with pytest.raises(Exception, match=r"sink\.transactional=true: HBase has no transactions"):
        sluice.write(df, "hbase", {**opts, "sink.transactional": "true", "sink.mode": "global-ordered"})
    with pytest.raises(Exception, match=r"needs the read's columns and types"):
        spark.read.format("hbase").options(**opts).load().collect()
    assert hbase.rows(table) == {}
    expiring = hbase.table(ttl=3600)
    with pytest.raises(Exception, match=r"families \['d'\] .* have a time to live"):
        sluice.write(df, "hbase", hbase.opts(expiring, rowkey="id", family="d", **{"write.timestamp": "micro-batch"}))
    guard = hbase.table(families=("m",), ttl=3600)  # a time to live would expire the markers at once
    with pytest.raises(Exception, match=r"write\.replay-guard-table .* without a time to live"):
        sluice.write(df, "hbase", hbase.opts(table, rowkey="id", family="d", **{"write.replay-guard-table": guard}))


def test_a_time_range_reads_the_cells_written_in_it(spark, hbase):
    table = hbase.table()
    opts = hbase.opts(table, rowkey="id", family="d")
    df = spark.createDataFrame([(1, "early", 1_000), (2, "late", 5_000)], "id int, v string, at long")
    sluice.write(df, "hbase", {**opts, "write.timestamp-column": "at"})
    sluice.write(spark.createDataFrame([(1, "now")], "id int, v string"), "hbase", opts)

    def read_in(time_range: str) -> list[tuple]:
        return sorted(tuple(r) for r in spark.read.format("hbase").options(**opts, **{"read.time-range": time_range})
                      .schema("id int, v string").load().collect())

    assert read_in("0,2000") == [(1, "early")]
    assert read_in("0,9000") == [(1, "early"), (2, "late")]
    assert read_in(f"0,{2**62}") == [(1, "now"), (2, "late")]
    with pytest.raises(Exception, match=r"read\.time-range=9,3: need 0 <= min < max"):
        read_in("9,3")


def test_versions_read_as_a_row_per_cell_timestamp_newest_first(spark, hbase):
    table = hbase.table(versions=3)
    opts = hbase.opts(table, rowkey="id", family="d", **{"write.timestamp-column": "at"})
    sluice.write(spark.createDataFrame([(1, "a", 1, 1_000), (2, "x", 5, 1_000)], "id int, v string, n int, at long"),
                 "hbase", opts)
    sluice.write(spark.createDataFrame([(1, "b", 2_000)], "id int, v string, at long"), "hbase", opts)  # v alone
    sluice.write(spark.createDataFrame([(1, "c", 3, 3_000)], "id int, v string, n int, at long"), "hbase", opts)

    def read_versions(versions: int, stamp: str = "at long") -> list[tuple]:
        return [tuple(r) for r in spark.read.format("hbase").options(**hbase.opts(table, rowkey="id", family="d"))
                .options(**{"read.versions": str(versions), "read.timestamp-column": "at"})
                .schema(f"id int, v string, n int, {stamp}").load()
                .selectExpr("id", "v", "n", "at" if stamp == "at long" else "unix_millis(at)").collect()]

    assert read_versions(3) == [(1, "c", 3, 3_000), (1, "b", None, 2_000), (1, "a", 1, 1_000), (2, "x", 5, 1_000)]
    assert read_versions(3, "at timestamp") == read_versions(3)
    assert read_versions(2) == [(1, "c", 3, 3_000), (1, "b", None, 2_000), (2, "x", 5, 1_000)]
    assert read_versions(1) == [(1, "c", 3, 3_000), (2, "x", 5, 1_000)]

    one_version = hbase.table()  # HBase keeps one version of a cell unless told otherwise

    def reader(**options: str):
        return spark.read.format("hbase").options(**hbase.opts(one_version, rowkey="id", family="d"), **options)

    with pytest.raises(Exception, match=r"read\.versions=3, and families \['d'\] .* keep only 1 version"):
        reader(**{"read.versions": "3", "read.timestamp-column": "at"}).schema("id int, v string, at long").load() \
            .collect()
    with pytest.raises(Exception, match=r"read\.versions=2 gives a row per version.*read\.timestamp-column"):
        reader(**{"read.versions": "2"}).schema("id int, v string").load().collect()
    with pytest.raises(Exception, match=r"read\.timestamp-column 'at' is string; it must be a long"):
        reader(**{"read.timestamp-column": "at"}).schema("id int, at string").load().collect()
