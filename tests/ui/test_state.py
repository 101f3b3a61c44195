"""What `sluice ui` shows, read from a real MetaService (SQLite): lag and age of tables, jobs' last commit, the
lineage laid out upstream to downstream, consistent-read points; and its HTTP API with and without a token."""

import json
import urllib.error
import urllib.request

import pytest

from sluice import OptionError
from sluice.meta import FINISHED, MetaService
from sluice.ui import consistent_point, read_state, serve_ui

T0 = 1_790_000_000_000  # a barrier: epoch milliseconds


@pytest.fixture
def meta(tmp_path):
    meta = MetaService(str(tmp_path / "meta.db"))
    a = meta.register_job("A", sources=[], sinks=["orders"])
    b = meta.register_job("B", sources=["orders"], sinks=["totals"])
    for i, version in enumerate((1, 2, 3)):
        meta.complete_barrier("orders", T0 + 1000 * i, version, job_id=a.job_id)
    meta.complete_barrier("totals", T0, 1, job_id=b.job_id)
    meta.complete_barrier("totals", T0 + 1000, 2, job_id=b.job_id)
    return meta, a, b


def test_tables_show_their_lag_behind_upstream_and_their_age_as_times(meta):
    service, _, _ = meta
    state = read_state(service, now=T0 / 1000 + 5)
    tables = {t.name: t for t in state.tables}
    assert tables["orders"].last_barrier == "2026-09-21T14:13:22.000Z" and tables["orders"].barriers == 3
    assert (tables["orders"].lag_s, tables["orders"].age_s, tables["orders"].upstream) == (None, 3.0, ())
    assert (tables["totals"].lag_s, tables["totals"].age_s, tables["totals"].upstream) == (1.0, 4.0, ("orders",))
    jobs = {j.name: j for j in state.jobs}
    assert jobs["A"].last_commit_age_s == 3.0 and jobs["B"].last_commit_age_s == 4.0
    assert jobs["A"].started.endswith("Z") and jobs["A"].status == "running"


def test_the_lineage_runs_from_upstream_to_downstream(meta):
    service, a, b = meta
    state = read_state(service)
    columns = {n.id: n.column for n in state.nodes}
    assert columns == {f"job:{a.job_id}": 0, "table:orders": 1, f"job:{b.job_id}": 2, "table:totals": 3}
    assert set(state.edges) == {(f"job:{a.job_id}", "table:orders"), ("table:orders", f"job:{b.job_id}"),
                                (f"job:{b.job_id}", "table:totals")}
    service.finish_job(b.job_id, FINISHED)
    assert [j.name for j in read_state(service, include_ended=False).jobs] == ["A"]


def test_a_consistent_read_point_or_why_there_is_none(meta):
    service, _, _ = meta
    assert consistent_point(service, ["orders", "totals"]) == {
        "tables": ["orders", "totals"], "barrier": "2026-09-21T14:13:21.000Z", "barrier_ms": T0 + 1000,
        "versions": {"orders": 2, "totals": 2}}
    assert "error" in consistent_point(service, ["orders", "nosuch"])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_page_and_its_api_over_http(meta, tmp_path):
    with serve_ui(str(tmp_path / "meta.db")) as server:
        status, page = get(server.url + "/")
        assert status == 200 and 'id="lineage"' in page
        status, body = get(server.url + "/api/state")
        state = json.loads(body)
        assert status == 200 and {t["name"] for t in state["tables"]} == {"orders", "totals"}
        assert state["metrics"] == {}  # no write reported yet; the same server collects them
        status, body = get(server.url + "/api/consistent?tables=orders,totals")
        assert json.loads(body)["versions"] == {"orders": 2, "totals": 2}
        assert get(server.url + "/api/consistent")[0] == 400


def test_off_loopback_a_token_is_required_and_it_opens_the_page(tmp_path, meta):
    with pytest.raises(OptionError, match="without token"):
        serve_ui(str(tmp_path / "meta.db"), host="0.0.0.0")
    with serve_ui(str(tmp_path / "meta.db"), token="ui-secret-51c") as server:
        assert get(server.url + "/api/state")[0] == 401
        assert get(server.url + "/")[0] == 401
        assert get(server.url + "/?token=ui-secret-51c")[0] == 200
        assert get(server.url + "/api/state?token=ui-secret-51c")[0] == 200


def test_the_sluice_ui_command_prints_its_address_and_never_the_token(meta, tmp_path):
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, "SLUICE_UI_TOKEN": "cli-secret-77a"}
    proc = subprocess.Popen([sys.executable, "-m", "sluice", "ui", "--meta", str(tmp_path / "meta.db"), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = proc.stdout.readline()  # the command's first line: an event, not a wait
        found = re.match(r"sluice ui at (http://127\.0\.0\.1:\d+)/\?token=\.\.\. \(Prometheus: .*/metrics\)", line)
        assert found, line
        assert "cli-secret-77a" not in line
        assert get(found.group(1) + "/api/state?token=cli-secret-77a")[0] == 200
        assert get(found.group(1) + "/api/state")[0] == 401
    finally:
        proc.terminate()
        proc.wait(10)
