"""A watched job's driver records signs of life while its query runs (JobHandle.watch's listener, on the query's
progress), so `sluice doctor --dead-after` counts from the last one, not from the job's start; a job whose query is
not watched has none after its start."""

import time

import pytest

import sluice.tablestore
from sluice.meta import FINISHED, MetaService

pytestmark = pytest.mark.spark


def wait_for(condition, what, timeout_s=60.0):
    """Wait for an event the listener bus delivers asynchronously (Spark's progress events)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:g} s"
        time.sleep(0.1)


def test_a_watched_jobs_progress_is_its_sign_of_life(spark, tmp_path):
    meta_url = str(tmp_path / "meta.db")
    meta = MetaService(meta_url)
    watched = sluice.tablestore.register_job(spark, "rate-watched", sources=[], sinks=["w_out"], meta=meta_url)
    unwatched = meta.register_job("rate-unwatched", sources=[], sinks=["u_out"])
    query = watched.watch(spark.readStream.format("rate").option("rowsPerSecond", 10).load()
                          .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
                          .trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
        wait_for(lambda: meta.last_signs_of_life()[watched.job_id] > watched.job.started_at,
                 "a sign of life of the watched job")
    finally:
        query.stop()
    assert meta.last_signs_of_life()[unwatched.job_id] == unwatched.started_at, "no query, no sign after its start"
    wait_for(lambda: meta.job(watched.job_id).status == FINISHED, "the job finished with its query")
