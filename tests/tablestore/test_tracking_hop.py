"""End to end (docs/tablestore.md, "A tracking-column stream as a hop"): PostgreSQL's tracking-column stream into a
table-store table, exactly-once across a driver killed mid-stream.

Two writers insert rows into a PostgreSQL table whose tracking column is an identity id, each transaction held open
a random while (up to HOLD_S) between its INSERT (which takes the ids) and its COMMIT, so they commit out of order of
their ids; one row is made late on purpose, committed after the stream has planned past a greater id. The streaming
query runs in a driver process of its own (tracking_hop_proc.py) and appends to the table store, one Delta version
and one barrier per micro-batch. The driver is SIGKILLed right after the table store committed a micro-batch (the
MetaService shows its barrier completed) and restarted on its checkpoint, while the writers go on.

What holds: the table ends with every source row exactly once, the late row included; and every barrier's version
holds a prefix of the source in tracking order (every id up to its greatest, once): a micro-batch reads a range
(after, upto] of positions and the lag window keeps `upto` behind rows still being committed.

Negative controls (in the test's own session: they switch a mechanism off, the deployment is the same): with
`tracking.lag-window-ms=0` the late row is lost; a replay of a committed micro-batch whose commit does not carry the
identity the sink de-duplicates by (the checkpoint's query id, changed) stores that micro-batch's rows twice.
"""

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from sluice.meta import MetaService
from sluice.tablestore import StoreTable
from tests.faults import poll_until
from tests.tablestore.tracking_hop_proc import start_query

pytestmark = pytest.mark.spark

WINDOW_MS = 3000  # far above a writer's longest transaction (HOLD_S) and the two micro-batches the late row waits
HOLD_S = 0.25


class Driver:
    """The query's driver: its Python process, its Spark JVM and Python workers, one process group."""

    def __init__(self, pg, source: str, store: dict, checkpoint: Path, window_ms: int, trigger: str, log: Path):
        env = {**os.environ, "PYTHONPATH": os.getcwd(), "TRACKING_HOP_PG_URL": pg.url}
        self.log = log
        with log.open("a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.tablestore.tracking_hop_proc", source, store["warehouse"],
                 store["meta"], str(checkpoint), str(window_ms), trigger],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

        def gone():
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            return False

        poll_until(gone, 30, "every process of the killed driver ending")

    def alive(self) -> bool:
        assert self.proc.poll() is None, f"the driver ended ({self.proc.returncode}): {self.output()}"
        return True

    def output(self) -> str:
        return self.log.read_text()[-4000:]


class InProcess:
    """The same query in the test's own session (the negative controls: they show the mechanism off, not the
    deployment)."""

    def __init__(self, spark, pg, source: str, store: dict, checkpoint: Path, window_ms: int, trigger: str):
        self.query = start_query(spark, pg.url, source, store["warehouse"], store["meta"], str(checkpoint),
                                 str(window_ms), trigger)

    def alive(self) -> bool:
        assert self.query.exception() is None, self.query.exception()
        return True

    def kill(self) -> None:
        self.query.stop()


