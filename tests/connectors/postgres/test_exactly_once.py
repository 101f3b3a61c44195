"""Exactly-once PostgreSQL writes (global-ordered + transactional) across a killed Python worker and across a
streaming query killed mid-batch and restarted from its checkpoint; plus streaming in the other modes."""

import threading
import time
from collections import Counter
from urllib.parse import urlsplit

import pytest
from pyspark.errors import StreamingQueryException

import sluice
from tests.faults import dying_stream, held_at, kill_python_workers

pytestmark = pytest.mark.spark


def staged_rows(pg) -> int:
    tables = pg.sql("SELECT relname FROM pg_class WHERE relname LIKE 'sluice_stage_%%' AND relkind = 'r'")
    return sum(pg.sql(f'SELECT count(*) FROM "{name}"')[0][0] for (name,) in tables)


def eo_options(pg, table):
    return pg.opts(table, **{"sink.mode": "global-ordered", "sink.transactional": "true",
                             "sink.batch.max-size": "50", "sink.flush-buffer.timeout": "50"})


@pytest.mark.pg_versions
def test_exactly_once_across_a_killed_python_worker(spark, pg, small_arrow_batches, tmp_path):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (seq bigserial, id bigint, pad text)')
    hold = tmp_path / "hold"  # the input stops at id 1500 until the worker is killed
    hold.touch()
    df = spark.range(0, 3000, 1, 1).selectExpr("id", "repeat('x', 1000) AS pad") \
        .mapInArrow(held_at(1500, str(hold), 50, 0.05), "id long, pad string")
    seen = {}

    def strike():
        try:
            deadline = time.monotonic() + 120
            while staged_rows(pg) < 300 and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["staged"] = staged_rows(pg)
            seen["visible"] = pg.sql(f'SELECT count(*) FROM "{table}"')[0][0]
            seen["workers"] = kill_python_workers(int(urlsplit(pg.url).port))
        finally:
            hold.unlink()  # the retried task runs through (and a failed strike does not hang the write)

    striker = threading.Thread(target=strike)
    striker.start()
    df.write.format("postgres").options(**eo_options(pg, table)).mode("append").save()
    striker.join()
    assert seen["workers"] >= 1 and 300 <= seen["staged"] < 3000, seen
    assert seen["visible"] == 0, "nothing is visible before the driver's commit"
    data = [r[0] for r in pg.sql(f'SELECT id FROM "{table}" ORDER BY seq')]
    counts = Counter(data)
    dupes, missing = sum(c - 1 for c in counts.values()), 3000 - len(counts)
    assert (dupes, missing) == (0, 0), f"{dupes} duplicates, {missing} missing"
    assert data == list(range(3000)), "exactly once, and in order"
    assert staged_rows(pg) == 0, "the killed attempt's staged rows were discarded"


@pytest.mark.pg_versions
def test_exactly_once_across_a_streaming_restart_from_checkpoint(spark, pg, tmp_path, small_arrow_batches):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (seq bigserial, id bigint, pad text)')
    stream, marker, checkpoint = dying_stream(spark, tmp_path, 0.02)

    def start():
        return (stream.writeStream.format("postgres").options(**eo_options(pg, table))
                .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())

    query = start()
    with pytest.raises(StreamingQueryException, match="Python worker exited unexpectedly"):
        query.awaitTermination(180)  # micro-batch 1 dies in both task attempts: the query fails
    assert [r[0] for r in pg.sql(f'SELECT id FROM "{table}" ORDER BY seq')] == list(range(1000)), \
        "only micro-batch 0 is committed"
    assert staged_rows(pg) > 0, "micro-batch 1 had staged rows when it died"
    marker.unlink()
    query = start()  # restart from the checkpoint: micro-batch 1 is replayed, then 2 runs
    query.awaitTermination(180)
    assert query.exception() is None
    data = [r[0] for r in pg.sql(f'SELECT id FROM "{table}" ORDER BY seq')]
    counts = Counter(data)
    dupes, missing = sum(c - 1 for c in counts.values()), 3000 - len(counts)
    assert (dupes, missing) == (0, 0), f"{dupes} duplicates, {missing} missing"
    assert data == list(range(3000))
    log = pg.sql("SELECT epoch, rows FROM sluice_commit_log WHERE target = %s ORDER BY epoch", (f"public.{table}",))
    assert log == [(0, 1000), (1, 1000), (2, 1000)]


