"""docs/connectors.md is executed: its Python blocks are one module, which must build a working connector on the
public SDK alone; the same connector shows FLIP-509's batching options working (and failing when switched off)."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

import sluice

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "connectors.md"


@pytest.fixture(scope="module")
def guide(spark, tmp_path_factory):
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) >= 6, "the guide's code blocks were not found"
    code = "\n\n".join(blocks)
    imported = set(re.findall(r"^from (sluice\S*) import", code, re.M)) | set(re.findall(r"^import (sluice\S*)", code,
                                                                                          re.M))
    assert imported == {"sluice.connector"}, f"the guide must use the public SDK only, imports {imported}"
    folder = tmp_path_factory.mktemp("guide")
    module = folder / "dirlog_connector.py"
    module.write_text(code)
    spark.sparkContext.addPyFile(str(module))  # executors get the module as a cluster's would
    # Imported by its module name, as the executors import the file addPyFile shipped.
    spec = importlib.util.spec_from_file_location("dirlog_connector", module)
    dirlog_connector = importlib.util.module_from_spec(spec)
    sys.modules["dirlog_connector"] = dirlog_connector
    spec.loader.exec_module(dirlog_connector)

    dirlog_connector.register(spark)
    yield dirlog_connector


def batches(path: Path) -> list[list[dict]]:
    """Every file the store wrote (one per engine batch), in the order each task sent them."""
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in sorted(path.glob("*.jsonl"))]


def keyed_rows(spark, n: int = 3000):
    return spark.range(n).selectExpr("id", "id % 37 AS k")


def test_guide_connector_writes_and_reads_back_every_row(spark, guide, tmp_path):
    df = spark.range(2000).selectExpr("id", "id % 7 AS k", "concat('row ', id) AS note")
    sluice.write(df, "dirlog", {"folder": str(tmp_path)})
    assert sluice.last_write_summary("dirlog")["records"] == 2000
    assert max(len(b) for b in batches(tmp_path)) <= 500  # the connector's own default batch size
    back = spark.read.format("dirlog").schema("id long, k long, note string").option("folder", str(tmp_path)).load()
    assert back.count() == 2000 and back.rdd.getNumPartitions() == len(batches(tmp_path)) > 1
    assert sorted(r.id for r in back.collect()) == list(range(2000))
    assert {(r.id % 7, f"row {r.id}") for r in back.collect()} == {(r.k, r.note) for r in back.collect()}


def test_guide_connector_errors_name_the_option(spark, guide, tmp_path):
    df = spark.range(3)
    with pytest.raises(Exception, match=r"unknown option 'fodler'.*Did you mean 'folder'"):
        sluice.write(df, "dirlog", {"fodler": str(tmp_path)})
    with pytest.raises(Exception, match=r"folder='/no/such/folder' is not a folder"):
        sluice.write(df, "dirlog", {"folder": "/no/such/folder"})


def check_per_key(files: list[list[dict]]) -> tuple[int, bool]:
    """(batches holding more than one key, whether each key's ids arrive in increasing order)."""
    mixed = sum(1 for rows in files if len({r["k"] for r in rows}) > 1)
    # Files are named by task and numbered in send order; a key's next batch is sent after the previous one's ack.
    seen: dict[int, int] = {}
    ordered = True
    for rows in files:
        for r in rows:
            ordered &= seen.get(r["k"], -1) < r["id"]
            seen[r["k"]] = r["id"]
    return mixed, ordered


def test_batch_by_key_gives_batches_of_exactly_one_partition_key_in_order(spark, guide, tmp_path):
    opts = {"sink.mode": "partition-ordered", "sink.partition-key": "k", "sink.parallelism": "4"}
    by_key, by_bucket = tmp_path / "by_key", tmp_path / "by_bucket"
    by_key.mkdir()
    by_bucket.mkdir()
    rows = keyed_rows(spark).coalesce(1)
    sluice.write(rows, "dirlog", {**opts, "folder": str(by_key), "sink.batch-by": "key"})
    mixed, ordered = check_per_key(batches(by_key))
    assert sum(len(b) for b in batches(by_key)) == 3000
    assert mixed == 0, f"{mixed} batches mixed partition keys"
    assert ordered, "a key's rows arrived out of order"
    # Negative control: hash buckets (the default) put several keys in one batch (still in order per key).
    sluice.write(rows, "dirlog", {**opts, "folder": str(by_bucket)})
    assert check_per_key(batches(by_bucket)) == (check_per_key(batches(by_bucket))[0], True)
    assert check_per_key(batches(by_bucket))[0] > 0


def test_batch_creator_option_takes_effect_and_is_validated_on_the_driver(spark, guide, tmp_path):
    rows = keyed_rows(spark, 500).coalesce(1)
    custom, default = tmp_path / "custom", tmp_path / "default"
    custom.mkdir()
    default.mkdir()
    sluice.write(rows, "dirlog", {"folder": str(custom), "sink.batch-creator": "dirlog_connector:TenAtATime"})
    assert max(len(b) for b in batches(custom)) == 10 and sum(len(b) for b in batches(custom)) == 500
    sluice.write(rows, "dirlog", {"folder": str(default)})  # negative control: without it, batches are larger
    assert max(len(b) for b in batches(default)) > 10
    with pytest.raises(Exception, match=r"sink.batch-creator='no_such_module:X': module 'no_such_module' cannot be "
                                        r"imported"):
        sluice.write(rows, "dirlog", {"folder": str(default), "sink.batch-creator": "no_such_module:X"})
    with pytest.raises(Exception, match=r"sink.request-buffer='sluice.engine:Batch': 'Batch' is not a subclass of "
                                        r"RequestBuffer"):
        sluice.write(rows, "dirlog", {"folder": str(default), "sink.request-buffer": "sluice.engine:Batch"})
    with pytest.raises(Exception, match=r"PartitionKeyBatchCreator cannot cut batches from a DequeRequestBuffer"):
        sluice.write(rows, "dirlog", {"folder": str(default),
                                      "sink.batch-creator": "sluice.engine:PartitionKeyBatchCreator"})
    with pytest.raises(Exception, match=r"sink.batch-by only applies to sink.mode=partition-ordered"):
        sluice.write(rows, "dirlog", {"folder": str(default), "sink.batch-by": "key"})


def test_the_guide_connectors_key_orders_partition_ordered_writes_without_sink_partition_key(spark, guide, tmp_path):
    rows = keyed_rows(spark).coalesce(1)
    sluice.write(rows, "dirlog", {"folder": str(tmp_path), "sink.mode": "partition-ordered", "key": "k",
                                  "sink.batch-by": "key"})
    assert sum(len(b) for b in batches(tmp_path)) == 3000
    assert check_per_key(batches(tmp_path)) == (0, True), "the key's batches hold one key each, in order"
    # Negative control: without the connector's key (primary_key) there is no partition key to keep.
    with pytest.raises(Exception, match=r"sink.mode=partition-ordered needs sink.partition-key"):
        sluice.write(rows, "dirlog", {"folder": str(tmp_path), "sink.mode": "partition-ordered"})


def test_the_guide_connectors_stream_reader_caps_micro_batches_and_finds_new_files(spark, guide, tmp_path):
    """The stream reader driven as Spark's streaming source runner drives it on the driver (offsets in, offsets
    out; here in this process, which has the guide's module): every micro-batch within the cap, files written while
    the stream runs found, every row read once."""
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("id", LongType()), StructField("k", LongType())])
    folder = tmp_path / "log"
    folder.mkdir()
    sluice.write(spark.range(1200).selectExpr("id", "id % 7 AS k"), "dirlog", {"folder": str(folder)})

    def drain(reader, start: dict) -> tuple[dict, list[int], list[int]]:
        """Micro-batches until nothing is new: the offset reached, each batch's row count, the ids read."""
        sizes, ids = [], []
        while (end := reader.latestOffset(start, reader.getDefaultReadLimit())) != start:
            rows = [b for p in reader.partitions(start, end) for b in reader.read(p)]
            sizes.append(sum(b.num_rows for b in rows))
            ids += [i for b in rows for i in b.column("id").to_pylist()]
            reader.commit(end)
            start = end
        return start, sizes, ids

    capped = guide.DirLogDataSource(options={"folder": str(folder), "max-records-per-trigger": "250"})
    reader = capped.streamReader(schema)
    at, sizes, ids = drain(reader, reader.initialOffset())
    sluice.write(spark.range(1200, 1500).selectExpr("id", "id % 7 AS k"), "dirlog", {"folder": str(folder)})
    _, more, more_ids = drain(reader, at)  # the new files are new splits, found while the stream runs
    assert sorted(ids + more_ids) == list(range(1500))
    assert max(sizes + more) <= 250 and len(sizes) >= 5 and more, (sizes, more)
    # Negative control: without the cap, one micro-batch reads everything there is.
    whole = guide.DirLogDataSource(options={"folder": str(folder)}).streamReader(schema)
    assert drain(whole, whole.initialOffset())[1] == [1500]


