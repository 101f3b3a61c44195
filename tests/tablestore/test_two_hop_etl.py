"""The acceptance scenario of FLIP-276: job A upserts generated orders into `orders`; job B aggregates the
change feed of `orders` into `customer_totals`; both streaming. A checker reads both tables at their
consistent version in a loop (the sums must agree every time) and at their latest versions (they are shown to
disagree). Job B is killed mid-batch and restarted from its checkpoint: no barrier is committed twice, the
invariant holds, nothing is lost."""

import time

import pytest
from pyspark.errors import StreamingQueryException

import sluice.tablestore
from sluice.meta import FAILED, FINISHED, MetaService, NoConsistentVersionError, WriterConflictError
from tests.faults import die_while

pytestmark = pytest.mark.spark

SIGNED = sluice.tablestore.signed_change("amount") + " AS signed"


def sums(spark, frames):
    orders = frames["orders"].selectExpr("coalesce(sum(amount), 0)").first()[0]
    totals = frames["customer_totals"].selectExpr("coalesce(sum(total), 0)").first()[0]
    return orders, totals


def test_two_streaming_hops_are_read_consistently_and_survive_a_restart(spark, s3, tmp_path):
    """Both tables in a bucket of the S3-compatible server: executors and the driver share no disk for them."""
    store = {"warehouse": s3.uri(f"two-hop-{tmp_path.name}"), "meta": str(tmp_path / "meta.db"), **s3.storage}

    def consistent():
        return sluice.tablestore.read_consistent(spark, ["orders", "customer_totals"], warehouse=store["warehouse"],
                                                 meta=store["meta"], storage=s3.storage)

    meta = MetaService(store["meta"])
    marker = tmp_path / "die"

    # seed the orders table so job B has a schema to stream from
    spark.createDataFrame([(0, 0, 0.0)], "id long, customer long, amount double").write.format("tablestore") \
        .option("table", "orders").option("primary-key", "id").options(**store).mode("append").save()

    job_a = sluice.tablestore.register_job(spark, "A", sources=[], sinks=["orders"], meta=store["meta"])
    with pytest.raises(WriterConflictError, match="'orders' already has an active writer"):
        sluice.tablestore.register_job(spark, "A2", sources=[], sinks=["orders"], meta=store["meta"])
    query_a = job_a.watch(
        spark.readStream.format("rate").option("rowsPerSecond", 400).load()
        .selectExpr("value % 300 AS id", "value % 17 AS customer", "CAST(value % 89 AS double) AS amount")
        .writeStream.format("tablestore").option("table", "orders").options(**store)
        .option("checkpointLocation", str(tmp_path / "ck-a")).trigger(processingTime="300 milliseconds").start())

    def start_b():
        job = sluice.tablestore.register_job(spark, "B", sources=["orders"], sinks=["customer_totals"],
                                             meta=store["meta"])
        changes = (spark.readStream.format("tablestore").option("table", "orders").option("changes", "true")
                   .options(**store).load())
        return job, job.watch(
            changes.mapInArrow(die_while(str(marker)), changes.schema)
            .selectExpr("customer", SIGNED).groupBy("customer").agg({"signed": "sum"})
            .withColumnRenamed("sum(signed)", "total")
            .writeStream.format("tablestore").option("table", "customer_totals").option("primary-key", "customer")
            .options(**store).outputMode("complete").option("checkpointLocation", str(tmp_path / "ck-b"))
            .trigger(processingTime="500 milliseconds").start())

    job_b, query_b = start_b()
    try:
        checks, disagreements = [], 0
        deadline = time.monotonic() + 120  # a bound, not a wait: on a loaded machine a check took up to 25 s
        # Until five checks, over at least three barriers (the pipeline advanced while we read), saw a disagreement.
        while time.monotonic() < deadline and (len(checks) < 5 or disagreements == 0
                                               or len({b for b, _, _ in checks}) < 3):
            try:
                barrier, frames = consistent()
            except NoConsistentVersionError:  # no barrier in common yet
                time.sleep(0.5)
                continue
            orders, totals = sums(spark, frames)
            checks.append((barrier, orders, totals))
            assert orders == pytest.approx(totals), f"at barrier {barrier}: orders {orders} != totals {totals}"
            latest = {t: spark.read.format("tablestore").option("table", t).options(**store).load()
                      for t in ("orders", "customer_totals")}
            latest_orders, latest_totals = sums(spark, latest)
            disagreements += latest_orders != pytest.approx(latest_totals)
        assert len(checks) >= 5 and len({b for b, _, _ in checks}) >= 3, checks
        assert disagreements > 0, "the latest versions never disagreed: the check did not exercise the problem"

        # Kill job B mid-batch: its worker dies while the marker exists (both task attempts), the query fails.
        marker.touch()
        with pytest.raises(StreamingQueryException):
            query_b.awaitTermination(60)
        time.sleep(0.5)
        assert MetaService(store["meta"]).job(job_b.job_id).status == FAILED, "the listener ended the failed job"
        marker.unlink()
        job_b, query_b = start_b()  # restart from the checkpoint (the table is free again)
        time.sleep(3)
    finally:
        query_a.stop()
    query_b.processAllAvailable()
    query_b.stop()
    time.sleep(0.5)

    barrier, frames = consistent()
    orders, totals = sums(spark, frames)
    assert orders == pytest.approx(totals)
    assert barrier == meta.barriers("orders")[-1][0], "B caught up with every barrier of A"
    latest_orders = spark.read.format("tablestore").option("table", "orders").options(**store).load()
    assert latest_orders.count() == 300, "ids 0..299 from A (the seed row 0 merged into A's id 0)"
    totals_barriers = [b for b, _ in meta.barriers("customer_totals")]
    assert totals_barriers == sorted(set(totals_barriers)), "no barrier committed twice"
    assert {j.name: j.status for j in meta.jobs()} == {"A": FINISHED, "B": FINISHED}


