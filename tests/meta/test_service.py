"""The MetaService on SQLite (default) and on a real PostgreSQL: registration rules, barriers, consistent versions,
and jobs in separate processes coordinating only through the database."""

import multiprocessing
import uuid

import pytest

from sluice.cli import main as cli
from sluice.meta import (
    FINISHED,
    RELEASED,
    RUNNING,
    LineageCycleError,
    MetaError,
    MetaService,
    NoConsistentVersionError,
    WriterConflictError,
)


@pytest.fixture(params=["sqlite", "postgres"])
def meta_url(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "meta.db")
    pg = request.getfixturevalue("pg")
    schema = f"meta_{uuid.uuid4().hex[:8]}"
    pg.sql(f"CREATE SCHEMA {schema}")
    return pg.url + f"?options=-csearch_path%3D{schema}"


def test_a_table_has_one_active_writer_until_its_job_ends(meta_url):
    meta = MetaService(meta_url)
    ingest = meta.register_job("ingest", sources=[], sinks=["orders"])
    with pytest.raises(WriterConflictError, match=rf"'orders' already has an active writer: job '{ingest.job_id}'"):
        meta.register_job("ingest-2", sources=[], sinks=["orders"])
    meta.finish_job(ingest.job_id)
    second = meta.register_job("ingest-2", sources=[], sinks=["orders"])
    assert [(j.name, j.status) for j in meta.jobs()] == [("ingest", FINISHED), ("ingest-2", RUNNING)]
    assert second.sinks == ("orders",)


def test_a_job_that_would_close_a_cycle_is_refused_with_the_cycle(meta_url):
    meta = MetaService(meta_url)
    meta.register_job("a", sources=["raw"], sinks=["orders"])
    meta.register_job("b", sources=["orders"], sinks=["totals"])
    with pytest.raises(LineageCycleError, match=r"\[c\] -> raw -> \[a\] -> orders -> \[b\] -> totals -> \[c\]"):
        meta.register_job("c", sources=["totals"], sinks=["raw"])
    with pytest.raises(LineageCycleError, match=r"loop -> \[self\] -> loop"):
        meta.register_job("self", sources=["loop"], sinks=["loop"])
    assert [j.name for j in meta.jobs()] == ["a", "b"]


def test_a_dead_job_is_released_from_the_cli(meta_url, capsys):
    meta = MetaService(meta_url)
    job = meta.register_job("orphan", sources=["x"], sinks=["y"])
    assert cli(["meta", "--meta", meta_url, "release-job", job.job_id]) == 0
    assert "released" in capsys.readouterr().out
    assert meta.job(job.job_id).status == RELEASED
    meta.register_job("next", sources=["x"], sinks=["y"])  # the table is free again
    assert cli(["meta", "--meta", meta_url, "release-job", job.job_id]) == 2
    assert "is not running" in capsys.readouterr().err


def test_barriers_are_committed_once_and_only_grow(meta_url):
    meta = MetaService(meta_url)
    assert meta.complete_barrier("orders", 1000, 3) is True
    assert meta.complete_barrier("orders", 1000, 3) is False  # replay
    with pytest.raises(MetaError, match="completed barrier 1000 in version 3 already"):
        meta.complete_barrier("orders", 1000, 4)
    meta.complete_barrier("orders", 2000, 5)
    with pytest.raises(MetaError, match="barrier 1500 is older"):
        meta.complete_barrier("orders", 1500, 6)
    assert meta.barriers("orders") == [(1000, 3), (2000, 5)]


def test_pruning_forgets_barriers_of_versions_no_read_can_open_but_never_the_newest(meta_url):
    meta = MetaService(meta_url)
    for barrier, version in ((1000, 1), (2000, 2), (3000, 3)):
        meta.complete_barrier("orders", barrier, version)
    assert meta.prune_barriers("orders", below_version=3) == 2
    assert meta.barriers("orders") == [(3000, 3)]
    assert meta.prune_barriers("orders", below_version=10) == 0, "the newest barrier stays, whatever its version"
    assert meta.consistent_version(["orders"]).barrier == 3000
    meta.complete_barrier("orders", 4000, 4)
    with pytest.raises(MetaError, match="barrier 2000 is older"):
        meta.complete_barrier("orders", 2000, 5)  # barriers still only grow