def test_the_guide_connectors_lookup_joins_rows_by_key_and_refuses_what_it_cannot(spark, guide, tmp_path):
    sluice.write(spark.range(40).selectExpr("id", "id % 7 AS k", "concat('row ', id) AS note"), "dirlog",
                 {"folder": str(tmp_path)})
    events = spark.createDataFrame([(3, "a"), (3, "b"), (99, "c")], "id long, event string")
    options = {"folder": str(tmp_path), "schema": "id long, k long, note string"}
    rows = sluice.lookup(events, "dirlog", options, on="id", columns=["note"]).collect()
    assert sorted((r.event, r.note) for r in rows) == [("a", "row 3"), ("b", "row 3"), ("c", None)]
    inner = sluice.lookup(events, "dirlog", options, on="id", how="inner", columns=["note"])
    assert sorted(r.event for r in inner.collect()) == ["a", "b"]
    with pytest.raises(sluice.OptionError, match=r"dirlog looks rows up by one key column; on= names 2"):
        sluice.lookup(events, "dirlog", options, on=["id", "event"])
    with pytest.raises(sluice.OptionError, match=r"unknown option 'shema'.*Did you mean 'schema'"):
        sluice.lookup(events, "dirlog", {"folder": str(tmp_path), "shema": "id long"}, on="id")
