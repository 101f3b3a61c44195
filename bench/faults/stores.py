"""bench.faults's faults on ClickHouse, OpenSearch and HBase: a Python worker killed mid-task, a failed write run
again, the server restarted mid-write, a streaming driver killed; each store on the servers its tests use (the chdb
stand-in on ClickHouse 26's engine, a LocalOpenSearch node, a LocalHBase with its Thrift2 gateway).

What each run counts is the store's rows by id after the fault: lost = ids missing, duplicated = rows beyond one per
id. The search engine and HBase upsert by key (an id is one document or one row whatever is replayed), so their
"duplicated" is 0 by construction and "lost" is what matters; ClickHouse appends, so a replay duplicates unless the
table deduplicates (insert.deduplicate, docs/clickhouse.md).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sluice

STORE_FAULTS = ("clickhouse", "opensearch", "hbase")


@dataclass(frozen=True)
class Bench:
    """What bench/faults/ hands over: its rows, its fault injectors and its record of results."""

    base: Any  # the DataFrame of ids 0..n-1 (id, k, pad)
    n: int
    work: Path
    inputs: Callable[[], Path]  # the streaming scenario's parquet input, written once
    write: Callable[[Any, str, dict, Any], None]
    strike_at: Callable[..., Any]
    paced: Any  # a pass-through that slows the write down, so a strike lands mid-write
    expect_failure: Callable[[Callable[[], None]], None]
    kill_driver_after: Callable[[str, dict, Path, Path], int]
    run_driver: Callable[..., Any]
    record: Callable[..., None]


@dataclass(frozen=True)
class Target:
    """One store's mode: the options of a fresh table or index, and how to read its ids back."""

    fmt: str
    make: Callable[[], tuple[dict[str, str], Callable[[], list[int]]]]


def restarted_mid_write(outage: Callable[[], None], stored: Callable[[], int], write_it: Callable[[], None]) -> str:
    """Run `write_it`; once some of its rows are stored, `outage()` (kill the server and start it again on its
    data). Says whether the outage met the write."""
    struck: list[float] = []

    def strike() -> None:
        deadline = time.monotonic() + 120
        while stored() < 500:
            if time.monotonic() > deadline:
                struck.append(float("inf"))
                return
            time.sleep(0.05)
        struck.append(time.monotonic())
        outage()

    striker = threading.Thread(target=strike)
    striker.start()
    write_it()
    ended = time.monotonic()
    striker.join()
    if not struck or struck[0] == float("inf"):
        return "the write never stored 500 rows before it ended (not a valid run)"
    return "struck mid-write" if struck[0] < ended else "strike came after the write (not a valid run)"


def run(bench: Bench, store: str) -> None:
    with _targets(bench, store) as (targets, outages, stored):
        for mode, target in targets.items():
            _faults(bench, mode, target, outages, stored)


