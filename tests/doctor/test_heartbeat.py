"""A watched job's driver records signs of life while its query runs (JobHandle.watch's listener, on the query's
progress), so `sluice doctor --dead-after` counts from the last one, not from the job's start; a job whose query is
not watched has none after its start."""


import pytest

import sluice.tablestore
from sluice.meta import FINISHED, MetaService
from tests.faults import poll_until

pytestmark = pytest.mark.spark


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
        # Spark's listener bus delivers progress events asynchronously: polled.
        poll_until(lambda: meta.last_signs_of_life()[watched.job_id] > watched.job.started_at, 60,
                   "a sign of life of the watched job", 0.1)
    finally:
        query.stop()
    assert meta.last_signs_of_life()[unwatched.job_id] == unwatched.started_at, "no query, no sign after its start"
    poll_until(lambda: meta.job(watched.job_id).status == FINISHED, 60, "the job finished with its query", 0.1)