class Writers:
    """Two writers, each in a loop: INSERT 1-4 rows (taking their ids), hold the transaction open up to HOLD_S,
    COMMIT. `commits` is every transaction's ids, in commit order."""

    def __init__(self, url: str, table: str) -> None:
        self.commits: list[list[int]] = []
        self.errors: list[BaseException] = []
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(url, table, n), daemon=True) for n in (1, 2)]
        for thread in self._threads:
            thread.start()

    def _run(self, url: str, table: str, seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(url) as conn:
                while not self._stop.is_set():
                    ids = [r[0] for r in conn.execute(
                        f"INSERT INTO {table} (writer) SELECT %s FROM generate_series(1, %s) RETURNING id",
                        (f"w{seed}", rng.randint(1, 4))).fetchall()]
                    time.sleep(rng.uniform(0, HOLD_S))  # the transaction is open: its ids are taken, not visible
                    with self._lock:  # commit and note it in one step: `commits` is in commit order
                        conn.commit()
                        self.commits.append(ids)
        except BaseException as error:  # handed to stop(): the test's thread raises it
            self.errors.append(error)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        assert not self.errors, self.errors

    def out_of_order(self) -> int:
        """Commits carrying an id smaller than one committed before them."""
        count, highest = 0, 0
        for ids in self.commits:
            count += min(ids) < highest
            highest = max(highest, *ids)
        return count


def stored_ids(table: StoreTable, version: int | None = None) -> list[int]:
    return table.delta(version).to_pyarrow_table(columns=["id"]).column("id").to_pylist()


def completed(meta: MetaService) -> int:
    return len(meta.barriers("events"))


def newest(checkpoint: Path, log: str) -> int:
    """The newest micro-batch in the checkpoint's `offsets` (planned) or `commits` (done) log, -1 for none."""
    folder = checkpoint / log
    return max((int(p.name) for p in folder.iterdir() if p.name.isdigit()), default=-1) if folder.is_dir() else -1


def late_row(pg, source: str, meta: MetaService, driver, checkpoint: Path) -> int:
    """Transaction A takes an id and waits; B takes a greater one and commits; A commits once a micro-batch planned
    after B's commit has been read and committed (the one after the next planned: the next may have been planning
    already), so a stream without the window has read past A's id before A's row was visible. Returns A's id."""
    poll_until(lambda: driver.alive() and completed(meta) >= 2, 240, "the stream's first micro-batches", 0.1)
    with psycopg.connect(pg.url) as a, psycopg.connect(pg.url) as b:
        late = a.execute(f"INSERT INTO {source} (writer) VALUES ('late') RETURNING id").fetchone()[0]
        early = b.execute(f"INSERT INTO {source} (writer) VALUES ('early') RETURNING id").fetchone()[0]
        b.commit()
        assert late < early
        after = newest(checkpoint, "offsets") + 2
        poll_until(lambda: driver.alive() and newest(checkpoint, "commits") >= after, 120,
                   f"micro-batch {after} committed", 0.02)
        a.commit()
    return late


def kill_after_a_committed_micro_batch(driver, checkpoint: Path, meta: MetaService) -> tuple[int, int]:
    """SIGKILL the driver right after the table store committed the newest micro-batch Spark planned, M (its barrier
    completed in the MetaService). The driver is frozen (SIGSTOP) to check, between the sink's commit and the next
    micro-batch's planning, that no later one was planned; else it goes on and the check waits for the next.

    Spark writes its commit log right after the sink's commit; when the kill came after that write too, its entry
    for M is removed: the checkpoint is then as a kill a moment earlier leaves it, and the restart replays M, a
    micro-batch the table already holds (a kill cannot be timed into those milliseconds without a hook in the
    driver). Returns (M, M's barrier)."""

    def sink_committed() -> tuple[int, int] | None:
        last = meta.last_batch_barriers()  # the sink takes a micro-batch's barrier when it commits it
        if not last:
            return None
        (batch, barrier), = last.values()
        planned = newest(checkpoint, "offsets")
        done = {b for b, _ in meta.barriers("events")}
        return (batch, barrier) if batch == planned and barrier in done else None

    deadline = time.monotonic() + 120
    while True:
        driver.alive()
        found = poll_until(sink_committed, 120, "the sink committing the newest planned micro-batch", 0.01)
        driver.signal(signal.SIGSTOP)
        if sink_committed() == found:
            break
        driver.signal(signal.SIGCONT)
        assert time.monotonic() < deadline, "never caught the driver between a commit and the next planning"
    driver.kill()
    batch, barrier = found
    entry = checkpoint / "commits" / str(batch)
    if entry.exists():
        entry.unlink()
        (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)
    return batch, barrier


def versions_of(table: StoreTable, barrier: int) -> list[int]:
    return [h["version"] for h in table.delta().history() if h.get("sluice.barrier") == str(barrier)]


def start(pg, tmp_path):
    source = pg.table("tracked")
    pg.sql(f"CREATE TABLE {source} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, writer text NOT NULL)")
    pg.sql(f"INSERT INTO {source} (writer) SELECT 'seed' FROM generate_series(1, 10)")
    store = {"warehouse": str(tmp_path / "wh"), "meta": str(tmp_path / "meta.db")}
    return source, store, MetaService(store["meta"]), StoreTable("events", store["warehouse"])


def last_row_arrives(pg, source: str, table: StoreTable, driver) -> int:
    """One more row, after every other: once the table has it, the stream has passed every row before it."""
    last = pg.sql(f"INSERT INTO {source} (writer) VALUES ('last') RETURNING id")[0][0]
    poll_until(lambda: driver.alive() and table.exists() and last in stored_ids(table), 180,
               "the last row in the table store", 0.3)
    return last


def test_a_tracking_stream_into_the_table_store_is_exactly_once_across_a_driver_kill(spark, pg, tmp_path):
    source, store, meta, table = start(pg, tmp_path)
    checkpoint, log = tmp_path / "ck", tmp_path / "driver.log"
    driver = Driver(pg, source, store, checkpoint, WINDOW_MS, "processing-time", log)
    writers = None
    try:
        poll_until(lambda: driver.alive() and completed(meta) >= 1, 240, "the stream's first micro-batch", 0.1)
        writers = Writers(pg.url, source)
        late = late_row(pg, source, meta, driver, checkpoint)
        replayed, replayed_barrier = kill_after_a_committed_micro_batch(driver, checkpoint, meta)
        held = stored_ids(table)
        driver = Driver(pg, source, store, checkpoint, WINDOW_MS, "processing-time", log)  # the writers go on
        poll_until(lambda: driver.alive() and (checkpoint / "commits" / str(replayed)).exists(), 240,
                   f"the restarted driver replaying micro-batch {replayed}", 0.1)
        before = completed(meta)
        poll_until(lambda: driver.alive() and completed(meta) >= before + 2, 120, "micro-batches after the replay")
        writers.stop()
        last = last_row_arrives(pg, source, table, driver)

        written = [r[0] for r in pg.sql(f"SELECT id FROM {source} ORDER BY id")]
        ids = stored_ids(table)
        twice = sorted(i for i, n in Counter(ids).items() if n > 1)
        assert Counter(ids) == Counter(written), f"missing {sorted(set(written) - set(ids))[:10]}, twice {twice[:10]}"
        assert late in ids and last == written[-1]
        assert writers.out_of_order() > 0, "the writers never committed out of order: the test did not exercise it"
        assert len(held) < len(written), "the driver was killed mid-stream, before the rows written after it"
        assert len(versions_of(table, replayed_barrier)) == 1, f"micro-batch {replayed} committed once"
        barriers = meta.barriers("events")
        assert [b for b, _ in barriers] == sorted({b for b, _ in barriers})
        for barrier, version in barriers:
            at = stored_ids(table, version)
            assert len(at) == len(set(at)), f"barrier {barrier}: a row twice"
            assert sorted(at) == [i for i in written if i <= max(at)], f"barrier {barrier}: not a prefix"

        # For the negative control: a last micro-batch, committed, then the driver killed as before.
        burst = {r[0] for r in pg.sql(f"INSERT INTO {source} (writer) SELECT 'burst' FROM generate_series(1, 100) "
                                      "RETURNING id")}
        poll_until(lambda: driver.alive() and burst <= set(stored_ids(table)), 180, "the burst in the table", 0.3)
        again, again_barrier = kill_after_a_committed_micro_batch(driver, checkpoint, meta)
    finally:
        if writers is not None:
            writers.stop()
        driver.kill()

    # Negative control: the restart replays micro-batch `again`, committed already, under another query id (the
    # identity the sink's commit carries as a Delta app transaction and de-duplicates by): its rows land twice.
    (version,) = versions_of(table, again_barrier)
    previous = max(v for _, v in meta.barriers("events") if v < version)
    batch_rows = Counter(stored_ids(table, version)) - Counter(stored_ids(table, previous))
    assert batch_rows, f"micro-batch {again} added rows"
    metadata = checkpoint / "metadata"
    metadata.write_text(json.dumps({**json.loads(metadata.read_text()), "id": str(uuid.uuid4())}))
    for job in meta.jobs():  # the killed query's hold on the table, as `sluice meta release-job` ends it
        if job.status == "running":
            meta.release_job(job.job_id)
    rerun = InProcess(spark, pg, source, store, checkpoint, WINDOW_MS, "available-now")
    assert rerun.query.awaitTermination(240)
    rerun.alive()
    twice = sorted(i for i, n in Counter(stored_ids(table)).items() if n == 2)
    assert twice == sorted(batch_rows), "exactly the replayed micro-batch's rows twice"
    assert set(stored_ids(table)) == set(written) | burst


def test_negative_control_without_the_lag_window_the_late_row_is_lost(spark, pg, tmp_path):
    source, store, meta, table = start(pg, tmp_path)
    query = InProcess(spark, pg, source, store, tmp_path / "ck", 0, "processing-time")
    writers = None
    try:
        poll_until(lambda: query.alive() and completed(meta) >= 1, 240, "the stream's first micro-batch", 0.1)
        writers = Writers(pg.url, source)
        late = late_row(pg, source, meta, query, tmp_path / "ck")
        writers.stop()
        last_row_arrives(pg, source, table, query)
    finally:
        if writers is not None:
            writers.stop()
        query.kill()
    ids = stored_ids(table)
    assert late not in ids, "the row committed after the stream passed its id is never read"
    assert len(ids) == len(set(ids))
