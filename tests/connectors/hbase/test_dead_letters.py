"""format("hbase") with errors.tolerance=all on a real HBase: rows HBase cannot take (an over-long row key, a cell over
write.max-cell-bytes, a cell the gateway refuses) go to a dead-letter table with their reason, the others are stored;
with errors.tolerance=none (the default) the same rows fail the write, naming them. (The negative control of the
gateway's refusal is test_faults.py's test_a_cell_the_gateway_refuses_as_too_large_fails_the_write_naming_the_limit.)"""

import json

import pyarrow as pa
import pytest

import sluice
from sluice.connectors.hbase._catalog import Catalog, Cell
from sluice.connectors.hbase._keys import KeyCodec
from sluice.connectors.hbase._refusals import entry_rows
from sluice.connectors.hbase._sink import MAX_ROW_KEY, RowPlan
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
