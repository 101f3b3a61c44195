"""The doctor on the metrics collector's server (`sluice ui --doctor-...`): findings refreshed by a thread of their own
every `every_s` (examining stores takes seconds: never on a scrape or on the page's event loop), as Prometheus gauges
(`sluice_doctor_*`) and as the page's JSON."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from sluice.doctor._model import Finding
from sluice.doctor._run import Doctor

log = logging.getLogger("sluice.doctor")


class DoctorWatch:
    def __init__(self, doctor: Doctor, every_s: float = 60.0) -> None:
        self.doctor = doctor
        self.every_s = every_s
        self._lock = threading.Lock()
        self._findings: list[Finding] = []
        self._at: float | None = None  # when the last round ended
        self._error: str | None = None  # the last round's failure, shown until a round succeeds
        self._stop = threading.Event()
        self._rounds = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name="sluice-doctor", daemon=True)

    def start(self) -> DoctorWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def wait_round(self, timeout: float) -> bool:
        """Wait for a round to have ended (the page and the tests: nothing to show before the first one)."""
        with self._rounds:
            return self._rounds.wait_for(lambda: self._at is not None, timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                found, error = self.doctor.examine(), None
            except Exception as e:  # a store unreachable this round: shown on the page and as a gauge, tried again
                found, error = None, f"{type(e).__name__}: {e}"
                log.warning("sluice doctor: a round failed: %s", error)
            with self._rounds:
                if found is not None:
                    self._findings = found
                self._error, self._at = error, time.time()
                self._rounds.notify_all()
            self._stop.wait(self.every_s)

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            findings, at, error = list(self._findings), self._at, self._error
        now = time.time()
        return {"at": at, "error": error, "items": [
            {"kind": f.kind, "store": f.store, "name": f.name, "cost": f.cost, "safe": f.verdict.safe,
             "why": f.verdict.why, "owner": f.owner.describe(now) if f.owner else None, "figures": f.figures}
            for f in findings]}

    def collect(self) -> Iterator[Any]:
        """prometheus_client's collector protocol: the last round's findings as gauges."""
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            findings, at, error = list(self._findings), self._at, self._error
        items = GaugeMetricFamily("sluice_doctor_items", "Leftovers sluice doctor found, by kind and whether removing "
                                  "them is safe (their job stopped or is dead).", labels=["kind", "safe"])
        counts: dict[tuple[str, str], int] = {}
        for f in findings:
            key = (f.kind, "yes" if f.verdict.safe else "no")
            counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            items.add_metric(list(key), n)
        yield items
        labels = ["kind", "name", "job", "safe"]
        for metric, figure, text in (
                ("sluice_doctor_retained_wal_bytes", "retained_bytes", "WAL a replication slot holds back, bytes."),
                ("sluice_doctor_staged_rows", "rows", "Rows an unfinished transactional write left staged."),
                ("sluice_doctor_open_transaction_age_seconds", "age_s", "How long a Kafka partition's oldest open "
                 "transaction has held read_committed readers back, seconds."),
                ("sluice_doctor_open_transaction_records", "records", "Records past a Kafka partition's last "
                 "stable offset."),
                ("sluice_doctor_s2_uncommitted_records", "uncommitted_records", "Records of an S2 exactly-once "
                 "micro-batch opened and never committed.")):
            gauge = GaugeMetricFamily(metric, text, labels=labels)
            for f in findings:
                if figure in f.figures:
                    gauge.add_metric([f.kind, f.name, f.owner.job_id if f.owner else "",
                                      "yes" if f.verdict.safe else "no"], f.figures[figure])
            yield gauge
        age = GaugeMetricFamily("sluice_doctor_round_age_seconds", "Seconds since sluice doctor's last round ended "
                                "(-1: none yet).")
        age.add_metric([], time.time() - at if at is not None else -1.0)
        yield age
        failed = GaugeMetricFamily("sluice_doctor_round_failed", "1 when the last round could not examine a store.")
        failed.add_metric([], 1.0 if error else 0.0)
        yield failed
