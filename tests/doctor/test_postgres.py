"""`sluice doctor` on a real PostgreSQL: the replication slot of a stopped change-capture query and the staged rows
a transactional write of that job left (its tasks staged, its driver never committed), beside a running query's
slot and its job's in-flight staged rows. Each is reported with its MetaService job; --fix drops the stopped job's
slot and rows, and the running query's slot and rows survive it, the query streaming on."""

import os
import uuid

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from sluice import OptionError
from sluice.cli import main as cli
from sluice.connectors.postgres import Connection
from sluice.connectors.postgres._options import WRITE_SPEC, WriteOptions
from sluice.connectors.postgres._table import prepare_target
from sluice.connectors.postgres.changes import list_slots
from sluice.doctor import PG_SLOT, Doctor, Stores
from sluice.meta import RUNNING, MetaService
from sluice.spark._compat import to_arrow_schema
from tests.connectors.postgres.test_changes import sql, stream


def micro_batch(reader, start):
    """One micro-batch as Spark runs it, committed: (end offset, rows)."""
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    batches = [b for p in reader.partitions(start, end) for b in reader.read(p)]
    reader.commit(end)
    return end, pa.Table.from_batches(batches, schema=to_arrow_schema(reader.schema)).to_pylist()


def staging_table(url, table):
    """The staging table sluice's driver makes for a transactional write into `table` (format("postgres") with
    sink.transactional), as it plans the write."""
    schema = StructType([StructField("id", LongType()), StructField("v", StringType())])
    opts = WRITE_SPEC.parse({"url": url, "table": table, "create-table": "true", "sink.mode": "global-ordered",
                             "sink.transactional": "true"})
    return prepare_target(Connection.from_options(opts), WriteOptions.of(opts), schema, to_arrow_schema(schema),
                          overwrite=False, staged=True).stage_table


def stage(url, table, write_id, rows):
    """Rows a task of write `write_id` staged for epoch 0 and its driver never committed (the query stopped
    first), tagged as sluice's tasks tag them."""
    values = ", ".join(f"({i}, 'v', '{write_id}', 0, 0, 1, {i})" for i in range(rows))
    sql(url, f"INSERT INTO {table} VALUES {values}")


