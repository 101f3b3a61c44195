"""Several writer processes on one stream; kill -9 of the server mid-stream and a restart on the same data."""

import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import s2_sdk

from sluice.s2local import LocalS2
from tests.s2local.conftest import client_for, create_stream, run


def start_writer(server, basin, writer, batches, size, log: Path):
    cmd = [sys.executable, "-m", "tests.s2local.writer_proc", str(server.port), basin, "s", writer, str(batches),
           str(size), str(log)]
    return subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2])


def read_all(server, basin):
    async def scenario():
        async with client_for(server) as s2:
            stream = s2.basin(basin).stream("s")
            tail = (await stream.check_tail()).seq_num
            out = []
            if tail:
                async for batch in stream.read_session(start=s2_sdk.SeqNum(0), limit=s2_sdk.ReadLimit(count=tail)):
                    out.extend((r.seq_num, r.body.decode()) for r in batch.records)
            return out

    return run(scenario())


def check_batches(records, size):
    """Seq nums contiguous from 0; every batch whole, in order and contiguous; no record twice."""
    assert [seq for seq, _ in records] == list(range(len(records)))
    bodies = [body for _, body in records]
    assert len(set(bodies)) == len(bodies), "a record is stored twice"
    where = {}
    for index in range(0, len(bodies), size):
        chunk = bodies[index:index + size]
        writer, batch, _ = chunk[0].split(":")
        assert chunk == [f"{writer}:{batch}:{i}" for i in range(size)], f"batch at {index} is torn or interleaved"
        where[(writer, int(batch))] = index
    return where


def acked(log: Path):
    if not log.exists():
        return {}
    out = {}
    for line in log.read_text().splitlines():
        batch, start, end = map(int, line.split())
        out[batch] = (start, end)
    return out


def test_concurrent_writer_processes_get_contiguous_seq_nums_and_whole_batches(tmp_path):
    with LocalS2() as server:
        create_stream(server, "concurrency")
        writers = {f"w{n}": start_writer(server, "concurrency", f"w{n}", 40, 50, tmp_path / f"w{n}.log")
                   for n in range(3)}
        for proc in writers.values():
            assert proc.wait(120) == 0
        records = read_all(server, "concurrency")
    assert len(records) == 3 * 40 * 50
    where = check_batches(records, 50)
    for name in writers:
        for batch, (start, end) in acked(tmp_path / f"{name}.log").items():
            assert where[(name, batch)] == start and end - start == 50  # the ack names where the batch is


def test_every_acknowledged_append_survives_kill_9(tmp_path):
    data = tmp_path / "data"
    server = LocalS2(data_dir=data).start()
    try:
        create_stream(server, "crash-test")
        logs = {f"w{n}": tmp_path / f"w{n}.log" for n in range(2)}
        writers = [start_writer(server, "crash-test", name, 100_000, 20, log) for name, log in logs.items()]
        deadline = time.monotonic() + 30
        while sum(len(acked(log)) for log in logs.values()) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        server.kill()  # SIGKILL mid-stream: no shutdown, no flush
        for proc in writers:
            proc.kill()
            proc.wait()
        acks = {name: acked(log) for name, log in logs.items()}
        assert sum(map(len, acks.values())) >= 200, "the writers never got going"
    finally:
        server.kill()
    with LocalS2(data_dir=data) as restarted:
        records = read_all(restarted, "crash-test")
    where = check_batches(records, 20)  # no partial batch, no duplicate, no gap
    missing = defaultdict(list)
    for name, batches in acks.items():
        for batch, (start, _) in batches.items():
            if where.get((name, batch)) != start:
                missing[name].append(batch)
    assert not missing, f"acknowledged batches lost after kill -9: {dict(missing)}"
