"""format("tablestore") on real Delta tables (deltalake) with a SQLite MetaService: appends, upserts, barriers,
replayed commits, reads at a version / barrier / consistent version."""

from pathlib import Path

import pytest

import sluice
from sluice.meta import MetaService
from sluice.tablestore import StoreTable, read_consistent
from sluice.tablestore._commit import BarrierCommit, Upkeep
from sluice.tablestore._table import StagedFile

pytestmark = pytest.mark.spark


@pytest.fixture
def store(tmp_path):
    return {"warehouse": str(tmp_path / "wh"), "meta": str(tmp_path / "meta.db")}


def read(spark, store, table, **opts):
    reader = spark.read.format("tablestore").option("table", table).options(**store)
    for key, value in opts.items():
        reader = reader.option(key.replace("_", "-"), str(value))
    return reader.load()


def test_appends_commit_one_version_per_write_with_its_barrier(spark, store):
    df = spark.range(0, 1000, 1, 3).selectExpr("id", "concat('n', id) AS name")
    df.write.format("tablestore").option("table", "events").options(**store).mode("append").save()
    sluice.write(df.selectExpr("id + 1000 AS id", "name"), "tablestore", {"table": "events", **store})
    meta = MetaService(store["meta"])
    (b1, v1), (b2, v2) = meta.barriers("events")
    assert b1 < b2 and (v1, v2) == (1, 2), "version 0 created the table; one version per write"
    assert sorted(r.id for r in read(spark, store, "events").collect()) == list(range(2000))
    assert read(spark, store, "events", barrier=b1).count() == 1000
    assert read(spark, store, "events", version=2).count() == 2000
    history = StoreTable("events", store["warehouse"]).delta().history()
    assert {h.get("sluice.barrier") for h in history} >= {str(b1), str(b2)}
    assert read(spark, store, "events").rdd.getNumPartitions() == 1, "6 small files (3 per write) in one partition"
    one_per_file = read(spark, store, "events", max_partition_bytes=1)
    assert one_per_file.rdd.getNumPartitions() == 6 and one_per_file.count() == 2000


def test_batch_reads_plan_partitions_by_data_size_not_by_commits(spark, store):
    for i in range(20):  # 20 small appends: 20 files (not compacted: this is about planning reads of many files)
        spark.range(i * 100, (i + 1) * 100, 1, 1).write.format("tablestore").option("table", "small") \
            .option("auto-compact", "false").options(**store).mode("append").save()
    packed = read(spark, store, "small")
    assert packed.rdd.getNumPartitions() == 1 and sorted(r.id for r in packed.collect()) == list(range(2000))
    sizes = [f.stat().st_size for f in (StoreTable("small", store["warehouse"]).root / "data").rglob("*.parquet")]
    assert len(sizes) == 20
    # About 5 files per partition; negative control: a 1-byte target gives one partition per file again.
    assert read(spark, store, "small", max_partition_bytes=5 * max(sizes)).rdd.getNumPartitions() == 4
    assert read(spark, store, "small", max_partition_bytes=1).rdd.getNumPartitions() == 20


def test_upserts_merge_the_last_change_per_key_and_delete(spark, store):
    opts = {"table": "orders", "primary-key": "id", "upsert.op-column": "op", **store}
    first = spark.createDataFrame([(1, 10.0, "u"), (2, 20.0, "u"), (3, 30.0, "u")], "id long, amount double, op string")
    sluice.write(first, "tablestore", opts)
    changes = spark.createDataFrame([(1, 11.0, "u"), (1, 12.0, "u"), (2, 0.0, "d"), (4, 40.0, "u"), (3, 31.0, "u")],
                                    "id long, amount double, op string").coalesce(1)
    sluice.write(changes, "tablestore", opts)
    rows = sorted((r.id, r.amount) for r in read(spark, store, "orders").collect())
    assert rows == [(1, 12.0), (3, 31.0), (4, 40.0)]
    assert read(spark, store, "orders").columns == ["id", "amount"], "the op column is not stored"


