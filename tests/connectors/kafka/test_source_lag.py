"""The Kafka source's lag per topic partition on a real Kafka (LocalKafka): two partitions with different backlogs
and record times report different records behind and different fetch lags (currentFetchEventTimeLag), at /metrics
and in the page's JSON, beside the totals."""

import json
import time
import urllib.request

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from sluice.connectors.kafka import KafkaDataSource
from sluice.ui import serve_ui

pytestmark = pytest.mark.spark

FORMAT = KafkaDataSource.format_name
HOUR_MS = 3_600_000


def samples(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_each_partition_reports_its_own_records_behind_and_fetch_lag(spark, kafka, new_topic, tmp_path):
    topic = new_topic(partitions=2)
    producer = Producer(kafka.client_config())
    an_hour_ago = int(time.time() * 1000) - HOUR_MS
    for i in range(100):  # partition 0: a backlog of records an hour old (CreateTime, as the producer sets it)
        producer.produce(topic, value=f"old{i}".encode(), partition=0, timestamp=an_hour_ago + i)
    for i in range(20):  # partition 1: a few records of now
        producer.produce(topic, value=f"new{i}".encode(), partition=1)
    assert producer.flush(30) == 0
    with serve_ui(str(tmp_path / "meta.db")) as server:  # the collector, and the page's JSON
        query = (spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                 .option("subscribe", topic).option("max-records-per-trigger", "40").load().selectExpr("offset")
                 .writeStream.format("memory").queryName("per_partition")
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        # Micro-batches of 40 shared fairly: (20, 20), (60, 20), (100, 20). Spark commits a micro-batch's offsets
        # when it plans the next, so the last report is the second's: partition 0 is 40 behind, partition 1 is not.
        [report] = [r for r in server.sources.snapshot() if r.format == FORMAT]
        found = samples(server.url)
        with urllib.request.urlopen(server.url + "/api/state", timeout=10) as answer:
            state = json.loads(answer.read())
    p0, p1 = f"{topic}:0", f"{topic}:1"
    assert [(s.split, s.position, s.head, s.pending_records) for s in report.splits] == [(p0, 60, 100, 40),
                                                                                         (p1, 20, 20, 0)]
    assert report.pending_records == 40  # the total, as before
    labels = (("format", FORMAT), ("source", topic))
    assert found[("sluice_source_split_pendingRecords", (*labels, ("split", p0)))] == 40
    assert found[("sluice_source_split_pendingRecords", (*labels, ("split", p1)))] == 0
    assert found[("sluice_source_pendingRecords", labels)] == 40
    fetch = {split: found[("sluice_source_split_currentFetchEventTimeLag", (("format", FORMAT), ("split", split)))]
             for split in (p0, p1)}
    # Partition 0's newest fetched record is an hour old; partition 1's is seconds old.
    assert HOUR_MS - 1000 <= fetch[p0] < HOUR_MS + 300_000
    assert 0 <= fetch[p1] < 300_000
    rows = {row["split"]: row for row in state["splits"] if row["format"] == FORMAT}
    assert (rows[p0]["pending_records"], rows[p1]["pending_records"]) == (40, 0)
    assert rows[p0]["fetch_lag_ms"] == fetch[p0] and rows[p1]["fetch_lag_ms"] == fetch[p1]
    assert rows[p0]["source"] == topic and rows[p0]["reported"].endswith("Z")
