"""`sluice ui` in a real browser (Debian's chromium driven by Playwright) while a two-hop streaming pipeline runs on
the table store: the graph shows both jobs and tables, the tables' barriers and lag update, a consistent-read point
is found, the live metrics of the writes appear; and when the page stops updating it says so."""

import re
import time
from pathlib import Path

import pytest

import sluice.tablestore
from sluice.metrics import SourceReport
from sluice.metrics._push import SourceReporter
from sluice.ui import serve_ui

pytestmark = pytest.mark.spark

CHROMIUM = Path("/usr/bin/chromium")
# As the machine's notes say: no sandbox as root, and none of Chromium's background connections.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def cell(page, table: str, row: str, column: int) -> str:
    return page.text_content(f'#{table} tr[data-name="{row}"] td:nth-child({column})')


def test_the_page_shows_a_running_two_hop_pipeline_move(spark, tmp_path):
    assert CHROMIUM.exists(), "the browser test needs Debian's chromium: make check-chromium (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    store = {"warehouse": str(tmp_path / "wh"), "meta": str(tmp_path / "meta.db")}
    spark.createDataFrame([(0, 0, 1.0)], "id long, customer long, amount double").write.format("tablestore") \
        .option("table", "orders").option("primary-key", "id").options(**store).mode("append").save()
    # Before the queries start: their writes report to it. A chart point every half second, for the test's sake.
    with serve_ui(store["meta"], chart_interval_s=0.5) as server:
        job_a = sluice.tablestore.register_job(spark, "A", sources=[], sinks=["orders"], meta=store["meta"])
        query_a = job_a.watch(
            spark.readStream.format("rate").option("rowsPerSecond", 50).load()
            .selectExpr("value % 100 AS id", "value % 7 AS customer", "CAST(value % 13 AS double) AS amount")
            .writeStream.format("tablestore").option("table", "orders").options(**store)
            .option("checkpointLocation", str(tmp_path / "ck-a")).trigger(processingTime="500 milliseconds").start())
        job_b = sluice.tablestore.register_job(spark, "B", sources=["orders"], sinks=["totals"], meta=store["meta"])
        changes = spark.readStream.format("tablestore").option("table", "orders").option("changes", "true") \
            .options(**store).load()
        query_b = job_b.watch(
            changes.selectExpr("customer", sluice.tablestore.signed_change("amount") + " AS signed")
            .groupBy("customer").agg({"signed": "sum"}).withColumnRenamed("sum(signed)", "total")
            .writeStream.format("tablestore").option("table", "totals").option("primary-key", "customer")
            .options(**store).outputMode("complete").option("checkpointLocation", str(tmp_path / "ck-b"))
            .trigger(processingTime="500 milliseconds").start())
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                page.goto(server.url + "/")
                for node in (f"job:{job_a.job_id}", "table:orders", f"job:{job_b.job_id}", "table:totals"):
                    page.wait_for_selector(f'#lineage g[data-id="{node}"]', timeout=60_000)
                assert page.get_attribute('#lineage g[data-id="job:' + job_a.job_id + '"]', "class") == "job running"

                # The tables move: totals' last barrier changes while the page is open (the page polls by itself).
                page.wait_for_function("() => { const c = document.querySelector("
                                       "'#tables tr[data-name=\"totals\"] td:nth-child(3)'); "
                                       "return c && c.textContent !== '-'; }", timeout=120_000)
                first = cell(page, "tables", "totals", 3)
                assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", first), first  # a time, not epoch ms
                page.wait_for_function("(first) => document.querySelector("
                                       "'#tables tr[data-name=\"totals\"] td:nth-child(3)').textContent !== first",
                                       arg=first, timeout=120_000)
                assert re.fullmatch(r"\d+\.\d s", cell(page, "tables", "totals", 6))  # lag behind orders
                assert cell(page, "tables", "totals", 5) == "orders"

                # The writes' live metrics: the table store's counters, pushed by the tasks to this same server.
                page.wait_for_selector('#metrics tr[data-name="tablestore"]', timeout=60_000)
                assert int(cell(page, "metrics", "tablestore", 2)) > 0
                # And the reads': job B's tasks count the changes they fetch from `orders`.
                page.wait_for_function("() => { const c = document.querySelector("
                                       "'#reads tr[data-name=\"tablestore\"] td:nth-child(2)'); "
                                       "return c && Number(c.textContent) > 0; }", timeout=60_000)

                # A source's lag, as a streaming source's driver side reports it: a figure it cannot tell shows "-".
                lag = SourceReport(format="s2", source="shop/events", pending_records=42, at=time.time())
                SourceReporter(server.target).report(lag)
                page.wait_for_selector('#sources tr[data-name="shop/events"]', timeout=30_000)
                assert (cell(page, "sources", "shop/events", 3), cell(page, "sources", "shop/events", 4),
                        cell(page, "sources", "shop/events", 5)) == ("-", "42", "-")
                # A write that sent records aside (errors.tolerance=all): its final task report, as a task pushes it.
                from sluice.engine import LiveStats
                from sluice.metrics._push import MetricsPusher
                from sluice.metrics._report import TaskIdentity

                refused = LiveStats(997, 9_970, 4, 3, 0, 0, 0, 0, 1000, 0, 1.0, time.monotonic(), 0.0, 3)
                MetricsPusher(server.target, TaskIdentity("postgres", "w-aside", 0, 0, 1, None)).close(refused)
                page.wait_for_selector('#metrics tr[data-name="postgres"]', timeout=30_000)
                assert (cell(page, "metrics", "postgres", 2), cell(page, "metrics", "postgres", 5)) == ("997", "3")
                # Job B's table-store source reports how far it is behind the newest barrier of `orders`, in time.
                page.wait_for_selector('#sources tr[data-name="orders"]', timeout=60_000)
                assert cell(page, "sources", "orders", 2) == "tablestore"
                assert re.fullmatch(r"\d+\.\d s", cell(page, "sources", "orders", 5))

                # The charts of the last minutes: the writes' records/s and job B's time behind, each a line of
                # several points (one per sample), drawn from the collector's own history.
                for series in ("sink:tablestore:records_per_s", "source:tablestore orders:time_behind_ms"):
                    page.wait_for_function("(key) => { const c = document.querySelector("
                                           "`#charts .chart[data-series=\"${key}\"]`); "
                                           "return c && Number(c.dataset.points) >= 3; }", arg=series, timeout=60_000)
                points = page.get_attribute('#charts .chart[data-series="sink:tablestore:records_per_s"] polyline',
                                            "points")
                assert len(points.split()) >= 3 and any(float(p.split(",")[1]) < 58 for p in points.split()), \
                    f"records/s never above 0 on the chart: {points}"

                page.fill("#consistent-tables", "orders,totals")
                page.click("#consistent-form button")
                page.wait_for_function("() => /version/.test(document.getElementById('consistent-result')"
                                       ".textContent)", timeout=30_000)
                assert "orders version" in page.text_content("#consistent-result")
                shot = tmp_path / "sluice-ui.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
                print(f"screenshot: {shot}")

                # The negative control: with the server gone the page cannot update, and it says so.
                server.close()
                page.wait_for_selector("#status.stale", timeout=30_000)
                assert "not updating" in page.text_content("#status")
                browser.close()
        finally:
            query_a.stop()
            query_b.stop()


