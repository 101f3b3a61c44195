"""format("hbase") with errors.tolerance=all on a real HBase: rows HBase cannot take (an over-long row key, a cell over
write.max-cell-bytes, a cell the gateway refuses) go to a dead-letter table with their reason, the others are stored;
with errors.tolerance=none (the default) the same rows fail the write, naming them. (The negative control of the
gateway's refusal is test_faults.py's test_a_cell_the_gateway_refuses_as_too_large_fails_the_write_naming_the_limit.)
Reading, a row whose cell does not decode as the read's type (3 bytes for an int) goes to a dead-letter HBase table
with errors.tolerance=all, in a batch read and in a tracking stream, and the others are read; without it the read
fails naming the row key, the cell and its bytes."""

import json

import pyarrow as pa
import pytest

import sluice
from sluice.connectors.hbase._catalog import Catalog, Cell
from sluice.connectors.hbase._keys import KeyCodec
from sluice.connectors.hbase._refusals import entry_rows
from sluice.connectors.hbase._rowplan import RowPlan
from sluice.connectors.hbase._sink import MAX_ROW_KEY
from sluice.connectors.hbase._wire import thrift_puts

ROWS = 300
LONG_KEYS = (5, 200)  # row keys over HBase's 32,767 bytes
BIG_CELLS = (77, 78)  # cells over write.max-cell-bytes=1000


def rows(spark):
    data = [("k" * (MAX_ROW_KEY + 1) + str(i) if i in LONG_KEYS else f"r{i:04d}", "x" * 2000 if i in BIG_CELLS
             else f"v{i}") for i in range(ROWS)]
    return spark.createDataFrame(data, "id string, v string").repartition(2)


def letters(tmp_path) -> dict[str, str]:
    return {"errors.tolerance": "all", "errors.deadletter.format": "tablestore", "errors.deadletter.table": "refused",
            "errors.deadletter.warehouse": str(tmp_path / "warehouse"),
            "errors.deadletter.meta": str(tmp_path / "meta.db")}


def dead_letters(spark, tmp_path) -> list:
    return spark.read.format("tablestore").options(table="refused", warehouse=str(tmp_path / "warehouse"),
                                                   meta=str(tmp_path / "meta.db")).load().collect()


@pytest.mark.spark
def test_rows_the_encoder_refuses_go_to_the_dead_letter_table_and_the_others_are_stored(spark, hbase, tmp_path):
    table = hbase.table()
    opts = hbase.opts(table, rowkey="id", family="d", **{"write.max-cell-bytes": "1000"}, **letters(tmp_path))
    sluice.write(rows(spark), "hbase", opts)
    good = {f"r{i:04d}".encode() for i in range(ROWS) if i not in LONG_KEYS + BIG_CELLS}
    assert set(hbase.rows(table)) == good
    summary = sluice.last_write_summary("hbase")
    assert summary["dead_letters"] == 4 and summary["records"] == len(good), summary

    dead = {json.loads(d.record)["id"]: d for d in dead_letters(spark, tmp_path)}
    for i in LONG_KEYS:
        letter = dead["k" * (MAX_ROW_KEY + 1) + str(i)]
        assert json.loads(letter.record)["v"] == f"v{i}"
        assert f"HBase takes at most {MAX_ROW_KEY}" in letter.error_message
    for i in BIG_CELLS:
        letter = dead[f"r{i:04d}"]
        assert json.loads(letter.record) == {"id": f"r{i:04d}", "v": "x" * 2000}
        assert "column 'v' holds 2000 bytes, over write.max-cell-bytes=1000" in letter.error_message
    assert {(d.connector, d.error_class) for d in dead.values()} == {("hbase", "RecordError")}


@pytest.mark.spark
def test_without_tolerance_the_same_rows_fail_the_write_naming_them(spark, hbase):
    """The negative control: errors.tolerance=none, as by default."""
    table = hbase.table()
    opts = hbase.opts(table, rowkey="id", family="d", **{"write.max-cell-bytes": "1000"})
    with pytest.raises(Exception, match=r"row key b'kkk.* is \d+ bytes; HBase takes at most.*errors\.tolerance=all"):
        sluice.write(rows(spark).where("length(v) < 1000"), "hbase", opts)
    with pytest.raises(Exception, match=r"column 'v' holds 2000 bytes.*errors\.tolerance=all"):
        sluice.write(rows(spark).where("length(id) < 100"), "hbase", opts)


@pytest.mark.spark
def test_a_cell_the_gateway_refuses_goes_aside_decoded_from_its_put(spark, hbase, tmp_path):
    """write.max-cell-bytes over the gateway's own limit (hbase.client.keyvalue.maxsize, 10 MiB): the gateway refuses
    the batch, which is split until the put is alone; its row comes back from the put's Thrift bytes."""
    table = hbase.table()
    data = [(i, "x" * (12 << 20) if i == 3 else f"v{i}") for i in range(200)]
    df = spark.createDataFrame(data, "id int, v string").coalesce(1)
    sluice.write(df, "hbase", hbase.opts(table, rowkey="id", family="d", **{"write.max-cell-bytes": str(20 << 20)},
                                         **letters(tmp_path)))
    assert len(hbase.rows(table)) == 199
    (letter,) = dead_letters(spark, tmp_path)
    assert json.loads(letter.record) == {"id": 3, "v": "x" * (12 << 20)}
    assert "hbase.client.keyvalue.maxsize" in letter.error_message


