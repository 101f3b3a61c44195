"""The table store on object storage: tables in a bucket of a real S3-compatible server process (moto's standalone
server, reached over HTTP like any S3 endpoint); executors write the data files, the driver commits."""

import json
import multiprocessing
import os
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sluice
from sluice.meta import MetaService
from sluice.tablestore import StoreTable
from sluice.tablestore._commit import BarrierCommit
from sluice.tablestore._storage import Warehouse
from sluice.tablestore._table import StagedFile

pytestmark = pytest.mark.spark


@pytest.fixture
def store(s3, tmp_path):
    return {"warehouse": s3.uri(f"wh-{uuid.uuid4().hex[:8]}"), "meta": str(tmp_path / "meta.db"), **s3.storage}


def read(spark, store, table, **opts):
    reader = spark.read.format("tablestore").option("table", table).options(**store)
    for key, value in opts.items():
        reader = reader.option(key.replace("_", "-"), str(value))
    return reader.load()


def prefix(store) -> str:
    return store["warehouse"].split("/", 3)[3]


def test_executors_write_into_the_bucket_and_the_driver_commits(spark, s3, store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written locally by mistake would land here
    df = spark.range(0, 1000, 1, 3).selectExpr("id", "id % 7 AS k")
    df.write.format("tablestore").option("table", "events").options(**store).mode("append").save()
    changes = spark.createDataFrame([(1, 10, "u"), (2, 0, "d"), (5, 50, "u")], "id long, k long, op string")
    sluice.write(spark.range(0, 4).selectExpr("id", "id AS k"), "tablestore",
                 {"table": "keyed", "primary-key": "id", **store})
    sluice.write(changes.coalesce(1), "tablestore", {"table": "keyed", "upsert.op-column": "op", **store})

    keys = s3.keys(prefix(store))
    events = [k.split("/", 2)[2] for k in keys if k.split("/")[1] == "events"]
    assert sorted(k for k in events if k.startswith("_delta_log/")) == \
        ["_delta_log/00000000000000000000.json", "_delta_log/00000000000000000001.json"]
    assert len([k for k in events if k.startswith("data/") and k.endswith(".parquet")]) == 3, "one file per task"
    assert not [k for k in keys if "/keyed/data/" in k], "a merge's staged input is removed from the bucket"
    assert set(os.listdir(tmp_path)) <= {"meta.db", "meta.db-wal", "meta.db-shm"}, "nothing on the local disk"

    assert sorted(r.id for r in read(spark, store, "events").collect()) == list(range(1000))
    barrier = MetaService(store["meta"]).barriers("events")[-1][0]
    assert read(spark, store, "events", barrier=barrier).count() == 1000
    assert sorted((r.id, r.k) for r in read(spark, store, "keyed").collect()) == [(0, 0), (1, 10), (3, 3), (5, 50)]

    nulls = spark.createDataFrame([(1, 1), (None, 2)], "id long, k long")
    with pytest.raises(Exception, match=r"null primary-key column 'id'"):
        sluice.write(nulls, "tablestore", {"table": "failed", "primary-key": "id", **store})
    assert not [k for k in s3.keys(prefix(store)) if k.split("/")[1] == "failed"], "a failed first write left objects"


def test_storage_secrets_stay_out_of_plans_reprs_and_errors(spark, s3, store):
    secret = s3.secret_key
    spark.range(0, 5).write.format("tablestore").option("table", "t").options(**store).mode("append").save()
    df = read(spark, store, "t")
    plan = df._jdf.queryExecution().toString()
    assert "BatchScan tablestore" in plan and secret not in plan
    table = StoreTable("t", Warehouse.resolve(store["warehouse"], store))
    assert secret not in repr(table) and secret not in repr(table.warehouse)
    assert dict(table.warehouse.storage)["AWS_SECRET_ACCESS_KEY"] == secret, "the executors still get it"
    with pytest.raises(Exception) as refused:
        spark.range(0, 5).write.format("tablestore").option("table", "t").options(**store) \
            .option("storage.access-key-id", None).option("storage.endpoint", "127.0.0.1:1").mode("append").save()
    assert "storage.endpoint '127.0.0.1:1' needs its scheme" in str(refused.value) and secret not in str(refused.value)
    with pytest.raises(Exception) as missing:
        read(spark, {**store, "warehouse": s3.uri("nowhere")}, "t").count()
    assert "table 't' does not exist in s3://" in str(missing.value) and secret not in str(missing.value)


def test_the_change_data_of_trimmed_log_entries_leaves_the_bucket(spark, s3, store):
    """An upsert table's clean on object storage: each merge writes change data (Delta's `cdc` actions) that
    delta-rs's vacuum never deletes; it goes with the log entries that name it. Version 0 made the table, 1-6 are
    upserts; the clean at version 6 keeps version 3 on, so the log from the checkpoint at 2."""
    opts = {"table": "up", "primary-key": "id", "auto-compact": "false", "checkpoint-interval": "2",
            "log-retention-versions": "3", **store}
    for value in range(6):
        sluice.write(spark.range(0, 3).selectExpr("id", f"{value} AS v"), "tablestore", opts)
    table = StoreTable("up", Warehouse.resolve(store["warehouse"], store))
    keys = [k.split("/", 2)[2] for k in s3.keys(prefix(store)) if k.split("/")[1] == "up"]
    entries = sorted(k for k in keys if k.startswith("_delta_log/") and k.endswith(".json"))
    assert entries == [f"_delta_log/{v:020}.json" for v in range(2, 7)]
    fs = table.warehouse.filesystem()
    named = set()
    for entry in entries:
        with fs.open_input_stream(table.file_path(entry)) as stream:
            named |= {a["cdc"]["path"] for a in map(json.loads, stream.read().splitlines()) if "cdc" in a}
    assert sorted(k for k in keys if k.startswith("_change_data/")) == sorted(named) and len(named) == 5
    assert pa.table(table.delta().load_cdf(starting_version=2)).num_rows == 5 * 3 * 2, "the feed from there reads"


def _commit_after_both_read(root: str, storage: tuple, meta: str, job: str, sync, naive: bool) -> None:
    """One of two writers of table 'race': reads the latest version, waits until the other writer has read it too,
    then commits 5 rows (with sluice's commit, or with `naive` a log entry PUT without a condition)."""

    class Racing(StoreTable):
        def delta(self, version=None):
            latest = super().delta(version)
            sync.wait(60)  # both writers hold the same latest version before either commits
            return latest

    table = Racing("race", Warehouse(root, storage))
    fs = table.warehouse.filesystem()
    relative = f"data/{job}/part.parquet"
    with fs.open_output_stream(table.file_path(relative)) as out:
        pq.write_table(pa.table({"id": pa.array(range(5), pa.int64())}), out)
    size = fs.get_file_info(table.file_path(relative)).size
    if not naive:
        # each writer records its barriers in its own MetaService: the race under test is the Delta commit's
        table.commit([StagedFile(relative, size, 5)], BarrierCommit(job, 1), MetaService(f"{meta}-{job}"))
        return
    version = table.delta().version() + 1
    add = {"add": {"path": relative, "size": size, "partitionValues": {}, "modificationTime": int(time.time() * 1000),
                   "dataChange": True, "stats": json.dumps({"numRecords": 5})}}
    info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE", "writer": job}}
    with fs.open_output_stream(table.file_path(f"_delta_log/{version:020d}.json")) as out:
        out.write(("\n".join(json.dumps(a) for a in (add, info)) + "\n").encode())


@pytest.mark.parametrize("naive", [False, True], ids=["sluice-commit", "negative-control-unconditional-put"])
def test_two_writers_racing_on_one_version_never_both_commit_it_silently(s3, store, naive):
    table = StoreTable("race", Warehouse.resolve(store["warehouse"], store))
    table.create(pa.schema([("id", pa.int64())]), ())
    start = table.delta().version()
    spawn = multiprocessing.get_context("spawn")  # deltalake's runtime does not survive fork
    sync = spawn.Barrier(2)
    writers = [spawn.Process(target=_commit_after_both_read,
                             args=(table.warehouse.root, table.warehouse.storage, store["meta"], f"writer{i}", sync,
                                   naive)) for i in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
    assert [w.exitcode for w in writers] == [0, 0]
    latest = table.delta()
    if naive:  # both PUT version start+1: the second overwrote the first, whose rows are gone
        assert (latest.version(), latest.to_pyarrow_table().num_rows) == (start + 1, 5)
        return
    # S3's conditional write (If-None-Match) refused the second PUT of start+1; deltalake re-checked and took start+2
    assert (latest.version(), latest.to_pyarrow_table().num_rows) == (start + 2, 10)
    writers_by_version = {h["version"]: h.get("sluice.job") for h in latest.history() if h["version"] > start}
    assert sorted(writers_by_version.values()) == ["writer0", "writer1"]