def test_a_stopped_querys_slot_and_staged_rows_are_removed_and_a_running_querys_are_left(lpg, tmp_path, capsys,
                                                                                         monkeypatch):
    meta_url = str(tmp_path / "meta.db")
    meta = MetaService(meta_url)
    suffix = uuid.uuid4().hex[:8]
    stopped_q, running_q = str(uuid.uuid4()), str(uuid.uuid4())
    stopped = meta.register_job("cdc-stopped", sources=[], sinks=["orders_copy"], query_id=stopped_q)
    running = meta.register_job("cdc-running", sources=[], sinks=["items_copy"], query_id=running_q)
    for name in (f"orders_{suffix}", f"items_{suffix}"):
        sql(lpg.url, f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
    old = stream(lpg.url, table=f"orders_{suffix}", snapshot="false", slot=f"sluice_orders_{suffix}",
                 job=stopped.job_id, meta=meta_url)
    live = stream(lpg.url, table=f"items_{suffix}", snapshot="false", slot=f"sluice_items_{suffix}",
                  job=running.job_id, meta=meta_url)
    unowned = stream(lpg.url, table=f"items_{suffix}", snapshot="false", slot=f"sluice_unowned_{suffix}")  # no 'job'
    nobodys = stream(lpg.url, table=f"items_{suffix}", snapshot="false", slot=f"sluice_nobody_{suffix}", job="nobody",
                     meta=meta_url)
    with pytest.raises(OptionError, match=r"option 'job' \(nobody\): no job 'nobody' in MetaService"):
        nobodys.initialOffset()  # a holding names a job the MetaService knows
    nobodys.stop()
    assert not sql(lpg.url, f"SELECT 1 FROM pg_replication_slots WHERE slot_name = 'sluice_nobody_{suffix}'"), \
        "refused before its slot was made"
    old_start, live_start = old.initialOffset(), live.initialOffset()
    unowned.initialOffset()
    unowned.stop()
    sql(lpg.url, f"INSERT INTO orders_{suffix} VALUES (1, 'a')", f"INSERT INTO items_{suffix} VALUES (1, 'a')")
    assert [r["id"] for r in micro_batch(old, old_start)[1]] == [1]
    live_end, rows = micro_batch(live, live_start)
    assert [r["id"] for r in rows] == [1]
    old.stop()
    meta.finish_job(stopped.job_id)  # the query stopped and its job ended (JobHandle.watch does this)
    sql(lpg.url, f"INSERT INTO orders_{suffix} SELECT g, 'b' FROM generate_series(2, 2000) g")  # WAL the slot keeps
    staging = staging_table(lpg.url, f"orders_copy_{suffix}")
    stage(lpg.url, staging, stopped_q, 3)
    stage(lpg.url, staging, running_q, 2)

    url = lpg.url.replace(f":{lpg.password}@", "@")
    monkeypatch.setenv("PGPASSWORD", lpg.password)
    assert cli(["doctor", "--meta", meta_url, "--postgres", url]) == 0
    out = capsys.readouterr().out
    assert lpg.password not in out
    report = out.split("\n    safe to remove")
    assert f"postgres-slot  sluice_orders_{suffix}  in {url}" in out
    assert f"owner: job {stopped.job_id} (cdc-stopped), finished" in out
    assert f"postgres-slot  sluice_items_{suffix}" in out and f"owner: job {running.job_id} (cdc-running), running" \
        in out
    assert "safe to remove: no (a running query holds it (server process" in out, "the running query's slot"
    assert f"postgres-staged-rows  public.{staging} write {stopped_q}" in out and "3 staged row(s)" in out
    assert f"postgres-staged-rows  public.{staging} write {running_q}" in out and "2 staged row(s)" in out
    assert out.count("safe to remove: yes (its job finished)") == 2, report
    assert f"sluice_unowned_{suffix}" in out and "safe to remove: no (no job of the MetaService owns it" in out
    findings = {f.name: f for f in Doctor(meta_url, Stores(postgres=url)).examine() if f.kind == PG_SLOT}
    assert findings[f"sluice_orders_{suffix}"].figures["retained_bytes"] > 0
    if sql(lpg.url, "SHOW server_version_num")[0][0] >= "170000":
        assert "inactive since" in findings[f"sluice_orders_{suffix}"].cost

    # The question waited while the stopped query was restarted under a new job: the verdict is taken again before
    # anything is removed, and what its query left is the running job's now.
    doctor = Doctor(meta_url, Stores(postgres=url))
    findings = [f for f in doctor.examine() if f.verdict.safe]
    restarted = meta.register_job("cdc-restarted", sources=[], sinks=["orders_copy"], query_id=stopped_q)
    actions = doctor.fix(findings, lambda q: True, yes=True)
    assert [a.what for a in actions] == [f"refused: not safe any more: its job runs (pid {os.getpid()} on this "
                                         "host)"] * 2
    assert sql(lpg.url, f"SELECT count(*) FROM {staging} WHERE _sluice_write = '{stopped_q}'") == [(3,)]
    meta.finish_job(restarted.job_id)

    assert cli(["doctor", "--meta", meta_url, "--postgres", url, "--fix", "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"done: postgres-slot sluice_orders_{suffix}: dropped replication slot sluice_orders_{suffix}" in out
    assert f"done: postgres-staged-rows public.{staging} write {stopped_q}: deleted 3 staged row(s)" in out
    assert f"not done: postgres-slot sluice_items_{suffix}: left as it is" in out
    slots = [s.name for s in list_slots(live.stream.conn)]
    assert f"sluice_orders_{suffix}" not in slots
    assert f"sluice_items_{suffix}" in slots and f"sluice_unowned_{suffix}" in slots, "not its job's: left"
    assert sql(lpg.url, f"SELECT _sluice_write, count(*) FROM {staging} GROUP BY 1") == [(running_q, 2)]
    assert [h.name for h in meta.holdings()] == [f"sluice_items_{suffix}"]
    sql(lpg.url, f"INSERT INTO items_{suffix} VALUES (2, 'b')")
    assert [r["id"] for r in micro_batch(live, live_end)[1]] == [2], "the running query streams on"
    assert meta.job(running.job_id).status == RUNNING
    live.stop()
    for slot in (f"sluice_items_{suffix}", f"sluice_unowned_{suffix}"):
        sql(lpg.url, f"SELECT pg_drop_replication_slot('{slot}')")
