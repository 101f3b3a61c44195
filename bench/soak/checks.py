"""The soak's checks (bench/soak/): the invariant at every barrier (of `balances` and of the Kafka branch's
`balances_kafka`) and in the PostgreSQL copy while the pipeline runs, the S2 stream's and the Kafka topic's
numbering, and the copies equal to the source at the end."""

from __future__ import annotations

import json
import threading
import time

from bench.soak.bank import BRANCH_FAULTS, KAFKA_BRANCH_FAULTS, Run, read_rows, recovered
from bench.soak.stores import store_copies


def watch_copy(url: str, run: Run, marker_id: int, stop: threading.Event) -> None:
    """Read the PostgreSQL copy every 250 ms: the invariant, and the marker's latency."""
    seen = 0
    conn = None
    while not stop.wait(0.25):
        conn, rows = read_rows(conn, url, "SELECT count(*), coalesce(sum(balance), 0), max(v) FILTER (WHERE id = %s) "
                                          "FROM balances_copy", (marker_id,))
        if rows is None:
            continue
        count, total, mark = rows[0]
        now = time.monotonic()
        with run.lock:
            run.copy_reads += 1
        if count and (count != run.accounts or total != run.total):
            run.violate(f"the PostgreSQL copy holds {count} accounts and {total} in all, not {run.accounts} "
                        f"and {run.total}")
        if mark is None or mark <= seen:
            continue
        with run.lock:
            for v in range(seen + 1, mark + 1):
                committed = run.marker_commits.get(v)
                if committed is not None:
                    run.latencies.append((committed, now - committed))
                    recovered(run, committed, now, lambda kind: kind not in BRANCH_FAULTS)
        seen = mark


def watch_barriers(meta_url: str, warehouse: str, name: str, run: Run, stop: threading.Event,
                   marker_id: int | None = None) -> None:
    """Read table `name` at every barrier the table store completes: every account, the constant total. With
    `marker_id` (the Kafka branch): the marker's changes arriving there tell when its faults recovered."""
    import pyarrow.compute as pc

    from sluice.meta import MetaService
    from sluice.tablestore import StoreTable

    checked: set[int] = set()
    table = StoreTable(name, warehouse)
    mark = 0
    while not stop.wait(1.0):
        try:
            barriers = MetaService(meta_url).barriers(name)
        except Exception:
            continue  # the MetaService's database is down (a fault): read again later
        for barrier, version in barriers:
            if barrier in checked:
                continue
            try:
                data = table.delta(version).to_pyarrow_table(columns=["id", "balance", "v"])
            except Exception as e:
                if "no version" in str(e):  # vacuumed meanwhile: nothing to check any more
                    checked.add(barrier)
                continue
            checked.add(barrier)
            now = time.monotonic()
            with run.lock:
                run.barriers_checked[name] = run.barriers_checked.get(name, 0) + 1
                if marker_id is not None:
                    marks = data.filter(pc.equal(data.column("id"), marker_id)).column("v").to_pylist()
                    for v in range(mark + 1, max(marks, default=0) + 1):
                        if (committed := run.marker_commits.get(v)) is not None:
                            recovered(run, committed, now, lambda kind: kind in KAFKA_BRANCH_FAULTS)
                    mark = max([mark, *marks])
            total = pc.sum(data.column("balance")).as_py() or 0
            if version == 0 and data.num_rows == 0:
                # Spark runs a query's first micro-batch even when its source has nothing committed yet (the S2
                # stream's first micro-batch still being appended): the table's creation, before any data.
                continue
            if data.num_rows != run.accounts or total != run.total:
                run.violate(f"barrier {barrier} (version {version}) of {name} holds {data.num_rows} accounts and "
                            f"{total} in all, not {run.accounts} and {run.total}")


