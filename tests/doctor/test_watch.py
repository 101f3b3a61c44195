"""The doctor on `sluice ui`'s server: its rounds run in a thread of their own, /metrics exports them as
sluice_doctor_* gauges, /api/doctor as JSON, and the page (Debian's chromium driven by Playwright) shows each
leftover with its owner and whether it is safe to remove. Without a doctor there is no section and no gauge."""

import json
import multiprocessing
import uuid
from pathlib import Path
from urllib.request import urlopen

from sluice.doctor import Doctor, DoctorWatch, Stores
from sluice.meta import MetaService
from sluice.ui import serve_ui
from tests.doctor.test_tablestore import _register_and_die

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def get(url):
    with urlopen(url, timeout=30) as answer:
        return answer.read().decode()


def test_the_doctors_findings_are_gauges_and_a_section_of_the_page(tmp_path):
    assert CHROMIUM.exists(), "the browser test needs Debian's chromium: make check-chromium (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    url = str(tmp_path / "meta.db")
    meta = MetaService(url)
    child = multiprocessing.get_context("spawn").Process(target=_register_and_die, args=(url, str(uuid.uuid4())))
    child.start()
    child.join()
    live = meta.register_job("live-writer", sources=[], sinks=["balances"])

    with serve_ui(url) as plain:
        assert json.loads(get(plain.url + "/api/doctor")) == {"enabled": False}
        assert "sluice_doctor_" not in get(plain.url + "/metrics")

    watch = DoctorWatch(Doctor(url, Stores(), dead_after=0), every_s=0.5).start()
    try:
        assert watch.wait_round(30), "the doctor's first round did not end within 30 s"
        with serve_ui(url, doctor=watch) as server:
            metrics = get(server.url + "/metrics")
            assert 'sluice_doctor_items{kind="tablestore-writer-claim",safe="yes"} 1.0' in metrics
            assert 'sluice_doctor_items{kind="tablestore-writer-claim",safe="no"} 1.0' in metrics
            assert "sluice_doctor_round_failed 0.0" in metrics
            found = json.loads(get(server.url + "/api/doctor"))
            assert found["enabled"] and found["error"] is None
            assert {(i["name"], i["safe"]) for i in found["items"]} == {("ledger", True), ("balances", False)}

            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                page.goto(server.url + "/")
                store = f"MetaService({url})"
                for name in ("ledger", "balances"):
                    page.wait_for_selector(f'#doctor tr[data-name="{name} in {store}"]', timeout=30_000)
                assert page.is_visible("#doctor-section")
                row = '#doctor tr[data-name="{} in ' + store + '"] td:nth-child({})'
                assert page.text_content(row.format("ledger", 5)).startswith("yes (its job is recorded running but "
                                                                             "is dead: no such process on this host")
                assert page.text_content(row.format("balances", 4)).startswith(f"job {live.job_id} (live-writer)")
                assert page.text_content(row.format("balances", 5)).startswith("no (its job runs")
                assert "last round" in page.text_content("#doctor-status")
                page.screenshot(path=str(tmp_path / "doctor.png"), full_page=True)
                browser.close()
    finally:
        watch.stop()
