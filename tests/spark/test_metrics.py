"""Live metrics from real Spark writes (sluice.metrics): tasks on executors report to the collector on the driver
over HTTP, and Prometheus' text format shows each format's counters rising while a streaming query runs."""

import logging
import re
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

import sluice
import sluice.metrics

pytestmark = pytest.mark.spark


def scraped(server) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {(s.name, s.labels.get("format", "")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_batch_write_reports_every_record_of_every_task_to_the_collector(spark, pg):
    with sluice.metrics.serve() as server:
        sluice.write(spark.range(0, 1000, 1, 4).selectExpr("id", "repeat('x', 10) AS body"), "sluice_null")
        table = f"metrics_{uuid.uuid4().hex[:8]}"
        spark.range(0, 500, 1, 2).selectExpr("id", "concat('n', id) AS name").write.format("postgres") \
            .option("url", pg.url).option("table", table).option("create-table", "true").mode("append").save()
        # Reads report too: every read task what it fetched.
        read = spark.read.format("postgres").option("url", pg.url).option("table", table) \
            .option("partition-column", "id").option("num-partitions", 3).load()
        assert read.count() == 500
        # A task sends its final report before it ends, so the write's end finds them all in.
        found = scraped(server)
        reads = server.reads.snapshot()
    assert found[("sluice_source_numRecordsIn_total", "postgres")] == 500
    assert reads["postgres"]["tasks_ended"] == 3 and reads["postgres"]["bytes"] > 0
    assert reads["postgres"]["event_lag_ms"] is None  # a table's rows carry no commit time
    assert found[("sluice_sink_numRecordsSend_total", "sluice_null")] == 1000
    assert found[("sluice_sink_tasks_total", "sluice_null")] == 4
    assert found[("sluice_sink_numRecordsSend_total", "postgres")] == 500
    assert found[("sluice_sink_numBytesSend_total", "postgres")] > 0
    assert found[("sluice_sink_tasksRunning", "postgres")] == 0


def test_records_sent_aside_are_shown_in_the_summary_on_the_metrics_and_by_the_doctor(spark, pg, tmp_path, capsys):
    import psycopg

    from sluice.cli import main as cli

    meta = str(tmp_path / "meta.db")  # where the driver notes the dead-letter target for sluice doctor
    table, letters = f"checked_{uuid.uuid4().hex[:8]}", f"letters_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint, v bigint CHECK (v >= 0))")
    rows = spark.range(0, 300, 1, 2).selectExpr("id", "CASE WHEN id IN (5, 150, 299) THEN -1 ELSE id END AS v")
    with sluice.metrics.serve() as server:
        rows.write.format("postgres").option("url", pg.url).option("table", table) \
            .option("errors.tolerance", "all").option("errors.deadletter.format", "postgres") \
            .option("errors.deadletter.url", pg.url).option("errors.deadletter.table", letters) \
            .option("errors.deadletter.create-table", "true").option("errors.meta", meta).mode("append").save()
        found = scraped(server)
    assert found[("sluice_sink_deadLetterRecords_total", "postgres")] == 3
    assert found[("sluice_sink_numRecordsSend_total", "postgres")] == 297  # the dead letters go round the metrics
    assert sluice.last_write_summary()["dead_letters"] == 3
    with psycopg.connect(pg.url) as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 297
        assert sorted(r[0] for r in conn.execute(f"SELECT record::json->>'id' FROM {letters}")) == ["150", "299", "5"]
    capsys.readouterr()
    assert cli(["doctor", "--meta", meta]) == 0
    listed = capsys.readouterr().out
    assert f"dead-letter-target  records of postgres  in postgres {letters}" in listed
    assert "3 records sent aside" in listed and "1 item(s), 0 safe to remove" in listed
    # Older than --dead-letters-since: not listed.
    assert cli(["doctor", "--meta", meta, "--dead-letters-since", "0"]) == 0
    assert "dead-letter-target" not in capsys.readouterr().out


def test_counters_rise_while_a_streaming_query_writes(spark, tmp_path):
    with sluice.metrics.serve() as server:
        query = spark.readStream.format("rate").option("rowsPerSecond", 200).load().selectExpr("value AS id") \
            .writeStream.format("sluice_null").option("checkpointLocation", str(tmp_path / "checkpoint")) \
            .trigger(processingTime="500 milliseconds").start()
        try:
            def records(snapshot) -> float:
                return snapshot.get("sluice_null", {}).get("records", 0)

            assert server.metrics.wait_for(lambda s: records(s) > 0, timeout=120), "no report from the query"
            first = scraped(server)[("sluice_sink_numRecordsSend_total", "sluice_null")]
            assert server.metrics.wait_for(lambda s: records(s) > first, timeout=60), "the counter stopped"
            assert scraped(server)[("sluice_sink_numRecordsSend_total", "sluice_null")] > first
        finally:
            query.stop()


def test_without_a_collector_writes_and_reads_report_nothing_and_still_succeed(spark, pg):
    """The negative control: a collector the writes and reads cannot find (its address withdrawn) hears nothing from
    them, so the reports above came through the address a write or read learns when it is planned."""
    from sluice.metrics._server import _advertised_file

    with sluice.metrics.serve() as server:
        _advertised_file().unlink()
        assert sluice.metrics.find_target() is None
        sluice.write(spark.range(0, 100, 1, 2), "sluice_null")
        assert sluice.last_write_summary("sluice_null")["records"] == 100
        table = f"unseen_{uuid.uuid4().hex[:8]}"
        spark.range(0, 50, 1, 1).write.format("postgres").option("url", pg.url).option("table", table) \
            .option("create-table", "true").mode("append").save()
        assert spark.read.format("postgres").option("url", pg.url).option("table", table).load().count() == 50
        assert server.metrics.snapshot() == {} and server.reads.snapshot() == {}


def test_change_capture_reports_how_far_its_slot_is_behind_and_the_wal_it_holds(spark, pg, tmp_path):
    """After each micro-batch it commits, the query's driver side reports its replication slot: the WAL between the
    slot's confirmed position and the server's, and the WAL the slot makes the server keep."""
    import psycopg

    table, slot = f"lag_{uuid.uuid4().hex[:8]}", f"sluice_lag_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text)")
        conn.execute(f"INSERT INTO {table} SELECT i, 'n' || i FROM generate_series(1, 100) i")
    with sluice.metrics.serve() as server:
        query = spark.readStream.format("postgres_changes").option("url", pg.url).option("table", table) \
            .option("slot", slot).load().writeStream.format("sluice_null") \
            .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="500 milliseconds") \
            .start()
        try:
            # Spark commits a micro-batch's source offsets when it plans the next one: changes keep batches coming.
            with psycopg.connect(pg.url, autocommit=True) as conn:
                for i in range(101, 141):
                    conn.execute(f"INSERT INTO {table} VALUES ({i}, 'more')")
                    if server.sources.wait_for(lambda reports: any(r.source == slot for r in reports), timeout=3):
                        break
            (report,) = [r for r in server.sources.snapshot() if r.source == slot]
            # The read tasks: changes fetched, and how long ago the newest was committed when fetched.
            assert server.reads.wait_for(lambda s: s.get("postgres_changes", {}).get("event_lag_ms") is not None,
                                         timeout=60), "no read task reported a commit time"
            reads = server.reads.snapshot()["postgres_changes"]
            text = urllib.request.urlopen(server.url + "/metrics", timeout=5).read().decode()
        finally:
            query.stop()
    assert report.format == "postgres_changes" and re.fullmatch(r"[0-9A-F]+/[0-9A-F]+", report.position)
    assert report.retained_bytes > 0 and report.pending_bytes >= 0
    assert f'sluice_source_retainedBytes{{format="postgres_changes",source="{slot}"}}' in text
    assert reads["records"] >= 101 and 0 <= reads["event_lag_ms"] < 120_000  # the snapshot's 100 and a change
    assert 'sluice_source_currentFetchEventTimeLag{format="postgres_changes"}' in text
    with psycopg.connect(pg.url, autocommit=True) as conn:  # the suite's server: hold no WAL back after the test
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_an_s2_query_reports_the_records_it_is_behind_and_catches_up(spark, tmp_path):
    from sluice.s2local import LocalS2

    with LocalS2() as s2, sluice.metrics.serve() as server:
        conn = {"s2.basin": f"lag-{uuid.uuid4().hex[:8]}", "s2.endpoints.account": s2.url,
                "s2.endpoints.basin": s2.url, "s2.auth-token": "local"}
        spark.range(0, 1000, 1, 1).selectExpr("CAST(id AS string) AS body").write.format("s2").options(**conn) \
            .option("s2.stream", "events").option("s2.create-basin", "true").option("s2.create-streams", "true") \
            .mode("append").save()
        query = spark.readStream.format("s2").options(**conn).option("s2.streams", "events") \
            .option("max-records-per-trigger", 100).load().writeStream.format("sluice_null") \
            .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="200 milliseconds") \
            .start()
        source = f"{conn['s2.basin']}/events"

        def behind(reports) -> int | None:
            return next((r.pending_records for r in reports if r.source == source), None)

        try:
            assert server.sources.wait_for(lambda r: (behind(r) or 0) > 0, timeout=120), "no report of the lag"
            first = behind(server.sources.snapshot())
            assert first is not None and first <= 900  # at least one batch of 100 committed
            assert server.sources.wait_for(lambda r: behind(r) is not None and behind(r) < first, timeout=120)
        finally:
            query.stop()
        text = urllib.request.urlopen(server.url + "/metrics", timeout=5).read().decode()
        reads = server.reads.snapshot()["s2"]
        [report] = [r for r in server.sources.snapshot() if r.source == source]
        lags = [lag for lag in server.reads.split_lags() if lag.format == "s2"]
    assert f'sluice_source_pendingRecords{{format="s2",source="{source}"}}' in text
    # The split framework's per-split view, S2's without code of its own: the stream is the split.
    assert [(s.split, s.pending_records) for s in report.splits] == [("events", report.pending_records)]
    assert f'sluice_source_split_pendingRecords{{format="s2",source="{source}",split="events"}}' in text
    assert [lag.split for lag in lags] == ["events"] and 0 <= lags[0].lag_ms < 600_000
    # S2's record timestamps (when the store took each record): how old the newest fetched record was.
    assert reads["records"] >= 200 and 0 <= reads["event_lag_ms"] < 600_000


def test_a_long_sluice_write_prints_its_progress_while_it_runs(spark, caplog, monkeypatch):
    from sluice.metrics import _progress

    monkeypatch.setattr(_progress, "AFTER_S", 0.0)  # a line at once and every 0.2 s, not after 5 s and every 5
    monkeypatch.setattr(_progress, "EVERY_S", 0.2)
    rows = spark.range(0, 3_000_000, 1, 2).selectExpr("repeat('x', 40) AS body")
    with caplog.at_level(logging.INFO, logger="sluice.progress"):
        sluice.write(rows, "sluice_null")  # no collector: no progress (the negative control)
        assert not [r for r in caplog.records if r.name == "sluice.progress"]
        with sluice.metrics.serve():
            sluice.write(rows, "sluice_null")
    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.progress"]
    counted = [int(m.group(1).replace(",", "")) for line in lines
               if (m := re.match(r"sluice_null: ([\d,]+) records written so far \([\d,]+/s, \d+ s\)$", line))]
    assert counted and len(counted) == len(lines), lines
    assert 0 < counted[0] <= 3_000_000
