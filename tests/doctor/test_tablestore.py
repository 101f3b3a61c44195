"""`sluice doctor` over the MetaService alone: a table-store writer claim and a barrier in progress left by a job
whose process died (registered in a child process that exits without ending its job), beside a live job's claim
(this process): reported with their owners, the dead one removed by --fix, the live one reported not safe and left."""

import multiprocessing
import os
import uuid

import pytest

from sluice.cli import main as cli
from sluice.doctor import TABLE_BARRIER, TABLE_CLAIM, Doctor, Stores
from sluice.meta import RELEASED, RUNNING, MetaService, WriterConflictError


def _register_and_die(url: str, query_id: str) -> None:
    MetaService(url).register_job("dead-writer", sources=[], sinks=["ledger"], query_id=query_id)
    os._exit(0)  # a killed driver: its job is never ended


def by_name(meta, name):
    (job,) = [j for j in meta.jobs() if j.name == name]
    return job


def test_a_dead_jobs_claim_and_barrier_are_fixed_and_a_live_jobs_claim_is_left(tmp_path, capsys):
    url = str(tmp_path / "meta.db")
    meta = MetaService(url)
    dead_query = str(uuid.uuid4())
    child = multiprocessing.get_context("spawn").Process(target=_register_and_die, args=(url, dead_query))
    child.start()
    child.join()
    assert child.exitcode == 0
    dead = by_name(meta, "dead-writer")
    barrier = meta.batch_barrier(dead_query, 7, ["ledger"])  # its micro-batch 7 was given a barrier, never completed
    live = meta.register_job("live-writer", sources=[], sinks=["balances"], query_id=str(uuid.uuid4()))
    ended = meta.register_job("ended-writer", sources=[], sinks=["archive"])
    meta.finish_job(ended.job_id)
    with pytest.raises(WriterConflictError, match="'ledger' already has an active writer"):
        meta.register_job("next-writer", sources=[], sinks=["ledger"])

    # Without --dead-after a job recorded running is not removed, even with its pid gone: the hint says so.
    assert cli(["doctor", "--meta", url]) == 0
    out = capsys.readouterr().out
    assert f"tablestore-writer-claim  ledger  in MetaService({url})" in out
    assert (f"owner: job {dead.job_id} (dead-writer), running, host {dead.host} pid {dead.pid} "
            "(no such process now)") in out
    assert "its pid is gone from this host" in out and "give --dead-after SECONDS" in out
    assert "archive" not in out, "an ended job claims nothing"
    assert "0 safe to remove" in out

    assert cli(["doctor", "--meta", url, "--dead-after", "0"]) == 0
    out = capsys.readouterr().out
    assert f"tablestore-barrier-in-progress  barrier {barrier} of query {dead_query}" in out
    assert "micro-batch 7 got barrier" in out and "not yet completed by ledger" in out
    assert "safe to remove: yes (its job is recorded running but is dead: no such process on this host" in out
    assert f"owner: job {live.job_id} (live-writer), running" in out
    assert f"safe to remove: no (its job runs (pid {os.getpid()} on this host))" in out, "the live job: not safe"

    # --fix without --yes asks about everything, and a "no" removes nothing.
    doctor = Doctor(url, Stores(), dead_after=0)
    questions = []
    actions = doctor.fix(doctor.examine(), lambda q: questions.append(q) or False)
    assert not any(a.done for a in actions)
    assert any(q.startswith(f"remove {TABLE_CLAIM} ledger") for q in questions)
    assert any(q.startswith(f"NOT SAFE: {TABLE_CLAIM} balances: its job runs") for q in questions)
    assert by_name(meta, "dead-writer").status == RUNNING

    # --yes skips the question for the safe items only: the live claim's question still comes (answered no here).
    assert cli(["doctor", "--meta", url, "--dead-after", "0", "--fix", "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"done: {TABLE_CLAIM} ledger: released job {dead.job_id}" in out
    assert f"{TABLE_BARRIER} barrier {barrier} of query {dead_query}: job {dead.job_id} was released already" in out
    assert f"not done: {TABLE_CLAIM} balances: left as it is" in out
    assert by_name(meta, "dead-writer").status == RELEASED
    assert by_name(meta, "live-writer").status == RUNNING, "the live job's claim survives"
    meta.register_job("next-writer", sources=[], sinks=["ledger"])  # the table can be written again
    assert [f.name for f in Doctor(url, Stores(), dead_after=0).examine()] == ["balances", "ledger"]

    # What is not safe goes only on an explicit yes to its own question.
    doctor = Doctor(url, Stores(), dead_after=0)
    live_claim = [f for f in doctor.examine() if f.name == "balances"]
    (action,) = doctor.fix(live_claim, lambda q: q.startswith(f"NOT SAFE: {TABLE_CLAIM} balances"), yes=True)
    assert action.done and by_name(meta, "live-writer").status == RELEASED
