"""The soak's checks of the design-store copies (bench/soak/stores.py's watch_store, `python -m bench.soak --stores`) on
a real PostgreSQL source and a copy that misbehaves on purpose: a copy that keeps its promises passes, with a total
off the bank's counted and not a violation (it does not promise the total); each promise broken (an account ahead of
the source, going back, at a state the source never had, vanished) is a violation naming it."""

import threading
import uuid

import psycopg
import pytest

from bench.soak.bank import Run
from bench.soak.stores import watch_store

MARKER = 2
# The source after two transfers: account 0 went 100 -> 70 (v=1) -> 60 (v=2), account 1 100 -> 130 -> 140.
HISTORY = {(0, 1): 70, (0, 2): 60, (1, 1): 130, (1, 2): 140, (MARKER, 0): 0}
GOOD = [(0, 70, 1), (1, 130, 1), (MARKER, 0, 0)]


class ScriptedCopy:
    """Stands in for Stores: each read of the copy gives the next scripted rows, then the last ones again."""

    def __init__(self, reads: list[list[tuple[int, int, int]]]) -> None:
        self.reads, self.served = reads, 0
        self.all_served = threading.Event()

    def rows(self, copy: str) -> list[tuple[int, int, int]]:
        rows = self.reads[min(self.served, len(self.reads) - 1)]
        self.served += 1
        if self.served >= len(self.reads):
            self.all_served.set()
        return rows


@pytest.fixture(scope="module")
def source_url(pg):
    """A schema of its own holding the source `accounts` at v=2, the URL's search_path on it."""
    schema = f"soak_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.accounts (id int PRIMARY KEY, balance bigint, v bigint)")
        conn.execute(f"INSERT INTO {schema}.accounts VALUES (0, 60, 2), (1, 140, 2), ({MARKER}, 0, 0)")
    separator = "&" if "?" in pg.url else "?"
    return f"{pg.url}{separator}options=-csearch_path%3D{schema}"


def watched(source_url: str, reads: list[list[tuple[int, int, int]]]) -> Run:
    run = Run(accounts=3, total=200)
    run.history.update(HISTORY)
    copy, stop = ScriptedCopy(reads), threading.Event()
    watcher = threading.Thread(target=watch_store, args=(copy, "cassandra", source_url, run, MARKER, stop))
    watcher.start()
    assert copy.all_served.wait(60), "the watcher did not read every scripted state"
    copy.all_served.clear()
    assert copy.all_served.wait(30), "the watcher did not read the last state twice"  # so it was checked
    stop.set()
    watcher.join(30)
    return run


def test_a_copy_that_keeps_its_promises_passes_and_a_total_off_is_only_counted(source_url):
    half_applied = [(0, 60, 2), (1, 130, 1), (MARKER, 0, 0)]  # one side of the second transfer: 190 in all
    run = watched(source_url, [GOOD, half_applied, [(0, 60, 2), (1, 140, 2), (MARKER, 0, 0)]])
    assert run.violations == []
    assert run.store_reads["cassandra"]["total_off"] >= 1, run.store_reads


@pytest.mark.parametrize("later, broken", [
    ([(0, 55, 3), (1, 145, 3), (MARKER, 0, 0)], "account 0 at v=3, ahead of the source's v=2"),
    ([(0, 100, 0), (1, 100, 0), (MARKER, 0, 0)], "account 0 went back from v=1 to v=0"),
    ([(0, 61, 2), (1, 130, 1), (MARKER, 0, 0)], "account 0 at v=2 holds 61, the source had 60"),
    ([(0, 70, 1), (MARKER, 0, 0)], "account 1 vanished (last seen at v=1)"),
], ids=["ahead", "back", "a state the source never had", "vanished"])
def test_each_promise_broken_is_a_violation(source_url, later, broken):
    run = watched(source_url, [GOOD, later])
    assert any(f"the cassandra copy: {broken}" in v for v in run.violations), run.violations
