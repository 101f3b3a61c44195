"""Streaming jobs in the MetaService: register before start, finished when the query terminates.

    job = sluice.tablestore.register_job(spark, "totals", sources=["orders"], sinks=["customer_totals"])
    query = job.watch(df.writeStream.format("tablestore")...start())

Registration refuses a second writer of a sink table and a cycle (see sluice.meta). A StreamingQueryListener
marks the job finished (or failed, with the query's exception) when its query terminates, which frees its
tables, and records the job's sign of life as its query makes progress (at most every 30 s; `sluice doctor`'s
--dead-after counts from it). A job whose driver died without that is released with `sluice meta release-job JOB`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from sluice.meta import FAILED, FINISHED, Job, MetaService

log = logging.getLogger("sluice.tablestore")
HEARTBEAT_S = 30.0  # a watched job's sign of life is written at most this often (sluice doctor's --dead-after)

_WATCHED: dict[str, tuple[str | None, str]] = {}  # query id -> (meta url, job id)
_LOCK = threading.Lock()
_LISTENING: set[int] = set()  # sessions (by id) with the listener installed
_BEATEN: dict[str, float] = {}  # query id -> when its job's last sign of life was written (monotonic)


class JobHandle:
    def __init__(self, spark: Any, meta: str | None, job: Job) -> None:
        self.spark, self.meta, self.job = spark, meta, job

    @property
    def job_id(self) -> str:
        return self.job.job_id

    def watch(self, query: Any) -> Any:
        """Tie the job to a started streaming query: the job ends when the query does."""
        _install_listener(self.spark)
        MetaService(self.meta).bind_query(self.job.job_id, str(query.id))  # only this query commits as the job
        with _LOCK:
            _WATCHED[str(query.id)] = (self.meta, self.job.job_id)
        if not query.isActive:  # it ended before we watched it
            _finish(str(query.id), query.exception())
        return query

    def finish(self, failed: bool = False) -> None:
        MetaService(self.meta).finish_job(self.job.job_id, FAILED if failed else FINISHED)


def register_job(spark: Any, name: str, sources: Iterable[str], sinks: Iterable[str],
                 meta: str | None = None) -> JobHandle:
    """Record a job and its tables in the MetaService before its query starts."""
    return JobHandle(spark, meta, MetaService(meta).register_job(name, sources, sinks))


def _finish(query_id: str, exception: Any) -> None:
    with _LOCK:
        found = _WATCHED.pop(query_id, None)
        _BEATEN.pop(query_id, None)
    if found is not None:
        meta, job_id = found
        MetaService(meta).finish_job(job_id, FAILED if exception else FINISHED)


def _beat(query_id: str) -> None:
    """The query made progress (or is idle and alive): its job's sign of life, at most every HEARTBEAT_S."""
    with _LOCK:
        found = _WATCHED.get(query_id)
        now = time.monotonic()
        if found is None or now - _BEATEN.get(query_id, -HEARTBEAT_S) < HEARTBEAT_S:
            return
        _BEATEN[query_id] = now
    meta, job_id = found
    try:
        MetaService(meta).record_sign_of_life(job_id)
    except Exception as e:  # the query goes on; its job then looks silent to sluice doctor
        log.warning("recording job %s's sign of life in the MetaService failed: %s", job_id, e)


def _install_listener(spark: Any) -> None:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class _JobListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            _beat(str(event.progress.id))

        def onQueryIdle(self, event: Any) -> None:
            _beat(str(event.id))

        def onQueryTerminated(self, event: Any) -> None:
            _finish(str(event.id), event.exception)

    with _LOCK:
        if id(spark) in _LISTENING:
            return
        _LISTENING.add(id(spark))
    spark.streams.addListener(_JobListener())
