"""The engine behind a real Spark (local mode) writing through the Arrow writers into the file-backed test store."""

import json
import re
import sys
from collections import defaultdict

import pytest
from pyspark.errors import AnalysisException

import sluice
from sluice.spark import _compat
from sluice.testing import read_file_store

pytestmark = pytest.mark.spark


def numbered(spark, n, keys=7, partitions=1):
    """Rows with body 'key:seq'; one input partition so the input order is total."""
    body = f"concat(cast(id % {keys} AS string), ':', cast(id AS string)) AS body"
    return spark.range(0, n, 1, partitions).selectExpr(body, f"id % {keys} AS key")


def by_key(lines):
    out = defaultdict(list)
    for line in lines:
        key, seq = line.split(":")
        out[key].append(int(seq))
    return out


def test_unordered_batch_write_delivers_every_row_and_reports_stats(spark, tmp_path):
    df = spark.range(0, 20000, 1, 4).selectExpr("cast(id AS string) AS body")
    sluice.write(df, "sluice_test", {"test.dir": tmp_path, "sink.batch.max-size": 500})
    lines = read_file_store(tmp_path)["out"]
    assert sorted(map(int, lines)) == list(range(20000))
    summary = sluice.last_write_summary("sluice_test")
    assert summary["records"] == 20000 and summary["tasks"] == 4 and summary["batches"] >= 40
    assert summary["submit_latency_p50_ms"] is not None


def test_partition_ordered_write_repartitions_by_key_and_keeps_per_key_order(spark, tmp_path):
    df = numbered(spark, 5000)
    opts = {"test.dir": tmp_path, "sink.mode": "partition-ordered", "sink.partition-key": "key",
            "sink.batch.max-size": 7, "sink.parallelism": 3, "test.fail-every": 5, "sink.retry-delay-ms": 1,
            # Every 5th submit fails; with 4 store threads one batch can hit that 4 times in a row, which
            # (rightly) fails the task and lets a Spark retry duplicate output. Ordering is the subject here.
            "sink.max-retries": 50}
    sluice.write(df.select("body", "key").selectExpr("body", "key"), "sluice_test", opts, num_partitions=2)
    written = by_key(read_file_store(tmp_path)["out"])
    assert sorted(written) == [str(k) for k in range(7)]
    for key, seqs in written.items():
        assert seqs == sorted(seqs), f"key {key} out of order"
        assert len(seqs) == len(set(seqs))
    assert sum(map(len, written.values())) == 5000
    assert sluice.last_write_summary("sluice_test")["retries"] > 0


def test_global_ordered_transactional_write_is_exactly_once_across_a_task_retry(spark, tmp_path):
    df = spark.range(0, 6000, 1, 2).selectExpr("cast(id AS string) AS body")
    (df.write.format("sluice_test").mode("append")
       .option("test.dir", str(tmp_path)).option("sink.mode", "global-ordered")
       .option("sink.transactional", "true").option("sink.batch.max-size", "100")
       .option("test.crash-after", "1000").save())
    store = read_file_store(tmp_path)
    # Both first attempts crashed after staging 1000 rows; only the retries' staging files were committed.
    assert list(map(int, store["committed"])) == list(range(6000))  # by task, then row order
    assert store["out"] == []
    staged = sorted(len(p.read_text().splitlines()) for p in (tmp_path / "staging").glob("*.txt"))
    assert staged == [1000, 1000, 3000, 3000], "each task's first attempt should have crashed after 1000 rows"


def test_at_least_once_mode_duplicates_what_a_crashed_attempt_already_wrote(spark, tmp_path):
    """The contrast that motivates transactions: unordered mode after a task retry is at-least-once."""
    df = spark.range(0, 3000, 1, 1).selectExpr("cast(id AS string) AS body")
    (df.write.format("sluice_test").mode("append").option("test.dir", str(tmp_path))
       .option("sink.batch.max-size", "100").option("test.crash-after", "1000").save())
    values = list(map(int, read_file_store(tmp_path)["out"]))
    assert set(values) == set(range(3000)) and len(values) > 3000