def test_a_truncate_empties_an_upserted_table_in_the_version_of_its_batch_and_keeps_the_changes_after_it(store):
    """Three commits of staged changes (upsert.op-column 'op'), in order: inserts; an insert then a truncate, last
    (the table ends empty); an insert, a truncate, then inserts (only those stay). One Delta version each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table, meta = StoreTable("emptied", store["warehouse"]), MetaService(store["meta"])
    table.create(pa.schema([("id", pa.int64()), ("v", pa.string())]), ("id",))

    def commit(barrier, rows):
        relative = f"data/b{barrier}/part.parquet"
        (table.root / relative).parent.mkdir(parents=True)
        pq.write_table(pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "v": [r[1] for r in rows],
                                 "op": [r[2] for r in rows]}), table.root / relative)
        table.commit([StagedFile(relative, (table.root / relative).stat().st_size, len(rows))],
                     BarrierCommit("q", barrier), meta, op_column="op")
        return sorted(tuple(r.values()) for r in table.delta().to_pyarrow_table().to_pylist())

    assert commit(1, [(1, "a", "insert"), (2, "b", "insert")]) == [(1, "a"), (2, "b")]
    assert commit(2, [(3, "c", "insert"), (None, None, "truncate")]) == []
    assert commit(3, [(4, "d", "insert"), (None, None, "truncate"), (5, "e", "insert"), (5, "e2", "update"),
                      (6, "f", "insert")]) == [(5, "e2"), (6, "f")]
    assert table.delta().version() == 3


def test_a_replayed_barrier_is_not_committed_twice(spark, store, tmp_path):
    spark.range(0, 10).write.format("tablestore").option("table", "t").options(**store).mode("append").save()
    table = StoreTable("t", store["warehouse"])
    meta = MetaService(store["meta"])
    folder = table.root / table.staging_prefix("q1", 5)
    folder.mkdir(parents=True)
    import pyarrow as pa
    import pyarrow.parquet as pq

    def staged(name):
        pq.write_table(pa.table({"id": pa.array(range(100, 105), pa.int64())}), folder / name)
        return StagedFile(str((folder / name).relative_to(table.root)), (folder / name).stat().st_size, 5)

    barrier = meta.batch_barrier("q1", 5, ["t"])
    assert meta.batch_barrier("q1", 5, ["t"]) == barrier, "a replayed micro-batch keeps its barrier"
    first = table.commit([staged("a.parquet")], BarrierCommit("q1", barrier), meta)
    again = table.commit([staged("b.parquet")], BarrierCommit("q1", barrier), meta)
    assert (first.replayed, again.replayed, again.version) == (False, True, first.version)
    assert read(spark, store, "t").count() == 15
    assert not (folder / "b.parquet").exists(), "the replay's files are removed"
    # The driver died between the Delta commit and the MetaService record: the replay records the barrier.
    second = meta.batch_barrier("q1", 6, ["t"])
    landed = table.commit([staged("c.parquet")], BarrierCommit("q1", second), meta)
    with MetaService(store["meta"])._tx(write=True) as cur:
        cur.execute("DELETE FROM sluice_barriers WHERE table_name = ? AND barrier = ?", ("t", second))
    replay = table.commit([staged("d.parquet")], BarrierCommit("q1", second), meta)
    assert replay.replayed and dict(meta.barriers("t"))[second] == landed.version


def test_reads_at_the_consistent_version_of_several_tables(spark, store):
    meta = MetaService(store["meta"])
    a = spark.range(0, 10).selectExpr("id", "id * 2 AS v")
    a.write.format("tablestore").option("table", "a").options(**store).mode("append").save()
    (barrier, _), = meta.barriers("a")
    # b completes the same barrier (as a downstream job would), then a moves on alone
    b = StoreTable("b", store["warehouse"])
    spark.range(0, 3).write.format("tablestore").option("table", "b").options(**store).mode("append").save()
    meta_b = meta.barriers("b")[-1]
    meta.complete_barrier("a", meta_b[0], StoreTable("a", store["warehouse"]).delta().version())
    spark.range(100, 110).selectExpr("id", "id * 2 AS v").write.format("tablestore").option("table", "a") \
        .options(**store).mode("append").save()
    found, frames = read_consistent(spark, ["a", "b"], warehouse=store["warehouse"], meta=store["meta"])
    assert found == meta_b[0]
    assert frames["a"].count() == 10 and frames["b"].count() == 3
    assert read(spark, store, "a").count() == 20
    assert read(spark, store, "a", consistent_with="b").count() == 10
    assert b.exists() and barrier < found


def test_bad_requests_fail_clearly(spark, store):
    df = spark.range(0, 3)
    with pytest.raises(Exception, match="table name 'no-dash'"):
        df.write.format("tablestore").option("table", "no-dash").options(**store).mode("append").save()
    df.write.format("tablestore").option("table", "x").options(**store).mode("append").save()
    with pytest.raises(Exception, match=r"column 'extra' of the DataFrame is not in table 'x'.*schema\.evolution="
                                        "add-columns"):
        df.selectExpr("id", "1 AS extra").write.format("tablestore").option("table", "x").options(**store) \
            .mode("append").save()
    with pytest.raises(Exception, match="has not completed barrier 5"):
        read(spark, store, "x", barrier=5).count()
    with pytest.raises(Exception, match="table 'x' has no version 9: its latest is 1"):
        read(spark, store, "x", version=9).count()
    with pytest.raises(Exception, match=r"table\(s\) \['nosuch'\] have no completed barrier at all"):
        read(spark, store, "x", consistent_with="nosuch").count()
    with pytest.raises(Exception, match="mode\\('overwrite'\\) is not supported"):
        df.write.format("tablestore").option("table", "x").options(**store).mode("overwrite").save()
    with pytest.raises(Exception, match="table 'nope' does not exist"):
        read(spark, store, "nope").count()


def test_rows_with_a_null_primary_key_are_refused_and_nothing_is_committed(spark, store):
    good = spark.range(0, 5).selectExpr("id", "id * 10 AS v")
    good.write.format("tablestore").option("table", "keyed").option("primary-key", "id").options(**store) \
        .mode("append").save()
    bad = spark.createDataFrame([(7, 70), (None, 80)], "id long, v long").coalesce(1)
    with pytest.raises(Exception, match=r"null primary-key column 'id'.*nothing of this write is committed"):
        bad.write.format("tablestore").option("table", "keyed").options(**store).mode("append").save()
    assert sorted(r.id for r in read(spark, store, "keyed").collect()) == [0, 1, 2, 3, 4]  # not even row 7
    assert len(MetaService(store["meta"]).barriers("keyed")) == 1


def test_a_batch_write_rerun_with_its_write_id_commits_once(spark, store):
    df = spark.range(0, 50, 1, 2).selectExpr("id")
    opts = {**store, "table": "once", "write-id": "load-2026-11-23"}
    for _ in range(2):  # the second run: as after a driver that died not knowing whether its commit landed
        df.write.format("tablestore").options(**opts).mode("append").save()
    assert read(spark, store, "once").count() == 50
    assert len(MetaService(store["meta"]).barriers("once")) == 1
    df.write.format("tablestore").options(**{**opts, "write-id": "load-2"}).mode("append").save()  # a new write
    assert read(spark, store, "once").count() == 100


def test_a_metaservice_url_it_cannot_use_is_refused(spark, store, tmp_path):
    with pytest.raises(Exception, match=r"MetaService runs on SQLite .* or PostgreSQL .*not on mysql://"):
        spark.range(0, 3).write.format("tablestore").option("table", "t").options(
            **{**store, "meta": "mysql://db/meta"}).mode("append").save()
    assert not StoreTable("t", store["warehouse"]).exists(), "a refused write made the table"


def test_a_first_write_that_fails_leaves_no_table_and_a_later_one_is_kept(spark, store):
    bad = spark.createDataFrame([(7, 70), (None, 80)], "id long, v long").coalesce(1)
    with pytest.raises(Exception, match=r"null primary-key column 'id'"):
        bad.write.format("tablestore").option("table", "fresh").option("primary-key", "id").options(**store) \
            .mode("append").save()
    assert not StoreTable("fresh", store["warehouse"]).exists(), "the failed first write left an empty table"
    assert not (Path(store["warehouse"]) / "fresh").exists()
    good = bad.where("id IS NOT NULL")
    good.write.format("tablestore").option("table", "fresh").option("primary-key", "id").options(**store) \
        .mode("append").save()
    with pytest.raises(Exception, match=r"null primary-key column 'id'"):
        bad.write.format("tablestore").option("table", "fresh").options(**store).mode("append").save()
    assert [tuple(r) for r in read(spark, store, "fresh").collect()] == [(7, 70)]  # a written table stays


def test_a_warehouse_uri_the_store_cannot_honour_is_refused_never_made_a_local_folder(spark, store, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    for warehouse, message in (("gs://bucket/tables", r"gs:// is not supported by the table store; use a local"),
                               ("s3:///tables", r"names no bucket")):
        with pytest.raises(Exception, match=message):
            spark.range(0, 3).write.format("tablestore").option("table", "t").options(**store) \
                .option("warehouse", warehouse).mode("append").save()
    with pytest.raises(Exception, match=r"option 'storage.endpoint' is for an s3:// warehouse"):
        spark.range(0, 3).write.format("tablestore").option("table", "t").options(**store) \
            .option("storage.endpoint", "http://127.0.0.1:1").mode("append").save()
    assert not list(tmp_path.glob("*:*")), "no local folder named after a URI scheme"
    local = {**store, "warehouse": f"file://{tmp_path / 'wh2'}"}
    spark.range(0, 3).write.format("tablestore").option("table", "t").options(**local).mode("append").save()
    assert read(spark, local, "t").count() == 3 and (tmp_path / "wh2" / "t").is_dir()


def test_vacuum_keeps_what_a_consistent_read_may_need(spark, store):
    from sluice.tablestore import vacuum

    meta = MetaService(store["meta"])
    opts = {"table": "solo", "primary-key": "id", **store}
    for value in range(3):  # each upsert rewrites the file: older versions' files become removable
        sluice.write(spark.range(0, 5).selectExpr("id", f"{value} AS v"), "tablestore", opts)
    removable = vacuum("solo", warehouse=store["warehouse"], meta=meta, dry_run=True)
    assert len(removable) >= 2, "with no linked table, only the latest version must stay readable"
    assert len(meta.barriers("solo")) == 3, "a dry run forgets nothing"
    vacuum("solo", warehouse=store["warehouse"], meta=meta)
    assert meta.barriers("solo") == [max(meta.barriers("solo"))] != [], \
        "the barriers of versions no read can open go with their files; the newest stays"

    linked = {"table": "up", "primary-key": "id", **store}
    sluice.write(spark.range(0, 5).selectExpr("id", "0 AS v"), "tablestore", linked)
    meta.register_job("down-job", sources=["up"], sinks=["down"])
    meta.complete_barrier("down", meta.barriers("up")[-1][0], 1)  # downstream stays at the first barrier
    for value in (1, 2):
        sluice.write(spark.range(0, 5).selectExpr("id", f"{value} AS v"), "tablestore", linked)
    kept = meta.barriers("up")[0]
    assert vacuum("up", warehouse=store["warehouse"], meta=meta) == [], \
        "the version 'down' is consistent with must stay"
    assert meta.barriers("up")[0] == kept, "and so must its barrier"
    assert sorted(r.v for r in read(spark, store, "up", consistent_with="down").collect()) == [0] * 5


def test_a_table_that_never_compacts_is_cleaned_and_forgets_old_barriers(spark, store):
    """Upserts rewrite their files, so such a table may never compact; its storage and its barrier rows in the
    MetaService still stay bounded: every log-retention-versions versions the sink cleans it (log entries before the
    checkpoint at or below the oldest version kept go with the change data files only they name, and removed files
    once Delta's vacuum may delete them), every checkpoint-interval versions the barriers of versions older than
    log-retention-versions go (a consistent read can only open newer ones here). Negative control: the same writes
    with no clean due keep every log entry and every merge's change data (in bench.soak's steady hour such a table
    grew by 76 MB an hour)."""
    import json

    import pyarrow as pa

    meta = MetaService(store["meta"])

    def change_data(table):
        """The table's change data files, and those its log entries name."""
        root = StoreTable(table, store["warehouse"]).root
        files = {str(f.relative_to(root)) for f in (root / "_change_data").rglob("*.parquet")}
        actions = [json.loads(line) for entry in (root / "_delta_log").glob("*.json")
                   for line in entry.read_text().splitlines()]
        return files, {a["cdc"]["path"] for a in actions if "cdc" in a}

    def write_ten(table, retention=4):
        opts = {"table": table, "primary-key": "id", "auto-compact": "false", "checkpoint-interval": "3",
                "log-retention-versions": str(retention), **store}
        for value in range(10):
            sluice.write(spark.range(0, 3).selectExpr("id", f"{value} AS v"), "tablestore", opts)
        log = StoreTable(table, store["warehouse"]).root / "_delta_log"
        return sorted(int(f.name.split(".")[0]) for f in log.glob("*.json"))

    # Versions 1-10 (0 made the table). Cleaned at 4 (nothing older than 4 versions back yet) and 8 (keeps version 4
    # on: the log from the checkpoint at 3); barriers forgotten at 6 and 9 (below 2, then below 5).
    assert write_ten("upserted") == list(range(3, 11))
    files, named = change_data("upserted")
    assert files == named and len(files) == 8, "the change data of versions 3-10, whose log entries are kept"
    feed = pa.table(StoreTable("upserted", store["warehouse"]).delta().load_cdf(starting_version=3))
    assert feed.num_rows == 8 * 3 * 2, "the change feed from the oldest version kept reads: 3 keys' pre and post images"
    kept = meta.barriers("upserted")
    assert [version for _, version in kept] == [5, 6, 7, 8, 9, 10], kept
    assert sorted(r.v for r in read(spark, store, "upserted", barrier=kept[0][0]).collect()) == [4] * 3
    with pytest.raises(Exception, match=r"or it was forgotten: the oldest kept barrier is \d+"):
        read(spark, store, "upserted", barrier=kept[0][0] - 1).collect()

    # The commits run in Spark's Python process for the driver, out of a monkeypatch's reach: the clean is switched
    # off by a retention no version reaches.
    assert write_ten("upserted_uncleaned", retention=100) == list(range(11))
    files, named = change_data("upserted_uncleaned")
    assert files == named and len(files) == 10


