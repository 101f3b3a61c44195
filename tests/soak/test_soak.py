"""The short soak of make test (docs/reliability.md): bench.soak, seeded, with a fault every 8 s on average for 60 s,
the first a kill of the Kafka broker: the bank pipeline (PostgreSQL -> S2 -> the table store -> PostgreSQL and
ClickHouse, and S2 -> Kafka -> the table store) keeps its invariant at every barrier of both tables and in the copy,
loses and duplicates no change in S2 or Kafka, and ends equal to the source. `make soak MINUTES=30` is the long
run. The guarantees it leans on each have their own test with the mechanism switched off (exactly-once into S2,
PostgreSQL and Kafka, untorn change capture, barrier reads, a Kafka topic read into the table store at barriers);
this checks them together, under faults."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.spark


@pytest.mark.timeout(1200)
def test_the_bank_pipeline_keeps_its_invariant_under_random_faults(tmp_path):
    report = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "bench.soak", "--minutes", "1", "--fault-every", "8",
                          "--seed", "11", "--first", "kafka-broker", "--report", str(report)],
                         capture_output=True, text=True, timeout=1100, cwd=ROOT)
    print(run.stdout[-6000:])
    assert report.exists(), f"the soak ended without a report (exit {run.returncode}): {run.stderr[-4000:]}"
    found = json.loads(report.read_text())
    assert found["invariant"] == "holds", found["violations"]
    assert run.returncode == 0
    assert found["faults"] >= 4 and found["copy_reads"] > 0, found
    assert found["barriers_checked"].get("balances", 0) > 0 and found["barriers_checked"].get("balances_kafka", 0) > 0
    broker = found["faults_by_kind"].get("kafka-broker", {"count": 0, "notes": []})
    assert broker["count"] >= 1 and not any("could not strike" in note for note in broker["notes"]), found
    # The windows of a long run (--window-min): here one, with its transfers and memory read (the workers' PSS too).
    window = found["windows"][0]
    assert window["transfers"] > 0 and window["python_pss_mib"] > 0 and window["driver_jvm_mib"] > 0, found["windows"]
    assert window["warehouse_log_mib"] > 0 and window["warehouse_change_mib"] > 0, found["windows"]
    # Each Python process's memory over the run: the driver's and the workers' (a sum growing is traced to its pids).
    end = found["at_end"]  # the warehouse by kind: its log, change data and live files are there; the kinds add up
    kinds = ("warehouse_log_bytes", "warehouse_change_bytes", "warehouse_live_bytes", "warehouse_removed_bytes")
    assert all(end[kind] > 0 for kind in kinds[:3]) and end["warehouse_removed_bytes"] >= 0 \
        and sum(end[kind] for kind in kinds) == end["warehouse_bytes"], end
    python = found["python_processes"]
    assert python["processes_seen"] >= 3 and python["lived_whole_run"] >= 1, python  # the driver, the daemon, a worker
    assert {life["role"] for life in python["grew_most"]} <= {"driver", "daemon", "worker", "runner"}, python
    assert all(life["pss_last_mib"] > 0 and life["rss_last_mib"] > 0 for life in python["grew_most"]), python