def test_two_jobs_in_two_processes_share_a_postgresql_metaservice(spark, pg, tmp_path):
    """Job A in this process, job B in another process with its own Spark (another machine, as far as the
    jobs can tell): they coordinate only through the PostgreSQL MetaService."""
    import os
    import subprocess
    import sys
    import uuid

    schema = f"meta_{uuid.uuid4().hex[:8]}"
    pg.sql(f"CREATE SCHEMA {schema}")
    store = {"warehouse": str(tmp_path / "wh"), "meta": pg.url + f"?options=-csearch_path%3D{schema}"}
    job_a = sluice.tablestore.register_job(spark, "A", sources=[], sinks=["orders"], meta=store["meta"])
    orders = spark.range(0, 600, 1, 2).selectExpr("id % 200 AS id", "id % 7 AS customer",
                                                 "CAST(id AS double) AS amount")
    for part in range(3):  # three ingest writes: three barriers
        orders.where(f"id % 3 = {part}").write.format("tablestore").option("table", "orders") \
            .option("primary-key", "id").option("job", "A").options(**store).mode("append").save()
    job_a.finish()

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-m", "tests.tablestore.job_b_proc", store["warehouse"], store["meta"],
                           str(tmp_path / "ck-b")], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = MetaService(store["meta"])
    assert {j.name: j.status for j in meta.jobs()} == {"A": FINISHED, "B": FINISHED}
    barrier, frames = sluice.tablestore.read_consistent(spark, ["orders", "customer_totals"], **store)
    assert barrier == meta.barriers("orders")[-1][0]
    orders_sum, totals_sum = sums(spark, frames)
    assert orders_sum == pytest.approx(totals_sum) and orders_sum > 0


def test_compactions_between_the_commits_of_a_running_two_hop_pipeline_change_nothing_downstream(spark, tmp_path):
    """Job A appends one small file per micro-batch to `events` and compacts it from its sink (compact-min-files=3);
    job B streams the change feed of `events` into `totals`. Steps alternate A and B (availableNow, so each step
    ends on its own), and B dies mid-batch and replays across compactions: barrier reads, consistent reads and B's
    totals stay exactly right."""
    store = {"warehouse": str(tmp_path / "wh"), "meta": str(tmp_path / "meta.db")}
    meta = MetaService(store["meta"])
    incoming, marker = tmp_path / "in", tmp_path / "die"

    def arrive(first, count):
        for n in range(first, first + count):
            spark.range(n * 100, n * 100 + 100).selectExpr("id", "id % 5 AS customer", "CAST(id AS double) AS amount") \
                .coalesce(1).write.parquet(str(incoming / f"f{n:03d}"))

    def run_a():
        spark.readStream.schema("id long, customer long, amount double").option("maxFilesPerTrigger", 1) \
            .parquet(str(incoming / "*")).writeStream.format("tablestore").option("table", "events") \
            .option("compact-min-files", 3).options(**store).option("checkpointLocation", str(tmp_path / "ck-a")) \
            .trigger(availableNow=True).start().awaitTermination(120)

    def run_b():
        changes = spark.readStream.format("tablestore").option("table", "events").option("changes", "true") \
            .options(**store).load()
        query = (changes.mapInArrow(die_while(str(marker)), changes.schema).selectExpr("customer", SIGNED)
                 .groupBy("customer").agg({"signed": "sum"}).withColumnRenamed("sum(signed)", "total")
                 .writeStream.format("tablestore").option("table", "totals").option("primary-key", "customer")
                 .options(**store).outputMode("complete").option("checkpointLocation", str(tmp_path / "ck-b"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        if query.exception() is not None:
            raise query.exception()

    def consistent_sums():
        barrier, frames = sluice.tablestore.read_consistent(spark, ["events", "totals"], **store)
        events = frames["events"].selectExpr("coalesce(sum(amount), 0)").first()[0]
        totals = frames["totals"].selectExpr("coalesce(sum(total), 0)").first()[0]
        return barrier, events, totals

    meta.register_job("B", sources=["events"], sinks=["totals"])  # lineage: vacuum and consistent reads know it
    arrive(0, 4)
    run_a()
    run_b()
    early_barrier, early_events, early_totals = consistent_sums()
    assert early_events == early_totals == sum(range(400))
    arrive(4, 5)
    run_a()  # 5 more commits: compactions between them
    marker.touch()  # B dies in its next micro-batch, which spans the compactions
    with pytest.raises(StreamingQueryException):
        run_b()
    marker.unlink()
    run_b()  # the replay, from B's checkpoint

    history = sluice.tablestore.StoreTable("events", store["warehouse"]).delta().history()
    compactions = {h["version"] for h in history if h.get("sluice.compaction") == "true"}
    barrier_versions = {v for _, v in meta.barriers("events")}
    assert len(compactions) >= 2 and not compactions & barrier_versions, (compactions, barrier_versions)
    assert len(barrier_versions) == 9, "one barrier per micro-batch of A, none for a compaction"
    barrier, events, totals = consistent_sums()
    assert barrier == meta.barriers("events")[-1][0] and events == totals == sum(range(900)), "nothing counted twice"
    again = spark.read.format("tablestore").option("table", "events").option("barrier", early_barrier) \
        .options(**store).load().selectExpr("sum(amount)").first()[0]
    assert again == early_events, "a barrier read from before the compactions reads what it read then"