def test_the_page_shows_each_split_of_a_streaming_source_with_its_own_lag(tmp_path):
    """A split source's report (as the split framework's driver side sends it) and its read tasks' fetch lags (as
    they send them) become one row per split: records behind, how old the newest fetched record was, positions."""
    assert CHROMIUM.exists(), "the browser test needs Debian's chromium: make check-chromium (apt-get install chromium)"
    import pyarrow as pa
    from playwright.sync_api import sync_playwright

    from sluice.metrics import SplitLag
    from sluice.metrics._reads import ReadObserver

    with serve_ui(str(tmp_path / "meta.db")) as server:
        splits = (SplitLag("orders:0", 60, 100, 40), SplitLag("orders:1", 20, 20, 0))
        SourceReporter(server.target).report(SourceReport(format="sluice_kafka", source="orders", pending_records=40,
                                                          at=time.time(), splits=splits))
        observer = ReadObserver.on_driver("sluice_kafka", event_time="timestamp")
        now_ms = int(time.time() * 1000)
        for split, age_ms in (("orders:0", 3_600_000), ("orders:1", 4_000)):
            stamp = pa.array([now_ms - age_ms], pa.timestamp("ms"))
            list(observer.observed(iter([pa.record_batch({"timestamp": stamp})]), split))
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(server.url + "/")
            page.wait_for_selector('#splits tr[data-name="orders:1"]', timeout=30_000)
            shown = {split: [cell(page, "splits", split, column) for column in range(2, 8)]
                     for split in ("orders:0", "orders:1")}
            browser.close()
    assert shown["orders:0"][:3] == ["orders", "sluice_kafka", "40"] and shown["orders:0"][4:] == ["60", "100"]
    assert shown["orders:1"][:3] == ["orders", "sluice_kafka", "0"] and shown["orders:1"][4:] == ["20", "20"]
    assert 3600.0 <= float(shown["orders:0"][3].removesuffix(" s")) < 3700.0  # the newest record an hour behind
    assert 4.0 <= float(shown["orders:1"][3].removesuffix(" s")) < 100.0
