"""Appends, reads, sessions, conditions, command records and timestamping, through the official s2-sdk."""

import asyncio
import json
import time

import pytest
import s2_sdk
from s2_sdk import (
    AppendInput,
    CommandRecord,
    Compression,
    ReadLimit,
    Record,
    SeqNum,
    StreamConfig,
    TailOffset,
    Timestamp,
    Timestamping,
    TimestampingMode,
)

from tests.s2local.conftest import client_for, run


def records(n, start=0, size=10):
    return [Record(body=f"{i:0{size}d}".encode()) for i in range(start, start + n)]


async def new_stream(s2, basin, name="s", config=None):
    await s2.ensure_basin(basin)
    await s2.basin(basin).create_stream(name, config=config)
    return s2.basin(basin).stream(name)


def test_unary_append_read_and_tail(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            stream = await new_stream(s2, basin_name)
            assert (await stream.check_tail()).seq_num == 0
            ack = await stream.append(AppendInput(records=[Record(body=b"a", headers=[(b"h", b"1")]),
                                                           Record(body=b"b")]))
            assert (ack.start.seq_num, ack.end.seq_num, ack.tail.seq_num) == (0, 2, 2)
            ack2 = await stream.append(AppendInput(records=records(3)))
            assert (ack2.start.seq_num, ack2.end.seq_num) == (2, 5)
            batch = await stream.read(start=SeqNum(0))
            assert [r.seq_num for r in batch.records] == [0, 1, 2, 3, 4]
            assert batch.records[0].headers == [(b"h", b"1")] and batch.records[1].body == b"b"
            assert batch.tail.seq_num == 5
            tail = await stream.check_tail()
            assert tail.seq_num == 5 and tail.timestamp == batch.records[-1].timestamp

    run(scenario())


def test_bounded_reads_by_count_bytes_until_offset_and_timestamp(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            cfg = StreamConfig(timestamping=Timestamping(mode=TimestampingMode.CLIENT_REQUIRE, uncapped=True))
            stream = await new_stream(s2, basin_name, config=cfg)
            recs = [Record(body=b"x" * 10, timestamp=1000 + 10 * i) for i in range(20)]
            await stream.append(AppendInput(records=recs))
            assert len((await stream.read(start=SeqNum(0), limit=ReadLimit(count=7))).records) == 7
            # 10-byte bodies are 18 metered bytes each: 50 bytes hold 2 records.
            assert len((await stream.read(start=SeqNum(0), limit=ReadLimit(bytes=50))).records) == 2
            until = await stream.read(start=SeqNum(0), until_timestamp=1050)
            assert [r.timestamp for r in until.records] == [1000, 1010, 1020, 1030, 1040]
            by_ts = await stream.read(start=Timestamp(1095))
            assert by_ts.records[0].seq_num == 10 and by_ts.records[0].timestamp == 1100
            by_offset = await stream.read(start=TailOffset(3))
            assert [r.seq_num for r in by_offset.records] == [17, 18, 19]
            session = [b async for b in stream.read_session(start=SeqNum(5), limit=ReadLimit(count=12))]
            assert sum(len(b.records) for b in session) == 12 and session[0].records[0].seq_num == 5

    run(scenario())


def test_reading_past_the_tail_is_416_unless_clamped(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            stream = await new_stream(s2, basin_name)
            await stream.append(AppendInput(records=records(3)))
            with pytest.raises(s2_sdk.ReadUnwrittenError) as past:
                await stream.read(start=SeqNum(10))
            assert past.value.status_code == 416 and past.value.tail.seq_num == 3
            # Clamped to the tail, with nothing to wait for: S2 answers 416 as well (s2-lite's read_start_seq_num).
            with pytest.raises(s2_sdk.ReadUnwrittenError) as clamped:
                await stream.read(start=SeqNum(10), clamp_to_tail=True)
            assert clamped.value.tail.seq_num == 3
            with pytest.raises(s2_sdk.ReadUnwrittenError):
                await stream.read(start=SeqNum(3))
            waited = await stream.read(start=SeqNum(10), clamp_to_tail=True, wait=1)
            assert waited.records == [] and waited.tail.seq_num == 3

    run(scenario())


def test_reads_that_start_at_the_tail_are_416_unless_they_may_wait(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            cfg = StreamConfig(timestamping=Timestamping(mode=TimestampingMode.CLIENT_REQUIRE, uncapped=True))
            stream = await new_stream(s2, basin_name, config=cfg)
            with pytest.raises(s2_sdk.ReadUnwrittenError) as empty:
                await stream.read(start=SeqNum(0))  # an empty stream
            assert (empty.value.status_code, empty.value.tail.seq_num) == (416, 0)
            await stream.append(AppendInput(records=[Record(body=b"x", timestamp=1000 + i) for i in range(3)]))
            with pytest.raises(s2_sdk.ReadUnwrittenError) as future:
                await stream.read(start=Timestamp(5000))  # after the last record's timestamp
            assert future.value.tail.seq_num == 3 and future.value.tail.timestamp == 1002
            with pytest.raises(s2_sdk.ReadUnwrittenError):
                await stream.read(start=Timestamp(5000), clamp_to_tail=True)
            assert (await stream.read(start=Timestamp(5000), clamp_to_tail=True, wait=1)).records == []
            assert [r.seq_num for r in (await stream.read(start=Timestamp(1002))).records] == [2]
            with pytest.raises(s2_sdk.S2ServerError) as until:
                await stream.read(start=Timestamp(1001), until_timestamp=1001)
            assert until.value.status_code == 422 and "until" in str(until.value)
            # Sessions: a bounded one at the tail is 416; an unbounded one follows the tail instead.
            with pytest.raises(s2_sdk.ReadUnwrittenError):
                async for _ in stream.read_session(start=SeqNum(3), limit=ReadLimit(count=5)):
                    pass
            session = stream.read_session(start=SeqNum(3))
            appended = asyncio.create_task(stream.append(AppendInput(records=[Record(body=b"y", timestamp=2000)])))
            async for batch in session:
                if batch.records:
                    assert batch.records[0].seq_num == 3
                    break
            await appended

    run(scenario())


def test_unary_read_waits_for_new_records(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            stream = await new_stream(s2, basin_name)

            async def later():
                await asyncio.sleep(0.3)
                await stream.append(AppendInput(records=records(2)))

            writer = asyncio.create_task(later())
            started = time.monotonic()
            batch = await stream.read(start=SeqNum(0), wait=10)
            await writer
            assert len(batch.records) == 2 and 0.2 < time.monotonic() - started < 5

    run(scenario())


def test_append_session_pipelines_batches_with_ordered_acks(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            stream = await new_stream(s2, basin_name)
            async with stream.append_session() as session:
                tickets = [await session.submit(AppendInput(records=records(100, start=i * 100))) for i in range(50)]
                acks = [await t for t in tickets]
            assert [a.start.seq_num for a in acks] == list(range(0, 5000, 100))
            assert all(a.end.seq_num - a.start.seq_num == 100 for a in acks)
            bodies = [r.body async for b in stream.read_session(start=SeqNum(0), limit=ReadLimit(count=5000))
                      for r in b.records]
            assert bodies == [f"{i:010d}".encode() for i in range(5000)]

    run(scenario())


def test_read_session_follows_the_tail_and_sends_heartbeats(s2_server, basin_name, monkeypatch):
    async def scenario():
        async with client_for(s2_server) as s2:
            stream = await new_stream(s2, basin_name)
            seen = []

            async def follow():
                async for batch in stream.read_session(start=SeqNum(0)):
                    seen.extend(r.body for r in batch.records)
                    if len(seen) >= 6:
                        return

            reader = asyncio.create_task(follow())
            for i in range(3):
                await asyncio.sleep(0.2)
                await stream.append(AppendInput(records=records(2, start=2 * i)))
            await asyncio.wait_for(reader, 10)
            assert seen == [f"{i:010d}".encode() for i in range(6)]

    run(scenario())


def test_match_seq_num_and_fencing_tokens(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            stream = await new_stream(s2, basin_name)
            await stream.append(AppendInput(records=records(2), match_seq_num=0))
            with pytest.raises(s2_sdk.SeqNumMismatchError) as seq:
                await stream.append(AppendInput(records=records(1), match_seq_num=0))
            assert seq.value.status_code == 412 and seq.value.expected_seq_num == 2
            await stream.append(AppendInput(records=[CommandRecord.fence("writer-a")]))
            with pytest.raises(s2_sdk.FencingTokenMismatchError) as fence:
                await stream.append(AppendInput(records=records(1), fencing_token="writer-b"))
            assert fence.value.expected_fencing_token == "writer-a"
            ack = await stream.append(AppendInput(records=records(1), fencing_token="writer-a", match_seq_num=3))
            assert ack.start.seq_num == 3
            # Fencing is checked before match_seq_num.
            with pytest.raises(s2_sdk.FencingTokenMismatchError):
                await stream.append(AppendInput(records=records(1), fencing_token="x", match_seq_num=0))

    run(scenario())


def test_a_failed_batch_ends_the_append_session_and_later_batches_are_not_applied(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            stream = await new_stream(s2, basin_name)
            with pytest.raises(s2_sdk.SeqNumMismatchError):
                async with stream.append_session() as session:
                    first = await session.submit(AppendInput(records=records(2), match_seq_num=0))
                    await session.submit(AppendInput(records=records(2), match_seq_num=99))
                    await session.submit(AppendInput(records=records(2)))
                    await first
            tail = await stream.check_tail()
            assert tail.seq_num == 2

    run(scenario())


def test_trim_command_moves_the_first_readable_record(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            stream = await new_stream(s2, basin_name)
            await stream.append(AppendInput(records=records(10)))
            await stream.append(AppendInput(records=[CommandRecord.trim(6)]))
            batch = await stream.read(start=SeqNum(0))
            assert batch.records[0].seq_num == 6
            assert batch.records[-1].is_command_record() and batch.records[-1].seq_num == 10
            assert len((await stream.read(start=SeqNum(0), ignore_command_records=True)).records) == 4

    run(scenario())


def test_timestamping_modes(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            future = int(time.time() * 1000) + 3_600_000
            prefer = await new_stream(s2, basin_name, "prefer")
            batch = [Record(body=b"a", timestamp=5), Record(body=b"b", timestamp=2),
                     Record(body=b"c", timestamp=future)]
            ack = await prefer.append(AppendInput(records=batch))
            got = [r.timestamp for r in (await prefer.read(start=SeqNum(0))).records]
            assert got[0] == 5 and got[1] == 5  # monotonic: 2 is raised to 5
            assert got[2] < future  # capped at arrival
            assert ack.end.timestamp == got[2]
            uncapped = await new_stream(s2, basin_name, "uncapped",
                                        StreamConfig(timestamping=Timestamping(uncapped=True)))
            await uncapped.append(AppendInput(records=[Record(body=b"a", timestamp=future)]))
            assert (await uncapped.read(start=SeqNum(0))).records[0].timestamp == future
            arrival = await new_stream(s2, basin_name, "arrival",
                                       StreamConfig(timestamping=Timestamping(mode=TimestampingMode.ARRIVAL)))
            await arrival.append(AppendInput(records=[Record(body=b"a", timestamp=5)]))
            assert (await arrival.read(start=SeqNum(0))).records[0].timestamp > 5
            require = await new_stream(s2, basin_name, "require",
                                       StreamConfig(timestamping=Timestamping(mode=TimestampingMode.CLIENT_REQUIRE)))
            with pytest.raises(s2_sdk.S2ServerError) as missing:
                await require.append(AppendInput(records=[Record(body=b"a")]))
            assert missing.value.status_code == 422

    run(scenario())


@pytest.mark.parametrize("compression", [Compression.ZSTD, Compression.GZIP])
def test_compressed_sessions_and_unary_requests(s2_server, basin_name, compression):
    async def scenario():
        async with client_for(s2_server, compression=compression) as s2:
            stream = await new_stream(s2, basin_name)
            big = [Record(body=b"z" * 4000) for _ in range(50)]
            await stream.append(AppendInput(records=big))
            async with stream.append_session() as session:
                await (await session.submit(AppendInput(records=big)))
            got = [r async for b in stream.read_session(start=SeqNum(0), limit=ReadLimit(count=100))
                   for r in b.records]
            assert len(got) == 100 and all(r.body == b"z" * 4000 for r in got)
            assert len((await stream.read(start=SeqNum(0))).records) == 100

    run(scenario())


def test_create_stream_on_append_and_read(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            await s2.create_basin(basin_name, config=s2_sdk.BasinConfig(create_stream_on_append=True,
                                                                         create_stream_on_read=True))
            basin = s2.basin(basin_name)
            await basin.stream("auto-a").append(AppendInput(records=records(1)))
            with pytest.raises(s2_sdk.ReadUnwrittenError):  # created by the read, and empty: 416 as on S2
                await basin.stream("auto-r").read(start=SeqNum(0))
            assert {s.name async for s in basin.list_all_streams()} == {"auto-a", "auto-r"}

    run(scenario())


def test_missing_stream_and_basin_errors(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            with pytest.raises(s2_sdk.S2ServerError) as no_basin:
                await s2.basin(basin_name).stream("s").check_tail()
            assert no_basin.value.code == "basin_not_found"
            await s2.create_basin(basin_name)
            with pytest.raises(s2_sdk.S2ServerError) as no_stream:
                await s2.basin(basin_name).stream("nope").append(AppendInput(records=records(1)))
            assert no_stream.value.status_code == 404 and no_stream.value.code == "stream_not_found"

    run(scenario())


@pytest.mark.parametrize("field", [
    {"records": [{"body": "x", "timestamp": -1}]},
    {"records": [{"body": "x", "timestamp": 1e30}]},
    {"records": [{"body": "x", "timestamp": "abc"}]},
    {"records": [{"body": "x", "timestamp": [1]}]},
    {"records": [{"body": "x"}], "match_seq_num": -5},
    {"records": [{"body": "x"}], "match_seq_num": "abc"},
    {"records": [{"body": "x"}], "fencing_token": "t" * 100},
    {"records": [{"body": "x"}], "fencing_token": 5},
])
def test_bad_json_appends_are_422_never_500(s2_server, basin_name, field):
    from tests.s2local.conftest import create_stream
    from tests.s2local.raw import h2_request

    create_stream(s2_server, basin_name)
    status, _, raw = h2_request(s2_server.port, "POST", "/v1/streams/s/records",
                                {"s2-basin": basin_name, "content-type": "application/json"},
                                json.dumps(field).encode())
    assert status == 422, raw



async def trimmed_to_tail(stream, tail: int, why: str) -> None:
    """Until every record of `stream` is trimmed (a read from 0 is then S2's 416, with the tail), for up to 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await stream.read(start=SeqNum(0))
        except s2_sdk.ReadUnwrittenError as trimmed:
            assert trimmed.tail.seq_num == tail
            return
        assert time.monotonic() < deadline, why
        await asyncio.sleep(0.1)


def test_records_past_the_retention_age_are_trimmed_and_others_kept(s2_server, basin_name):
    """StreamConfig.retention_policy: "Age in seconds for automatic trimming of records older than this threshold"
    (S2's API; its age counts from arrival here, whatever timestamp a client gave). The default (7 days) and
    "infinite" keep them: the negative controls."""

    async def scenario():
        async with client_for(s2_server) as s2:
            aged = await new_stream(s2, basin_name, "aged", StreamConfig(retention_policy=1))
            others = [await new_stream(s2, basin_name, "default"),
                      await new_stream(s2, basin_name, "kept", StreamConfig(retention_policy="infinite"))]
            for stream in (aged, *others):
                await stream.append(AppendInput(records=[Record(body=b"x", timestamp=1000 + i) for i in range(5)]))
            await trimmed_to_tail(aged, 5, "records outlived a 1 s retention age for 30 s")
            assert (await aged.check_tail()).seq_num == 5, "trimming moves the head, never the tail"
            for stream in others:
                assert [r.seq_num for r in (await stream.read(start=SeqNum(0))).records] == [0, 1, 2, 3, 4]

    run(scenario())


def test_records_stored_before_a_restart_are_trimmed_by_their_timestamps(tmp_path, basin_name):
    """A restarted server no longer knows when records arrived: their timestamps stand in, so a server restarted
    more often than the retention age still trims (a soak restarting S2 every two minutes kept every record).
    The stream with S2's default retention (7 days) keeps them: the negative control."""
    from sluice.s2local import LocalS2

    server = LocalS2(data_dir=tmp_path / "s2").start()
    try:
        async def write():
            async with client_for(server) as s2:
                for name, config in (("aged", StreamConfig(retention_policy=2)), ("default", None)):
                    stream = await new_stream(s2, basin_name, name, config)
                    await stream.append(AppendInput(records=[Record(body=b"x") for _ in range(5)]))

        run(write())
        server.kill()
        server.restart()

        async def trimmed():
            async with client_for(server) as s2:
                aged, default = (s2.basin(basin_name).stream(n) for n in ("aged", "default"))
                await trimmed_to_tail(aged, 5, "records stored before a restart outlived a 2 s age for 30 s")
                assert len((await default.read(start=SeqNum(0))).records) == 5

        run(trimmed())
    finally:
        server.stop()