def check_s2_stream(s2, accounts: int) -> list[str]:
    """Every account's changes in the S2 stream exactly once and in order: v consecutive from its first record."""
    import asyncio

    import s2_sdk

    problems: list[str] = []
    last: dict[int, int] = {}
    counted = {"changes": 0, "records": 0}

    async def read_all() -> None:
        async with s2_sdk.S2(s2.access_token, endpoints=s2.endpoints) as client:
            stream = client.basin("sluice-soak").stream("bank")
            tail, position = (await stream.check_tail()).seq_num, 0
            counted["records"] = tail
            while position < tail:
                batch = await stream.read(start=s2_sdk.SeqNum(position), limit=s2_sdk.ReadLimit(count=1000))
                if not batch.records:
                    break
                for record in batch.records:
                    position = record.seq_num + 1
                    headers = {bytes(k): bytes(v) for k, v in record.headers}
                    if headers.get(b"@action") != b"u" or b"@key" not in headers:
                        continue  # fence and trim commands of exactly-once writers
                    counted["changes"] += 1
                    key, v = json.loads(headers[b"@key"])["id"], json.loads(record.body)["v"]
                    if key in last and v != last[key] + 1 and len(problems) < 20:
                        kind = "duplicated" if v <= last[key] else "lost"
                        problems.append(f"S2: account {key} went from v={last[key]} to v={v} at seq "
                                        f"{record.seq_num} ({kind})")
                    last[key] = max(v, last.get(key, v))

    asyncio.run(read_all())
    if len(last) != accounts:
        problems.append(f"S2: {len(last)} accounts in the stream, not {accounts}")
    print(f"S2 stream bank: {counted['changes']:,} change records of {counted['records']:,} (fences included)",
          flush=True)
    return problems


def check_kafka_topic(kafka, topic: str, accounts: int) -> list[str]:
    """Every account's changes in the Kafka topic, as a read_committed consumer sees it, exactly once and in order: v
    consecutive from its first record."""
    from sluice.testing import read_committed

    problems: list[str] = []
    last: dict[int, int] = {}
    try:
        records = read_committed(kafka.client_config(), topic, timeout=300)
    except Exception as e:  # the broker did not come back from a fault: reported, never hidden
        return [f"Kafka: the topic {topic!r} could not be read: {type(e).__name__}: {str(e)[:300]}"]
    for record in records:
        change = json.loads(record.value)
        key, v = change["id"], change["v"]
        if key in last and v != last[key] + 1 and len(problems) < 20:
            kind = "duplicated" if v <= last[key] else "lost"
            problems.append(f"Kafka: account {key} went from v={last[key]} to v={v} at offset {record.offset} ({kind})")
        last[key] = max(v, last.get(key, v))
    if len(last) != accounts:
        problems.append(f"Kafka: {len(last)} accounts in the topic, not {accounts}")
    print(f"Kafka topic {topic}: {len(records):,} change records (read_committed)", flush=True)
    return problems


def wait_equal(env: dict, accounts: int, timeout: float) -> tuple[bool, str]:
    """Until the table store, the PostgreSQL copy, the ClickHouse copy (and with --stores the Cassandra, OpenSearch
    and HBase copies) equal `accounts` row for row."""
    import psycopg

    from sluice.tablestore import StoreTable

    deadline = time.monotonic() + timeout
    differ = ""
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(env["pipeline_url"], autocommit=True) as conn:
                source = conn.execute("SELECT id, balance, v FROM accounts ORDER BY id").fetchall()
                copy = conn.execute("SELECT id, balance, v FROM balances_copy ORDER BY id").fetchall()
            stored = {name: StoreTable(name, env["warehouse"]).delta().to_pyarrow_table(columns=["id", "balance", "v"])
                      for name in ("balances", "balances_kafka")}
            stored = {name: sorted(zip(*(t.column(c).to_pylist() for c in ("id", "balance", "v")), strict=True))
                      for name, t in stored.items()}
            ch = [(int(a), int(b), int(c)) for a, b, c in env["ch"].rows(
                "SELECT id, balance, v FROM balances_copy FINAL ORDER BY id")]
            designed = store_copies(env.get("stores"))
        except Exception as e:
            differ = f"not readable yet: {type(e).__name__}: {str(e)[:200]}"
            time.sleep(1)
            continue
        source = [tuple(r) for r in source]
        copies = {"the table store": stored["balances"], "the Kafka branch's table": stored["balances_kafka"],
                  "the PostgreSQL copy": [tuple(r) for r in copy], "the ClickHouse copy": ch, **designed}
        unequal = [name for name, rows in copies.items() if rows != source]
        if not unequal:
            return True, ""
        differ = ", ".join(f"{name} ({sum(1 for a, b in zip(copies[name], source, strict=False) if a != b)} rows "
                           f"differ, {len(copies[name])} rows)" for name in unequal)
        time.sleep(1)
    return False, f"after the writers stopped, {differ} not equal to accounts within {timeout:.0f} s"
