"""The documented Prometheus alerting rules (docs/prometheus/sluice-alerts.yml): valid for Prometheus' own checker,
firing and staying quiet as their unit tests say (tests/metrics/alerts_test.yml, run by promtool: each alert on its
series, and the same series below its threshold or shorter than its `for` as negative controls), and written over
metric names the collector really exposes. No Spark."""

import os
import re
import subprocess
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sluice.doctor._model import KAFKA_TXN, Finding, Verdict
from sluice.doctor._watch import DoctorWatch
from sluice.engine import LiveStats
from sluice.metrics import SourceReport, SplitLag, TaskIdentity, TaskReport
from sluice.metrics._collect import LookupMetrics, PrometheusCollector, ReadMetrics, SinkMetrics, SourceMetrics
from sluice.metrics._report import ReadReport, ReadStats

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "prometheus" / "sluice-alerts.yml"
RULE_TESTS = Path(__file__).with_name("alerts_test.yml")


def promtool_path() -> Path:
    """The Makefile's pinned promtool (PROMTOOL_DEB: Debian's prometheus package, unpacked into the cache), which
    `make` exports as SLUICE_PROMTOOL; run alone, the one `make check-promtool` put in the cache."""
    given = os.environ.get("SLUICE_PROMTOOL")
    found = [Path(given)] if given else sorted(Path.home().glob(".cache/sluice/promtool-*/promtool"))
    assert found and found[-1].exists(), f"promtool is missing ({given or '~/.cache/sluice/promtool-*'}): " \
        "make check-promtool"
    return found[-1]


def promtool(*args: str) -> str:
    done = subprocess.run([str(promtool_path()), *args], cwd=RULE_TESTS.parent, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_rules_pass_prometheus_checker_and_their_unit_tests():
    assert "SUCCESS: 10 rules found" in promtool("check", "rules", str(RULES))
    assert "SUCCESS" in promtool("test", "rules", RULE_TESTS.name)


def test_every_metric_the_rules_read_is_one_the_collector_exposes():
    sinks, sources, reads = SinkMetrics(), SourceMetrics(), ReadMetrics()
    task = TaskIdentity("cassandra", "w", 0, 0, 1, None)
    sinks.add(TaskReport(task, LiveStats(records=10, bytes=100, batches=1, failed_records=1, retries=1, throttles=0,
                                         inflight_requests=0, inflight_records=0, window=10, buffered=0,
                                         last_send_ms=1.0, at=0.0), done=False))
    sources.add(SourceReport(format="postgres", source="sluice_orders", pending_bytes=10, retained_bytes=4096,
                             position="0/1", head="0/2", at=time.time(), time_behind_ms=5.0,
                             splits=(SplitLag("orders:0", 1, 2, 1),)))
    reads.add(ReadReport(TaskIdentity("sluice_kafka", "r", 0, 0, 2, None),
                                ReadStats(10, 100, 1, 20.0, time.time(), "orders:0"), done=False))
    # sluice doctor's gauges, from a watch whose round found one item of each figure the gauges carry.
    figures = {"retained_bytes": 1, "rows": 1, "age_s": 1, "records": 1, "uncommitted_records": 1}

    class OneRound:
        def examine(self) -> list[Finding]:
            return [Finding(KAFKA_TXN, "kafka", "orders:0", "records held back", None, Verdict(True, "stopped"),
                            figures)]

    watch = DoctorWatch(OneRound()).start()
    assert watch.wait_round(30)
    watch.stop()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(sinks, sources, reads, LookupMetrics()))
    registry.register(watch)
    exposed = {sample.name for family in text_string_to_metric_families(generate_latest(registry).decode())
               for sample in family.samples}
    read = set(re.findall(r"\b(sluice_[A-Za-z_]+)\b", "\n".join(
        line.split("expr:", 1)[1] for line in RULES.read_text().splitlines() if "expr:" in line)))
    assert read, "no sluice_ metric found in the rules' expressions"
    assert read <= exposed, f"the rules read metrics the collector does not expose: {sorted(read - exposed)}"