def test_a_replayed_epoch_is_a_no_op(spark, pg):
    from sluice.connectors.postgres._client import Connection
    from sluice.connectors.postgres._options import WRITE_SPEC, WriteOptions
    from sluice.connectors.postgres._sink import PostgresCommitter
    from sluice.connectors.postgres._table import prepare_target
    from sluice.engine import WriteContext

    table = pg.table()
    df = spark.range(0, 10, 1, 1).selectExpr("id")
    opts = WRITE_SPEC.parse(pg.opts(table, **{"create-table": "true", "sink.mode": "global-ordered",
                                              "sink.transactional": "true"}))
    conn = Connection.from_options(opts)
    from sluice.spark._compat import to_arrow_schema

    plan = prepare_target(conn, WriteOptions.of(opts), df.schema, to_arrow_schema(df.schema), overwrite=False,
                          staged=True)
    stage = plan.stage_table
    pg.sql(f'INSERT INTO "{stage}" (id, _sluice_write, _sluice_epoch, _sluice_task, _sluice_attempt, _sluice_seq) '
           "SELECT g, 'q1', 7, 0, 11, g FROM generate_series(0, 4) g")
    committer = PostgresCommitter(conn, plan)
    context = WriteContext(write_id="q1", epoch=7)
    committer.commit([{"task": 0, "attempt": 11, "rows": 5}], context)
    assert pg.sql(f'SELECT count(*) FROM "{table}"') == [(5,)]
    # The same epoch again (a restarted query re-running batch 7 after its commit was recorded): no-op.
    pg.sql(f'INSERT INTO "{stage}" (id, _sluice_write, _sluice_epoch, _sluice_task, _sluice_attempt, _sluice_seq) '
           "SELECT g, 'q1', 7, 0, 12, g FROM generate_series(0, 4) g")
    committer.commit([{"task": 0, "attempt": 12, "rows": 5}], context)
    assert pg.sql(f'SELECT count(*) FROM "{table}"') == [(5,)]
    assert pg.sql(f'SELECT count(*) FROM "{stage}"') == [(0,)]
    # A commit whose staged rows do not match what the tasks reported is refused, and nothing changes.
    pg.sql(f'INSERT INTO "{stage}" (id, _sluice_write, _sluice_epoch, _sluice_task, _sluice_attempt, _sluice_seq) '
           "SELECT g, 'q1', 8, 0, 13, g FROM generate_series(0, 2) g")
    with pytest.raises(Exception, match="the tasks reported 5 row"):
        committer.commit([{"task": 0, "attempt": 13, "rows": 5}], WriteContext(write_id="q1", epoch=8))
    assert pg.sql(f'SELECT count(*) FROM "{table}"') == [(5,)]
    assert pg.sql("SELECT count(*) FROM sluice_commit_log WHERE write_id = 'q1' AND epoch = 8") == [(0,)]
    committer.abort([{"task": 0, "attempt": 13, "rows": 5}], WriteContext(write_id="q1", epoch=8))
    assert pg.sql(f'SELECT count(*) FROM "{stage}"') == [(0,)], "abort discards the epoch's staged rows"