def untyped(hbase) -> str:
    """A table of rows r1..r3 whose cell d:n is a 4-byte int, r2's being 3 bytes ('abc'): no int."""
    table, t = hbase.table(), hbase.t
    cells = {b"r1": (10).to_bytes(4, "big"), b"r2": b"abc", b"r3": (30).to_bytes(4, "big")}
    hbase.conn.call("putMultiple", table.encode(), [
        t.TPut(row=key, columnValues=[t.TColumnValue(family=b"d", qualifier=b"n", value=value)])
        for key, value in cells.items()])
    return table


def read_letters(hbase, table: str) -> dict[str, str]:
    """errors.tolerance=all into a dead-letter table of the same HBase (its tasks write it; no driver commit), a
    row per dead letter keyed by its record, in HBase's default sink.mode (partition-ordered: the dead letters come
    without a partition key, batched under the key None)."""
    return {"errors.tolerance": "all", "errors.deadletter.format": "hbase", "errors.deadletter.host": hbase.server.host,
            "errors.deadletter.port": str(hbase.server.port), "errors.deadletter.table": table,
            "errors.deadletter.rowkey": "record", "errors.deadletter.family": "d"}


def assert_one_letter(hbase, letters: str, table: str) -> None:
    ((record, cells),) = hbase.rows(letters).items()
    letter = json.loads(record)
    assert (letter["row"], letter["cells"]) == ("r2", {"d:n": "abc"}) and letter["timestamp"] > 0
    assert (cells["d:error_class"], cells["d:connector"], cells["d:target"]) == \
        (b"ValueTypeError", b"hbase", table.encode())
    assert f"hbase table {table}, row key b'r2': the cell d:n (b'abc') of column 'n' does not decode: a cell of 3 " \
           "bytes cannot be column 'n'" in cells["d:error_message"].decode()


UNTYPED = r"(?s)row key b'r2': the cell d:n \(b'abc'\) of column 'n' does not decode.*errors\.tolerance"


@pytest.mark.spark
def test_a_batch_read_sends_a_row_it_cannot_decode_aside_and_reads_the_others(spark, hbase):
    table, letters = untyped(hbase), hbase.table()
    opts = hbase.opts(table, rowkey="id", family="d")
    with pytest.raises(Exception, match=UNTYPED):  # the negative control: errors.tolerance=none fails the read
        spark.read.format("hbase").options(**opts).schema("id string, n int").load().collect()
    rows = spark.read.format("hbase").options(**opts, **read_letters(hbase, letters)).schema("id string, n int").load()
    assert sorted((r.id, r.n) for r in rows.collect()) == [("r1", 10), ("r3", 30)]
    assert_one_letter(hbase, letters, table)


@pytest.mark.spark
@pytest.mark.parametrize("tolerance", ["all", "none"])
def test_a_tracking_stream_sends_a_row_it_cannot_decode_aside_and_goes_on(spark, hbase, tmp_path, tolerance):
    from pyspark.errors import StreamingQueryException

    table, letters = untyped(hbase), hbase.table()
    options = {"tracking.column": "at", "tracking.lag-window-ms": "0"}
    if tolerance == "all":
        options |= read_letters(hbase, letters)
    query = spark.readStream.format("hbase").options(**hbase.opts(table, rowkey="id", family="d", **options)) \
        .schema("id string, n int, at timestamp").load().select("id", "n") \
        .writeStream.format("memory").queryName(f"hbase_untyped_{tolerance}").trigger(availableNow=True) \
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    if tolerance == "none":  # the negative control
        with pytest.raises(StreamingQueryException, match=UNTYPED):
            query.awaitTermination(120)
        return
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted((r.id, r.n) for r in spark.table(f"hbase_untyped_{tolerance}").collect()) == [("r1", 10), ("r3", 30)]
    assert_one_letter(hbase, letters, table)


def test_refused_entries_decode_back_into_the_users_columns():
    """Puts as Thrift bytes, and deletes of rows (upsert.op-column) or of null cells, as the user's row."""
    from sluice.connectors.hbase._client import thrift

    schema = pa.schema([("region", pa.string()), ("id", pa.int64()), ("n", pa.int32()), ("op", pa.string()),
                        ("at", pa.timestamp("us"))])
    key = KeyCodec.for_schema(["region", "id"], schema)
    catalog = Catalog("default:t", ("region", "id"), (("n", Cell(b"d", b"n")),))
    plan = RowPlan(catalog, key, (), "op", "column", "at", True, 0, 1000)
    batch = pa.record_batch({"region": ["eu", "na"], "id": [1, -2]}, schema=pa.schema(list(schema)[:2]))
    keys = key.encode(batch)
    stamp = 1_700_000_000_123
    puts, _ = thrift_puts(pa.array(keys, pa.binary()), [(b"d", b"n", pa.array([b"\x00\x00\x00\x07", b"\xff" * 4]))],
                          pa.array([stamp, stamp]).to_numpy(), None)
    module = thrift()
    entries = [*puts.to_pylist(), module.TDelete(row=keys[1], timestamp=stamp)]
    got = entry_rows(entries, plan, schema).to_pylist()
    at = pa.scalar(stamp * 1000, pa.timestamp("us")).as_py()
    assert got == [{"region": "eu", "id": 1, "n": 7, "op": None, "at": at},
                   {"region": "na", "id": -2, "n": -1, "op": None, "at": at},
                   {"region": "na", "id": -2, "n": None, "op": "d", "at": at}]