def test_replay_bookkeeping_is_kept_for_the_batches_spark_can_replay_only(meta_url, monkeypatch):
    """Spark can replay only the micro-batches whose metadata it retains (minBatchesToRetain, 100 by default):
    older rows are forgotten as new ones come, so the MetaService does not grow with every micro-batch."""
    from sluice.meta import _barriers

    monkeypatch.setattr(_barriers, "REPLAYABLE_BATCHES", 20)  # 200 in use: the same rule, fewer calls
    REPLAYABLE_BATCHES = _barriers.REPLAYABLE_BATCHES
    meta = MetaService(meta_url)
    batches = REPLAYABLE_BATCHES + 10
    assigned = {b: meta.batch_barrier("query-1", b, ["orders"]) for b in range(batches)}
    newest = batches - 1
    assert all(meta.batch_barrier("query-1", b, ["orders"]) == assigned[b]
               for b in range(batches - REPLAYABLE_BATCHES, batches)), "replays of recent batches keep their barrier"
    assert meta.batch_barrier("query-1", 0, ["orders"]) > assigned[newest], "batch 0 was forgotten: a new barrier"
    for barrier in range(1, batches + 1):
        meta.complete_barrier("orders", barrier, barrier)
    steps = [0]
    for barrier in range(1, batches + 1):  # a reader advancing one barrier per micro-batch
        meta.complete_barrier("totals", barrier, barrier)
        steps.append(meta.aligned_barrier(["orders", "totals"], steps[-1]))
    assert meta.aligned_barrier(["orders", "totals"], steps[-2]) == steps[-1], "a recent step replays the same"
    assert meta.aligned_barrier(["orders", "totals"], 0) == batches, "step 0 was forgotten: it is asked anew"


def test_the_consistent_version_is_the_newest_barrier_every_table_completed(meta_url, capsys):
    meta = MetaService(meta_url)
    meta.register_job("a", sources=[], sinks=["orders"])
    meta.register_job("b", sources=["orders"], sinks=["totals"])
    for barrier, version in ((1000, 1), (2000, 2), (3000, 3), (4000, 4)):
        meta.complete_barrier("orders", barrier, version)
    meta.complete_barrier("totals", 1000, 7)
    meta.complete_barrier("totals", 3000, 8)  # b processed barriers 2000 and 3000 in one micro-batch
    found = meta.consistent_version(["orders", "totals"])
    assert (found.barrier, found.versions) == (3000, {"orders": 3, "totals": 8})
    assert meta.consistent_version(["orders"]).barrier == 4000
    assert meta.tables() == {"orders": (4000, 4), "totals": (3000, 8)}
    assert cli(["meta", "--meta", meta_url, "consistent-version", "orders", "totals"]) == 0
    assert capsys.readouterr().out.split() == ["barrier", "3000", "orders:", "version", "3", "totals:", "version", "8"]
    assert cli(["meta", "--meta", meta_url, "lineage"]) == 0
    assert capsys.readouterr().out.splitlines() == ["(outside) -> [a] -> orders", "orders -> [b] -> totals"]
    with pytest.raises(NoConsistentVersionError, match=r"table\(s\) \['unknown'\] have no completed barrier at all"):
        meta.consistent_version(["orders", "unknown"])


def _register(url, barrier, results):
    try:
        MetaService(url).register_job(f"writer-{uuid.uuid4().hex[:4]}", sources=[], sinks=["contended"])
        results.put("ok")
    except WriterConflictError:
        results.put("conflict")


def test_jobs_in_separate_processes_coordinate_through_the_database(meta_url):
    MetaService(meta_url)  # schema first
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_register, args=(meta_url, None, results)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = sorted(results.get(timeout=10) for _ in procs)
    assert outcomes == ["conflict"] * 5 + ["ok"], outcomes


def test_lineage_is_drawn_as_a_png(meta_url, tmp_path, capsys):
    from PIL import Image

    meta = MetaService(meta_url)
    meta.register_job("ingest", sources=[], sinks=["orders"])
    meta.register_job("report", sources=["orders", "totals"], sinks=["daily"])
    meta.register_job("totals", sources=["orders"], sinks=["totals"])
    meta.complete_barrier("orders", 1000, 3)
    out = tmp_path / "lineage.png"
    assert cli(["meta", "--meta", meta_url, "lineage", "--png", str(out)]) == 0
    assert f"drew {out}" in capsys.readouterr().out
    image = Image.open(out)
    assert image.format == "PNG" and image.width > 4 * 210 and image.height > 2 * 54
    colors = {color for _, color in image.getcolors(maxcolors=1 << 16)}
    assert (0xE8, 0xF1, 0xFB) in colors and (0xFD, 0xF3, 0xE3) in colors, "table and job boxes are drawn"