@pytest.mark.parametrize("mode", ["unordered", "partition-ordered"])
def test_streaming_writes_in_the_other_modes(spark, pg, tmp_path, mode):
    table = pg.table()
    src = tmp_path / "in"
    for part in range(2):
        spark.range(part * 500, (part + 1) * 500, 1, 1).selectExpr("id % 300 AS id", "id AS version") \
            .write.mode("append").parquet(str(src))
    extra = {"primary-key": "id"} if mode == "partition-ordered" else {}
    query = (spark.readStream.schema("id long, version long").option("maxFilesPerTrigger", 1).parquet(str(src))
             .writeStream.format("postgres").options(**pg.opts(table, **{"create-table": "true", **extra}))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    rows = pg.sql(f'SELECT id, version FROM "{table}" ORDER BY id, version')
    if mode == "unordered":
        assert sorted(v for _, v in rows) == list(range(1000))
    else:
        assert rows == [(k, max(v for v in range(1000) if v % 300 == k)) for k in range(300)]


def test_a_batch_write_rerun_with_its_write_id_commits_once(spark, pg, tmp_path):
    """sink.write-id: a failed run commits nothing; its re-run commits once; a re-run of a write whose commit landed
    (the driver may have died before it learned so) is a no-op. A new id is a new write (negative control)."""
    from tests.faults import fails_while

    marker, table = tmp_path / "fail", pg.table()
    marker.touch()
    rows = spark.range(0, 2000, 1, 2).select(fails_while(marker, 1500)("id").alias("id"))
    opts = pg.opts(table, **{"create-table": "true", "sink.mode": "global-ordered", "sink.transactional": "true",
                             "sink.write-id": "nightly-2026-11-23"})
    with pytest.raises(Exception, match="injected failure at id 1500"):
        sluice.write(rows, "postgres", opts)
    assert pg.sql(f'SELECT count(*) FROM "{table}"') == [(0,)]
    marker.unlink()
    sluice.write(rows, "postgres", opts)
    sluice.write(rows, "postgres", opts)  # again: the commit log knows this write
    assert pg.sql(f'SELECT count(*), count(DISTINCT id) FROM "{table}"') == [(2000, 2000)]
    sluice.write(rows, "postgres", {**opts, "sink.write-id": "another-write"})
    assert pg.sql(f'SELECT count(*) FROM "{table}"') == [(4000,)]


def test_every_transactional_batch_write_of_a_foreach_batch_lands(spark, pg, tmp_path):
    """Batch writes inside a streaming query's foreachBatch are writes of their own: the query's local properties
    (query id, batch id) that Spark gives their jobs must not become their identity, or the commit log takes the
    next micro-batch's write for a replay of the first and drops it (found by the soak, bench/soak/). With
    sink.write-id built from the batch id, a replayed micro-batch is a no-op (the documented way)."""
    import pyspark.sql.functions as F

    source, table = tmp_path / "in", pg.table()
    for n in range(3):
        spark.range(n * 100, n * 100 + 100, 1, 1).write.parquet(str(source / f"part={n}"))
    opts = pg.opts(table, **{"create-table": "true", "sink.mode": "global-ordered", "sink.transactional": "true"})
    epochs: list[int] = []

    def copy(batch, epoch_id):
        epochs.append(epoch_id)
        sluice.write(batch.select("id"), "postgres", opts)  # one transactional write per micro-batch
        sluice.write(batch.select((F.col("id") + 1000).alias("id")), "postgres", opts)  # and a second one

    query = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).parquet(str(source / "*")) \
        .writeStream.foreachBatch(copy).option("checkpointLocation", str(tmp_path / "ck")) \
        .trigger(availableNow=True).start()
    query.awaitTermination()
    assert len(epochs) == 3
    assert pg.sql(f'SELECT count(*), count(DISTINCT id) FROM "{table}"') == [(600, 600)]

    # The documented exactly-once of foreachBatch: the micro-batch's id in sink.write-id; a replay commits nothing.
    replayed = spark.range(0, 10).select(F.col("id") + 5000)
    for _ in range(2):
        sluice.write(replayed.toDF("id"), "postgres", {**opts, "sink.write-id": f"copy-{epochs[-1]}"})
    assert pg.sql(f'SELECT count(*) FROM "{table}" WHERE id >= 5000') == [(10,)]