def test_sql_through_a_temporary_view(spark, store):
    spark.range(0, 4).write.format("tablestore").option("table", "sqlt").options(**store).mode("append").save()
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW sqlt USING tablestore OPTIONS (table 'sqlt', "
              f"warehouse '{store['warehouse']}', meta '{store['meta']}')")
    spark.sql("INSERT INTO sqlt SELECT id + 10 AS id FROM range(3)")
    assert sorted(r.id for r in spark.sql("SELECT id FROM sqlt").collect()) == [0, 1, 2, 3, 10, 11, 12]
    assert len(MetaService(store["meta"]).barriers("sqlt")) == 2


def test_a_replayed_ingest_micro_batch_keeps_its_barrier_and_commits_nothing_twice(spark, store, tmp_path):
    """Spark replays a micro-batch whose commit reached the table but not Spark's commit log (the driver died in
    between): simulated by deleting the last entry of the checkpoint's commit log before a restart."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    for part in range(2):
        spark.range(part * 100, (part + 1) * 100, 1, 1).write.mode("append").parquet(str(src))

    def run():
        query = (spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).parquet(str(src))
                 .writeStream.format("tablestore").option("table", "ingest").options(**store)
                 .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        return query

    run()
    meta = MetaService(store["meta"])
    before = meta.barriers("ingest")
    assert len(before) == 2
    for name in ("1", ".1.crc"):  # Spark forgets that batch 1 was committed
        (ck / "commits" / name).unlink(missing_ok=True)
    run()  # batch 1 runs again: same barrier, skipped by the table's app transaction
    assert meta.barriers("ingest") == before, "the replay kept its barrier and committed no new version"
    assert sorted(r.id for r in read(spark, store, "ingest").collect()) == list(range(200))
    assert StoreTable("ingest", store["warehouse"]).delta().version() == 2


@pytest.mark.lines
def test_a_job_with_two_inputs_advances_both_to_the_same_barrier(spark, store, tmp_path, capability):
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = MetaService(store["meta"])
    for name in ("left", "right"):
        StoreTable(name, store["warehouse"]).create(pa.schema([("id", pa.int64())]), ())

    def ingest(name, barrier, ids):
        table = StoreTable(name, store["warehouse"])
        folder = table.root / table.staging_prefix("ingest", barrier)
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), folder / "p.parquet")
        staged = StagedFile(str((folder / "p.parquet").relative_to(table.root)), (folder / "p.parquet").stat().st_size,
                            len(ids))
        table.commit([staged], BarrierCommit(f"ingest-{name}", barrier), meta)

    for barrier in (1000, 2000, 3000):
        ingest("left", barrier, [barrier + i for i in range(3)])
    for barrier in (1000, 2000):
        ingest("right", barrier, [-barrier - i for i in range(2)])

    def run():
        def side(name, other):
            return (spark.readStream.format("tablestore").option("table", name).option("aligned-with", other)
                    .options(**store).load())

        query = (side("left", "right").unionByName(side("right", "left"))
                 .writeStream.format("tablestore").option("table", "joined").options(**store)
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    assert [b for b, _ in meta.barriers("joined")] == [2000], "right has not completed 3000: both stop at 2000"
    ids = sorted(r.id for r in read(spark, store, "joined").collect())
    assert ids == sorted([1000, 1001, 1002, 2000, 2001, 2002, -1000, -1001, -2000, -2001])
    ingest("right", 3000, [-3000])
    run()
    assert [b for b, _ in meta.barriers("joined")] == [2000, 3000]
    assert read(spark, store, "joined", barrier=3000).count() == 14
    capability("aligned table-store inputs", "yes")


def test_a_delta_checkpoint_is_written_every_checkpoint_interval_versions(spark, store):
    def checkpoints(table: str) -> list[int]:
        log = StoreTable(table, store["warehouse"]).root / "_delta_log"
        return sorted(int(f.name.split(".")[0]) for f in log.glob("*.checkpoint.parquet"))

    for table, interval in (("ckpt_5", "5"), ("ckpt_none", "1000")):
        for i in range(12):  # versions 1..12 (version 0 created the table)
            spark.range(i, i + 1, 1, 1).write.format("tablestore").option("table", table).options(**store) \
                .option("checkpoint-interval", interval).mode("append").save()
    assert checkpoints("ckpt_5") == [5, 10]
    assert checkpoints("ckpt_none") == []  # negative control: no checkpoint before its interval
    assert sorted(r.id for r in read(spark, store, "ckpt_5").collect()) == list(range(12))  # opened from v10's


def test_the_sink_itself_keeps_one_writer_per_table(spark, store, tmp_path):
    """No register_job here: the sink claims the table for its streaming query at the first commit, refuses
    every other writer while it holds it, records itself with every barrier, and a release frees the table."""
    from pyspark.errors import StreamingQueryException

    from sluice.meta import RELEASED, RUNNING, WriterConflictError

    meta = MetaService(store["meta"])
    source = tmp_path / "in"
    spark.range(0, 10).write.parquet(str(source / "a"))

    def stream(checkpoint):
        query = (spark.readStream.schema("id long").parquet(str(source / "*")).writeStream.format("tablestore")
                 .option("table", "owned").options(**store).option("checkpointLocation", str(tmp_path / checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        return query

    first = stream("ck1")
    (owner,) = [j for j in meta.jobs() if j.sinks == ("owned",)]
    assert (owner.status, owner.query_id) == (RUNNING, str(first.id)) and owner.name.startswith("query-")
    with pytest.raises(StreamingQueryException, match=rf"table 'owned' already has an active writer: job "
                                                      rf"'{owner.job_id}'.*release-job {owner.job_id}"):
        stream("ck2")
    with pytest.raises(Exception, match=rf"table 'owned' already has an active writer: job '{owner.job_id}'"):
        spark.range(0, 3).write.format("tablestore").option("table", "owned").options(**store).mode("append").save()
    assert read(spark, store, "owned").count() == 10, "nothing of the refused writers was committed"

    spark.range(10, 15).write.parquet(str(source / "b"))
    assert stream("ck1").id == first.id and read(spark, store, "owned").count() == 15, "its own restart commits"
    with meta._tx() as cur:
        cur.execute("SELECT DISTINCT job_id FROM sluice_barriers WHERE table_name = 'owned'")
        assert cur.fetchall() == [(owner.job_id,)], "every barrier records its job"

    meta.release_job(owner.job_id)
    assert meta.job(owner.job_id).status == RELEASED and meta.job(owner.job_id).sinks == ("owned",), "as history"
    with meta._tx() as cur:
        cur.execute("SELECT count(*) FROM sluice_job_tables WHERE job_id = ?", (owner.job_id,))
        assert cur.fetchone()[0] == 0, "an ended job's edges are dropped"
        cur.execute("SELECT count(*) FROM sluice_batch_barriers WHERE query_id = ?", (str(first.id),))
        assert cur.fetchone()[0] <= 1, "an ended job's micro-batch bookkeeping is dropped (the last batch stays)"
    spark.range(20, 25).write.parquet(str(source / "c"))
    second = stream("ck2")  # the table is free: the other query takes it (and reads all three files)
    assert read(spark, store, "owned").count() == 15 + 20
    with pytest.raises(StreamingQueryException, match=r"table 'owned' already has an active writer"):
        spark.range(30, 31).write.parquet(str(source / "d"))
        stream("ck1")
    assert [j.query_id for j in meta.jobs() if j.status == RUNNING] == [str(second.id)]
    with pytest.raises(WriterConflictError, match="'owned' already has an active writer"):
        meta.register_job("late", sources=[], sinks=["owned"])


def test_compaction_is_a_data_neutral_version_for_barrier_reads_and_change_feeds(store, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    from sluice.cli import main as cli

    meta = MetaService(store["meta"])
    table = StoreTable("small", store["warehouse"])
    table.create(pa.schema([("id", pa.int64())]), ())
    for n in range(6):  # six micro-batches of one small file each
        relative = f"data/b{n}/part.parquet"
        (table.root / relative).parent.mkdir(parents=True)
        pq.write_table(pa.table({"id": pa.array(range(n * 10, n * 10 + 10), pa.int64())}), table.root / relative)
        table.commit([StagedFile(relative, (table.root / relative).stat().st_size, 10)],
                     BarrierCommit("ingest", 100 + n), meta)
    before = {b: sorted(table.delta(v).to_pyarrow_table().column("id").to_pylist()) for b, v in meta.barriers("small")}
    first, last = meta.barriers("small")[0][1], meta.barriers("small")[-1][1]

    job = meta.register_job("writer", sources=[], sinks=["small"])
    assert cli(["table", "--warehouse", store["warehouse"], "--meta", store["meta"], "compact", "small"]) == 2
    assert f"already has an active writer: job '{job.job_id}'" in capsys.readouterr().err, "never races the writer"
    meta.finish_job(job.job_id)
    assert cli(["table", "--warehouse", store["warehouse"], "--meta", store["meta"], "compact", "small"]) == 0
    assert "compacted small: 6 files into 1" in capsys.readouterr().out

    dt = table.delta()
    assert dt.version() == last + 1 and dt.history(1)[0].get("sluice.compaction") == "true"
    assert len(dt.file_uris()) == 1 and dt.to_pyarrow_table().num_rows == 60
    after = {b: sorted(table.delta(v).to_pyarrow_table().column("id").to_pylist()) for b, v in meta.barriers("small")}
    assert after == before, "every barrier still reads exactly what it read"

    def feed_rows(start):
        return pa.table(table.delta().load_cdf(starting_version=start, ending_version=table.delta().version())).num_rows

    assert feed_rows(first + 1) == 60 - 10, "the change feed across the compaction holds only the appends"
    # Negative control: a rewrite that is not data-neutral (the same rows written over the table) shows up in the
    # change feed, so a downstream job would count them again.
    write_deltalake(table.uri, dt.to_pyarrow_table(), mode="overwrite")
    assert feed_rows(first + 1) > 60 - 10


def test_log_retention_keeps_every_version_a_consistent_read_may_open(store):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sluice.tablestore import TableStoreError, vacuum
    from sluice.tablestore._retention import trim_log

    meta = MetaService(store["meta"])
    up = StoreTable("up", store["warehouse"])
    up.create(pa.schema([("id", pa.int64())]), ())
    meta.register_job("down-job", sources=["up"], sinks=["down"])
    for n in range(1, 26):  # versions 1..25, checkpoints at 10 and 20 (checkpoint-interval 10)
        relative = f"data/b{n}/part.parquet"
        (up.root / relative).parent.mkdir(parents=True)
        pq.write_table(pa.table({"id": pa.array([n], pa.int64())}), up.root / relative)
        up.commit([StagedFile(relative, (up.root / relative).stat().st_size, 1)], BarrierCommit("ingest", n), meta,
                  upkeep=Upkeep(checkpoint_interval=10))
    meta.complete_barrier("down", 12, 1)  # the downstream table is consistent with up's barrier 12 = version 12
    log = up.root / "_delta_log"
    assert (log / "00000000000000000000.json").exists() and len(list(log.glob("*.checkpoint.parquet"))) == 2

    vacuum("up", warehouse=store["warehouse"], meta=meta)
    kept = sorted(int(p.name[:20]) for p in log.glob("*.json"))
    assert kept == list(range(10, 26)), "entries before the checkpoint at or below version 12 are gone"
    assert up.delta(12).to_pyarrow_table().num_rows == 12, "the version a consistent read needs still opens"
    assert pa.table(up.delta().load_cdf(starting_version=13, ending_version=25)).num_rows == 13, \
        "the downstream job's change feed from there still reads"
    with pytest.raises(TableStoreError, match="no version 5"):
        up.delta(5)
    # Negative control: retention up to the newest checkpoint, blind to the consistent version, loses version 12.
    trim_log(up.warehouse, up.file_path("_delta_log"), 25)
    with pytest.raises(TableStoreError, match="no version 12"):
        up.delta(12)


def test_a_long_compaction_prints_how_much_it_has_rewritten(store, caplog, monkeypatch):
    """`sluice table compact` on a table of many small files: the console shows the small files and their bytes,
    and what the compaction has written so far, until it ends; a compaction shorter than AFTER_S prints nothing."""
    import logging
    import re

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sluice.cli import main as cli
    from sluice.tablestore import _maintenance

    meta = MetaService(store["meta"])

    def small_files_table(name: str) -> tuple[StoreTable, list[int]]:
        table, sizes = StoreTable(name, store["warehouse"]), []
        table.create(pa.schema([("v", pa.float64())]), ())
        for n in range(12):  # random floats: files that do not compress away
            relative = f"data/b{n}/part.parquet"
            (table.root / relative).parent.mkdir(parents=True)
            pq.write_table(pa.table({"v": np.random.default_rng(n).random(50_000)}), table.root / relative)
            sizes.append((table.root / relative).stat().st_size)
            table.commit([StagedFile(relative, sizes[-1], 50_000)], BarrierCommit("ingest", n + 1), meta)
        return table, sizes

    (quick, _), (table, sizes) = small_files_table("quick"), small_files_table("many")

    def compact(name: str) -> int:
        return cli(["table", "--warehouse", store["warehouse"], "--meta", store["meta"], "compact", name])

    with caplog.at_level(logging.INFO, logger="sluice.progress"):
        assert compact("quick") == 0 and len(quick.delta().file_uris()) == 1
        assert not [r for r in caplog.records if r.name == "sluice.progress"], \
            "a compaction under 5 s prints no progress (the negative control)"
        monkeypatch.setattr(_maintenance, "AFTER_S", 0.0)  # a line at once and every 10 ms
        monkeypatch.setattr(_maintenance, "EVERY_S", 0.01)
        assert compact("many") == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.progress"]
    shown = [re.fullmatch(r"compacting many: ([\d,.]+ \w+) of about ([\d.]+) MiB rewritten \((\d+)%\) from 12 "
                          r"small files, \d+ s", line) for line in lines]
    assert lines and all(shown), lines
    assert float(shown[0].group(2)) == round(sum(sizes) / 2**20, 1)
    assert len(table.delta().file_uris()) == 1


def test_compaction_versions_count_toward_the_checkpoint_interval(store, monkeypatch):
    """Compactions take versions of their own; when one takes a multiple of the interval, a checkpoint still follows,
    so opening the table never replays more than the interval's log entries after the newest checkpoint."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = MetaService(store["meta"])

    def widest_gap(name: str) -> tuple[int, int]:
        """(most log entries after the newest checkpoint seen after any commit, compaction versions)."""
        table = StoreTable(name, store["warehouse"])
        table.create(pa.schema([("id", pa.int64())]), ())
        log = table.root / "_delta_log"
        widest = 0
        for n in range(1, 31):
            relative = f"data/b{n}/part.parquet"
            (table.root / relative).parent.mkdir(parents=True)
            pq.write_table(pa.table({"id": pa.array([n], pa.int64())}), table.root / relative)
            table.commit([StagedFile(relative, (table.root / relative).stat().st_size, 1)],
                         BarrierCommit(f"ingest-{name}", n), meta,
                         upkeep=Upkeep(checkpoint_interval=5, compact_min_files=3))
            checkpoints = [int(p.name[:20]) for p in log.glob("*.checkpoint.parquet")]
            widest = max(widest, int(table.delta().version()) - max(checkpoints, default=0))
        compactions = [h["version"] for h in table.delta().history() if h.get("sluice.compaction")]
        return widest, len(compactions)

    widest, compactions = widest_gap("counted")
    assert compactions >= 5 and widest < 5, (widest, compactions)
    # Negative control: checkpoints only at the sink's own commits on a multiple of the interval; compactions took
    # some of those multiples, and the log after the newest checkpoint grew past the interval.
    monkeypatch.setattr(StoreTable, "checkpoint_if_crossed", lambda *args, **kwargs: None)
    widest, compactions = widest_gap("uncounted")
    assert compactions >= 5 and widest >= 5, (widest, compactions)