def _faults(bench: Bench, mode: str, target: Target, outages: dict[str, Callable[[], None]],
            stored: Callable[[dict[str, str]], int]) -> None:
    n, work = bench.n, bench.work
    opts, ids = target.make()
    marker = work / f"die-{uuid.uuid4().hex[:6]}"
    marker.touch()
    bench.write(bench.base, target.fmt, opts, bench.strike_at(n * 3 // 4, str(marker), die=True))
    bench.record("worker", mode, ids())

    opts, ids = target.make()
    opts = {**opts, "sink.max-retries": "0"}
    if "insert.deduplicate" in opts:
        opts["sink.write-id"] = f"rerun-{uuid.uuid4().hex[:8]}"
    marker = work / f"fail-{uuid.uuid4().hex[:6]}"
    marker.touch()
    fault = bench.strike_at(n * 3 // 4, str(marker), die=False)
    bench.expect_failure(lambda: bench.write(bench.base, target.fmt, opts, fault))
    marker.unlink()
    bench.write(bench.base, target.fmt, opts, fault)
    bench.record("rerun", mode, ids(), "same write id" if "sink.write-id" in opts else "a re-run is a new write")

    for outage_name, outage in outages.items():
        opts, ids = target.make()
        opts = {**opts, "sink.max-retries": "60", "sink.retry-delay-ms": "250"}
        note = restarted_mid_write(outage, lambda opts=opts: stored(opts),
                                   lambda opts=opts: bench.write(bench.base, target.fmt, opts, bench.paced))
        retries = sluice.last_write_summary(target.fmt)["retries"]
        bench.record(f"{outage_name}-restart", mode, ids(), f"{note}, {retries} retries")

    opts, ids = target.make()
    checkpoint = work / f"ckpt-{uuid.uuid4().hex[:8]}"
    committed = bench.kill_driver_after(target.fmt, opts, bench.inputs(), checkpoint, 3)
    restarted = bench.run_driver(target.fmt, opts, bench.inputs(), checkpoint)
    if restarted.returncode:
        raise RuntimeError(f"the restarted driver for {mode} failed: {restarted.stderr.decode()[-3000:]}")
    bench.record("driver-kill", mode, ids(), f"killed while micro-batch {committed} of 10 was being written")


@contextmanager
def _targets(bench: Bench, store: str) -> Iterator[tuple[dict[str, Target], dict[str, Callable[[], None]],
                                                         Callable[[dict[str, str]], int]]]:
    """The store's modes, its outages by name (each kills a process and starts it again on its data), and how many
    rows a table or index holds now."""
    if store == "clickhouse":
        from tests.clickhouse_chdb import ChdbClickHouse

        with ChdbClickHouse() as ch:
            def table(settings: str = "") -> tuple[dict[str, str], Callable[[], list[int]]]:
                name = f"f_{uuid.uuid4().hex[:10]}"
                ch.sql(f"CREATE TABLE {name} (id Int64, k Int64, pad String) ENGINE = MergeTree() ORDER BY id"
                       f"{settings}")
                return ({"url": ch.url, "password": ch.password, "table": name},
                        lambda: [int(r[0]) for r in ch.rows(f"SELECT id FROM {name}")])

            def deduplicating() -> tuple[dict[str, str], Callable[[], list[int]]]:
                opts, ids = table(" SETTINGS non_replicated_deduplication_window = 1000")
                return {**opts, "insert.deduplicate": "true", "sink.batch.max-size": "500"}, ids

            def rows_in(opts: dict[str, str]) -> int:
                return int(ch.rows(f"SELECT count() FROM {opts['table']}")[0][0])

            yield ({"clickhouse unordered": Target("clickhouse", table),
                    "clickhouse exactly-once": Target("clickhouse", deduplicating)}, {"server": ch.restart}, rows_in)
    elif store == "opensearch":
        from sluice.testing import LocalOpenSearch
        from tests.connectors.elasticsearch.conftest import Search

        with LocalOpenSearch() as server:
            search = Search(server)

            def index() -> tuple[dict[str, str], Callable[[], list[int]]]:
                name = search.index_name()
                search.call("PUT", f"/{name}", {"settings": {"number_of_replicas": 0,
                                                             "translog.durability": "request"}})
                return (search.opts(name, **{"mapping.id": "id", "http.timeout-ms": "5000"}),
                        lambda: document_ids(search, name))

            def bounce() -> None:
                server.kill()
                server.start()

            yield ({"opensearch upsert": Target("elasticsearch", index)}, {"node": bounce},
                   lambda opts: search.count(opts["index"]))
    elif store == "hbase":
        from sluice.testing import LocalHBase
        from tests.connectors.hbase.conftest import HBase

        with LocalHBase() as server:
            hbase = HBase(server)

            def table() -> tuple[dict[str, str], Callable[[], list[int]]]:
                name = hbase.table()
                # Row keys: the id's 8 bytes, big-endian with the sign bit flipped (so keys sort as the ids do).
                return (hbase.opts(name, rowkey="id", family="d"),
                        lambda: [int.from_bytes(key, "big") - 2**63 for key in hbase.rows(name)])

            def bounce() -> None:  # the master and region server (standalone: one JVM) and the gateway
                server.kill()
                server.start()

            yield ({"hbase upsert": Target("hbase", table)}, {"gateway": server.restart_gateway, "server": bounce},
                   lambda opts: len(hbase.rows(opts["table"])))
    else:
        raise ValueError(f"unknown store {store!r}; one of {STORE_FAULTS}")


def document_ids(search: Any, index: str) -> list[int]:
    """Every document's id, in pages sorted by the id field (a search returns at most index.max_result_window,
    10,000, hits)."""
    search.call("POST", f"/{index}/_refresh")
    ids: list[int] = []
    after: list[Any] | None = None
    while True:
        body: dict[str, Any] = {"size": 5000, "sort": [{"id": "asc"}], "_source": False,
                                "query": {"match_all": {}}}
        if after is not None:
            body["search_after"] = after
        hits = search.call("GET", f"/{index}/_search", body)["hits"]["hits"]
        if not hits:
            return ids
        ids += [int(h["_id"]) for h in hits]
        after = hits[-1]["sort"]