@pytest.mark.lines
def test_streaming_transactional_write_commits_each_micro_batch_once_across_a_restart(spark, tmp_path, capability):
    src = tmp_path / "in"
    out = tmp_path / "out"
    checkpoint = tmp_path / "checkpoint"

    def add_file(start, stop):
        spark.range(start, stop, 1, 1).selectExpr("cast(id AS string) AS body").write.mode("append").parquet(str(src))

    def run_once():
        query = (spark.readStream.schema("body STRING").option("maxFilesPerTrigger", 1).parquet(str(src))
                 .writeStream.format("sluice_test").option("test.dir", str(out))
                 .option("sink.mode", "global-ordered").option("sink.transactional", "true")
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    add_file(0, 1000)
    add_file(1000, 2000)
    run_once()
    add_file(2000, 2500)
    run_once()  # restarted from the checkpoint: only the new file is written
    committed = list(map(int, read_file_store(out)["committed"]))
    assert sorted(committed) == list(range(2500)) and len(committed) == 2500
    epochs = sorted(p.name.split("-e")[-1] for p in (out / "committed").glob("*.txt"))
    assert epochs == ["0.txt", "1.txt", "2.txt"]
    summary = sluice.last_write_summary("sluice_test")
    assert summary["batch_id"] == 2 and summary["records"] == 500
    capability("streaming exactly-once across a restart", "yes")
    capability("streaming arrow writer", "Spark's DataSourceStreamArrowWriter" if _compat.HAS_ARROW_STREAM_WRITER
               else "sluice: DataSourceArrowWriter, which Spark 4.0 feeds Arrow")


def test_replaying_a_committed_epoch_is_a_no_op(tmp_path):
    from sluice.engine import WriteContext
    from sluice.testing._filestore import FileCommitter

    staged = tmp_path / "staged.txt"
    staged.write_text("a\nb\n")
    committer = FileCommitter(tmp_path)
    for _ in range(2):
        committer.commit([{"file": str(staged)}], WriteContext(write_id="q1", epoch=7))
    assert read_file_store(tmp_path)["committed"] == ["a", "b"]


def test_null_sink_accepts_any_dataframe(spark):
    df = spark.range(1000).selectExpr("id", "cast(id AS string) AS s", "id * 2.0 AS d")
    sluice.write(df, "sluice_null", {})
    assert sluice.last_write_summary("sluice_null")["records"] == 1000


def test_options_are_validated_before_any_write(spark, tmp_path):
    df = spark.range(10).selectExpr("cast(id AS string) AS body")
    with pytest.raises(AnalysisException, match=r"Did you mean 'sink\.batch\.max-size'"):
        df.write.format("sluice_test").option("test.dir", str(tmp_path)).option("sink.batch.maxsize", "5") \
            .mode("append").save()
    with pytest.raises(AnalysisException, match="does not support mode\\('overwrite'\\)"):
        df.write.format("sluice_test").option("test.dir", str(tmp_path)).mode("overwrite").save()
    with pytest.raises(AnalysisException, match=r"sink.partition-key column\(s\) \['nope'\] are not in the DataFrame"):
        df.write.format("sluice_test").option("test.dir", str(tmp_path)).option("sink.mode", "partition-ordered") \
            .option("sink.partition-key", "nope").mode("append").save()
    with pytest.raises(sluice.OptionError, match=r"needs sink\.partition-key"):
        sluice.write(df, "sluice_test", {"test.dir": tmp_path, "sink.mode": "partition-ordered"})
    assert not (tmp_path / "out").exists(), "a write started although the options were bad"


def test_null_bodies_fail_the_task_with_the_column_named(spark, tmp_path):
    df = spark.createDataFrame([("a",), (None,)], "body STRING")
    with pytest.raises(Exception, match="column 'body' has 1 null value"):
        sluice.write(df, "sluice_test", {"test.dir": tmp_path})


def test_summary_is_json_on_disk_for_other_processes(spark, tmp_path):
    from sluice.spark._summary import stats_dir

    sluice.write(spark.range(5).selectExpr("cast(id AS string) AS body"), "sluice_null", {})
    saved = json.loads((stats_dir() / "last.json").read_text())
    assert saved["format"] == "sluice_null" and saved["records"] == 5


def test_importing_the_engine_does_not_import_pyspark():
    import subprocess

    code = "import sys, sluice, sluice.engine; print('pyspark' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_tasks_without_rows_open_no_store(spark, tmp_path):
    # 8 input partitions, rows only in the first two: the store (its connections, sessions) opens twice.
    df = spark.range(0, 800, 1, 8).where("id < 200").selectExpr("cast(id AS string) AS body")
    sluice.write(df, "sluice_test", {"test.dir": tmp_path})
    assert sorted(map(int, read_file_store(tmp_path)["out"])) == list(range(200))
    assert len(list((tmp_path / "out").iterdir())) == 2  # FileStore makes one file per store opened
    assert sluice.last_write_summary("sluice_test")["tasks"] == 2


def test_one_call_write_keeps_the_dataframes_fan_out_instead_of_200_shuffle_partitions(spark, tmp_path):
    df = numbered(spark, 3000, keys=50, partitions=3)
    opts = {"test.dir": tmp_path / "own", "sink.mode": "partition-ordered", "sink.partition-key": "key"}
    spark.conf.set("spark.sql.shuffle.partitions", "200")
    try:
        sluice.write(df, "sluice_test", opts)
        assert sluice.last_write_summary("sluice_test")["tasks"] == 3  # one per input partition, not up to 50
        sluice.write(df, "sluice_test", {**opts, "test.dir": tmp_path / "told"}, num_partitions=5)
        assert sluice.last_write_summary("sluice_test")["tasks"] == 5
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert sum(map(len, by_key(read_file_store(tmp_path / "own")["out"]).values())) == 3000


@pytest.mark.parametrize(("expr", "shown"), [
    ("INTERVAL '1' DAY AS span", "'span' (interval day)"),
    ("parse_json('{\"a\": 1}') AS doc", "'doc' (variant)"),
    ("array(named_struct('gap', INTERVAL '2' HOUR)) AS nested", "'nested[].gap' (interval hour)"),
])
def test_column_types_no_store_writes_are_refused_on_the_driver_naming_the_column(spark, tmp_path, expr, shown):
    df = spark.range(3).selectExpr("cast(id AS string) AS body", expr)
    for fmt, opts in [("sluice_test", {"test.dir": str(tmp_path)}),
                      ("tablestore", {"table": "typed", "warehouse": str(tmp_path / "wh"),
                                      "meta": str(tmp_path / "meta.db")})]:
        with pytest.raises(Exception, match=rf"format '{fmt}' cannot write column\(s\) {re.escape(shown)}\. "
                                            r"Supported: numbers"):
            df.write.format(fmt).options(**opts).mode("append").save()
    assert not (tmp_path / "out").exists()  # no task ran
    df.write.format("sluice_null").mode("append").save()  # a store that drops everything takes any type