def test_a_database_that_stops_answering_fails_the_call_instead_of_hanging(pg):
    """The network between a job and the MetaService's PostgreSQL goes silent (a proxy holds every byte): the call
    fails with the connection's error while the network is still silent, not when it answers again (found by the
    soak, bench/soak/, whose network stalls held a MetaService call for minutes). The first call's connection is
    kept: the second's BEGIN on it goes unanswered (the proxy acknowledges every byte, so TCP never times out)."""
    import threading
    from urllib.parse import urlsplit

    import psycopg

    from sluice.testing import TcpProxy

    port = urlsplit(pg.url).port
    with TcpProxy(port) as proxy:
        url = pg.url.replace(f":{port}/", f":{proxy.port}/")
        MetaService(url).tables()  # through the proxy, answering
        stalled, lifted = threading.Event(), threading.Event()

        def stall():
            stalled.set()
            proxy.stall(120)
            lifted.set()

        threading.Thread(target=stall, daemon=True).start()
        stalled.wait()
        with pytest.raises(psycopg.OperationalError, match="timeout"):
            MetaService(url).tables()
        assert not lifted.is_set(), "the call waited for the network to answer again"


def test_a_session_whose_client_vanished_mid_transaction_is_ended_by_the_server(pg):
    """A job's machine gone mid-transaction must not hold the MetaService's locks until the server's keepalives
    notice (hours by default): its sessions ask the server to end them after 60 s idle in a transaction, unless
    the URL sets that itself."""
    from sluice.meta._backend import Backend

    with Backend(pg.url + "?options=-csearch_path%3Dmeta_x").connect() as conn:
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("1min",)
        assert conn.execute("SHOW search_path").fetchone() == ("meta_x",)  # the URL's own options kept
    with Backend(pg.url + "?options=-cidle_in_transaction_session_timeout%3D5s").connect() as conn:
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("5s",)


def test_a_jobs_holdings_and_last_signs_of_life_are_recorded_and_renewed(meta_url):
    meta = MetaService(meta_url)
    job = meta.register_job("cdc", sources=[], sinks=["orders"], query_id="q-1")
    started = meta.last_signs_of_life()[job.job_id]
    assert started == job.started_at
    with pytest.raises(MetaError, match=r"no job 'nobody' .* to hold postgres-slot 'sluice_x'"):
        meta.record_holding("nobody", "postgres-slot", "app", "sluice_x")
    meta.record_holding(job.job_id, "postgres-slot", "app", "sluice_x")
    (held,) = meta.holdings()
    assert (held.kind, held.location, held.name, held.job_id) == ("postgres-slot", "app", "sluice_x", job.job_id)
    meta.record_holding(job.job_id, "postgres-slot", "app", "sluice_x")  # renewed, still one row
    (renewed,) = meta.holdings()
    assert renewed.seen_at >= held.seen_at and meta.last_signs_of_life()[job.job_id] == renewed.seen_at
    barrier = meta.batch_barrier("q-1", 4, ["orders"])
    meta.batch_barrier("q-1", 3, ["orders"])
    assert meta.last_batch_barriers() == {"q-1": (4, barrier)}
    meta.complete_barrier("orders", barrier, 1, job_id=job.job_id)
    assert meta.last_signs_of_life()[job.job_id] >= renewed.seen_at
    meta.forget_holding("postgres-slot", "app", "sluice_x")
    assert meta.holdings() == []
    before = meta.last_signs_of_life()[job.job_id]
    meta.record_sign_of_life(job.job_id)  # its driver: the query made progress
    assert meta.last_signs_of_life()[job.job_id] > before
    meta.finish_job(job.job_id)
    ended = meta.last_signs_of_life()[job.job_id]
    meta.record_sign_of_life(job.job_id)
    assert meta.last_signs_of_life()[job.job_id] == ended, "an ended job's driver says nothing any more"
