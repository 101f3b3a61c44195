"""A walk of the official s2-sdk's public API against the local server.

Every public method of the SDK's client objects, every function s2_sdk exports, and every error class of its
exceptions module is mapped here to the test that exercises it (WALK, ERRORS), or, for an error this server cannot
produce, to the reason (NOT_PRODUCED). The client objects are found by introspection (the classes s2_sdk exports from
outside its `_types` and `_exceptions` modules: S2, S2Basin, S2Stream, AppendSession, Producer, ReadSession and the
submit tickets), plus the command-record helpers. test_the_walk_covers_the_sdks_public_api compares the maps with the
installed SDK, so a method or error class a later SDK version adds fails it until a test here walks it; the `walk`
fixture records every SDK call a test makes and every error it provokes, and fails a test that does not call, or
provoke, what the maps say it does.

The SDK's transport errors (s2_sdk._exceptions.TransportError and its subclasses) are not S2Error subclasses: the SDK
retries them and hands what is left to its caller as S2ClientError, which is walked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import s2_sdk
import s2_sdk._exceptions as sdk_exceptions
from s2_sdk import (
    AccessTokenScope,
    AccountMetricSet,
    Accumulation,
    AppendInput,
    BasinConfig,
    BasinMetricSet,
    Batching,
    CommandRecord,
    EnsureStatus,
    ExactMatch,
    Gauge,
    Label,
    Operation,
    OperationGroupPermissions,
    Permission,
    PrefixMatch,
    ReadLimit,
    Record,
    SeqNum,
    StreamConfig,
    StreamMetricSet,
    TailOffset,
    TimeseriesInterval,
)

from sluice.s2local import LocalS2
from tests.s2local.conftest import run
from tests.s2local.raw import h2_request

# Public method (or property, or protocol method) -> the test below that calls it.
WALK = {
    "S2.__aenter__": "test_client_handles_and_lifecycle",
    "S2.__aexit__": "test_client_handles_and_lifecycle",
    "S2.__getitem__": "test_client_handles_and_lifecycle",
    "S2.basin": "test_client_handles_and_lifecycle",
    "S2.close": "test_client_handles_and_lifecycle",
    "S2Basin.__getitem__": "test_client_handles_and_lifecycle",
    "S2Basin.name": "test_client_handles_and_lifecycle",
    "S2Basin.stream": "test_client_handles_and_lifecycle",
    "S2Stream.name": "test_client_handles_and_lifecycle",
    "S2.create_basin": "test_basin_operations",
    "S2.get_basin_config": "test_basin_operations",
    "S2.reconfigure_basin": "test_basin_operations",
    "S2.ensure_basin": "test_basin_operations",
    "S2.delete_basin": "test_basin_operations",
    "S2.list_basins": "test_basin_listing",
    "S2.list_all_basins": "test_basin_listing",
    "S2.list_locations": "test_locations",
    "S2.get_default_location": "test_locations",
    "S2.set_default_location": "test_locations",
    "S2.issue_access_token": "test_access_tokens",
    "S2.list_access_tokens": "test_access_tokens",
    "S2.list_all_access_tokens": "test_access_tokens",
    "S2.revoke_access_token": "test_access_tokens",
    "S2.account_metrics": "test_metrics",
    "S2.basin_metrics": "test_metrics",
    "S2.stream_metrics": "test_metrics",
    "s2_sdk.metered_bytes": "test_metrics",
    "S2Basin.create_stream": "test_stream_operations",
    "S2Basin.ensure_stream": "test_stream_operations",
    "S2Basin.get_stream_config": "test_stream_operations",
    "S2Basin.reconfigure_stream": "test_stream_operations",
    "S2Basin.delete_stream": "test_stream_operations",
    "S2Basin.list_streams": "test_stream_operations",
    "S2Basin.list_all_streams": "test_stream_operations",
    "S2Stream.append": "test_unary_append_read_and_tail",
    "S2Stream.read": "test_unary_append_read_and_tail",
    "S2Stream.check_tail": "test_unary_append_read_and_tail",
    "CommandRecord.fence": "test_unary_append_read_and_tail",
    "CommandRecord.trim": "test_unary_append_read_and_tail",
    "SequencedRecord.is_command_record": "test_unary_append_read_and_tail",
    "S2Stream.append_session": "test_append_session",
    "AppendSession.__aenter__": "test_append_session",
    "AppendSession.__aexit__": "test_append_session",
    "AppendSession.submit": "test_append_session",
    "AppendSession.close": "test_append_session",
    "BatchSubmitTicket.__await__": "test_append_session",
    "s2_sdk.append_inputs": "test_append_session",
    "s2_sdk.append_record_batches": "test_append_session",
    "S2Stream.producer": "test_producer",
    "Producer.__aenter__": "test_producer",
    "Producer.__aexit__": "test_producer",
    "Producer.submit": "test_producer",
    "Producer.flush": "test_producer",
    "Producer.close": "test_producer",
    "RecordSubmitTicket.__await__": "test_producer",
    "S2Stream.read_session": "test_read_session_and_caught_up",
    "ReadSession.__aenter__": "test_read_session_and_caught_up",
    "ReadSession.__aexit__": "test_read_session_and_caught_up",
    "ReadSession.__aiter__": "test_read_session_and_caught_up",
    "ReadSession.__anext__": "test_read_session_and_caught_up",
    "ReadSession.is_caught_up": "test_read_session_and_caught_up",
    "ReadSession.caught_up": "test_read_session_and_caught_up",
    "ReadSession.close": "test_read_session_and_caught_up",
}

# Error class of s2_sdk._exceptions -> the test below that provokes it from the server.
ERRORS = {
    "S2Error": "test_server_errors_carry_s2s_status_and_code",
    "S2ServerError": "test_server_errors_carry_s2s_status_and_code",
    "S2ClientError": "test_client_handles_and_lifecycle",
    "AppendConditionError": "test_append_conditions",
    "SeqNumMismatchError": "test_append_conditions",
    "FencingTokenMismatchError": "test_append_conditions",
    "ReadUnwrittenError": "test_read_past_the_tail",
    "AppendIndefiniteFailureError": "test_append_indefinite_failure",
}

# Error classes this server cannot produce, and why (docs/s2local.md says the same).
NOT_PRODUCED = {
    "ServerDrainingError": "S2 answers 503 server_draining from a node that is leaving service, so that the SDK "
                           "reconnects to another; this server is one process with no draining state (on SIGTERM "
                           "hypercorn closes its connections, which the SDK sees as a closed connection). The SDK "
                           "also retries it without surfacing it while attempts remain.",
}

# Methods the SDK calls on these objects that the interpreter finds on the type: counted as public API.
PROTOCOL = ("__aenter__", "__aexit__", "__aiter__", "__anext__", "__await__", "__getitem__")


def _walked_classes() -> list[type]:
    exported = [getattr(s2_sdk, name) for name in s2_sdk.__all__]
    # The error classes say they are from module "s2_sdk"; they are walked by ERRORS, not as client objects.
    clients = [obj for obj in exported if inspect.isclass(obj) and not issubclass(obj, BaseException)
               and obj.__module__ not in ("s2_sdk._types", "s2_sdk._exceptions")]
    return [*clients, s2_sdk.CommandRecord, s2_sdk.SequencedRecord]


def _public_api() -> Iterator[tuple[str, Any, str, Any]]:
    """(key, owner, attribute name, attribute as stored) for every public callable and property walked."""
    for cls in _walked_classes():
        for name in dir(cls):
            if name.startswith("_"):
                own = [k for k in cls.__mro__ if k.__module__.startswith("s2_sdk") and name in vars(k)]
                if name not in PROTOCOL or not own:
                    continue
            attr = inspect.getattr_static(cls, name)
            if isinstance(attr, (property, staticmethod)) or callable(attr):
                yield f"{cls.__name__}.{name}", cls, name, attr
    for name in s2_sdk.__all__:
        if inspect.isfunction(obj := getattr(s2_sdk, name)):
            yield f"s2_sdk.{name}", s2_sdk, name, obj


class Walk:
    """What a test called of the SDK and which SDK errors it provoked."""

    def __init__(self) -> None:
        self.called: set[str] = set()
        self.provoked: set[str] = set()

    @contextlib.contextmanager
    def raises(self, error: type[BaseException]) -> Iterator[Any]:
        with pytest.raises(error) as info:
            yield info
        self.provoked.update({error.__name__, type(info.value).__name__})

    def recording(self, key: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.called.add(key)
            return fn(*args, **kwargs)

        return recorded


@pytest.fixture(autouse=True)
def walk(request, monkeypatch):
    walked = Walk()
    for key, owner, name, attr in list(_public_api()):
        if isinstance(attr, property):
            new: Any = property(walked.recording(key, attr.fget))
        elif isinstance(attr, staticmethod):
            new = staticmethod(walked.recording(key, attr.__func__))
        else:
            new = walked.recording(key, attr)
        monkeypatch.setattr(owner, name, new)
    yield walked
    test = request.node.originalname
    uncalled = {key for key, name in WALK.items() if name == test} - walked.called
    assert not uncalled, f"{test} is mapped to walk {sorted(uncalled)} but did not call them"
    unprovoked = {key for key, name in ERRORS.items() if name == test} - walked.provoked
    assert not unprovoked, f"{test} is mapped to provoke {sorted(unprovoked)} but did not"


@pytest.fixture(scope="module")
def walk_server():
    # Periodic read-session heartbeats every 60 s instead of 5: a session then learns it has caught up within the
    # tests' deadlines only from the heartbeat S2 sends as soon as a session starts following the tail.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_S2_HEARTBEAT_S", "60")
        server = LocalS2().start()
    try:
        yield server
    finally:
        server.stop()


def client(server: LocalS2, token: str | None = None) -> s2_sdk.S2:
    # One attempt: a retry must not hide what the server answered.
    return s2_sdk.S2(token or server.access_token, endpoints=server.endpoints, retry=s2_sdk.Retry(max_attempts=1))


async def new_stream(s2: s2_sdk.S2, basin: str, name: str = "s") -> s2_sdk.S2Stream:
    await s2.create_basin(basin)
    await s2.basin(basin).create_stream(name)
    return s2.basin(basin).stream(name)


async def numbered(n: int, start: int = 0) -> AsyncIterator[Record]:
    for i in range(start, start + n):
        yield Record(body=f"r{i}".encode())


# ---------------------------------------------------------------- the map against the installed SDK
def test_the_walk_covers_the_sdks_public_api():
    """WALK names exactly the SDK's public API, ERRORS and NOT_PRODUCED exactly its error classes, and every test
    they name is in this module."""
    assert {key for key, *_ in _public_api()} == set(WALK)
    errors = {name for name, obj in vars(sdk_exceptions).items()
              if inspect.isclass(obj) and issubclass(obj, s2_sdk.S2Error)}
    assert errors == set(ERRORS) | set(NOT_PRODUCED) and not set(ERRORS) & set(NOT_PRODUCED)
    tests = {name for name, obj in globals().items() if name.startswith("test_") and inspect.isfunction(obj)}
    assert set(WALK.values()) | set(ERRORS.values()) <= tests


# ---------------------------------------------------------------- S2, S2Basin, S2Stream handles
def test_client_handles_and_lifecycle(walk, walk_server, basin_name):
    """S2 as an async context manager; basin and stream handles by method and by subscript reach the same
    resources; a closed client refuses requests with S2ClientError."""

    async def scenario():
        async with client(walk_server) as s2:
            await s2.create_basin(basin_name)
            basin = s2.basin(basin_name)
            assert basin.name == basin_name and s2[basin_name].name == basin_name
            await basin.create_stream("orders/eu")
            stream = basin.stream("orders/eu")
            assert stream.name == "orders/eu" and basin["orders/eu"].name == "orders/eu"
            await basin["orders/eu"].append(AppendInput(records=[Record(body=b"x")]))
            assert (await s2[basin_name]["orders/eu"].check_tail()).seq_num == 1
        with walk.raises(s2_sdk.S2ClientError) as after_exit:  # __aexit__ closed the client
            await s2.get_basin_config(basin_name)
        assert "closed" in str(after_exit.value)
        other = client(walk_server)
        assert (await other.get_basin_config(basin_name)).create_stream_on_append is False
        await other.close()
        with walk.raises(s2_sdk.S2ClientError):
            await other.get_basin_config(basin_name)

    run(scenario())


# ---------------------------------------------------------------- basins
def test_basin_operations(walk, walk_server, basin_name):
    """create_basin (with the server's one location, and an unknown one), get/reconfigure/ensure_basin, and
    delete_basin with and without ignore_not_found (S2ServerError 404 basin_not_found is what it ignores)."""
    other = f"{basin_name}-e"

    async def scenario():
        async with client(walk_server) as s2:
            info = await s2.create_basin(basin_name, config=BasinConfig(create_stream_on_append=True),
                                         location="local")
            assert (info.name, info.location, info.deleted_at) == (basin_name, "local", None)
            with walk.raises(s2_sdk.S2ServerError) as elsewhere:
                await s2.create_basin(other, location="aws:us-east-1")
            assert (elsewhere.value.status_code, elsewhere.value.code) == (422, "invalid")
            config = await s2.get_basin_config(basin_name)
            assert (config.create_stream_on_append, config.create_stream_on_read, config.stream_cipher) == \
                (True, False, None)
            config = await s2.reconfigure_basin(basin_name, config=BasinConfig(create_stream_on_read=True))
            assert (config.create_stream_on_append, config.create_stream_on_read) == (True, True)
            assert (await s2.ensure_basin(basin_name, config=config)).status == EnsureStatus.CONFIG_UNCHANGED
            updated = await s2.ensure_basin(basin_name, config=BasinConfig(create_stream_on_append=False))
            assert (updated.basin.name, updated.status) == (basin_name, EnsureStatus.CONFIG_UPDATED)
            created = await s2.ensure_basin(other, location="local")
            assert (created.basin.name, created.status) == (other, EnsureStatus.CREATED)
            await s2.delete_basin(other)
            with walk.raises(s2_sdk.S2ServerError) as gone:
                await s2.delete_basin(other)
            assert (gone.value.status_code, gone.value.code) == (404, "basin_not_found")
            await s2.delete_basin(other, ignore_not_found=True)
            assert [b.name async for b in s2.list_all_basins(prefix=other)] == []

    run(scenario())


def test_basin_listing(walk, walk_server, basin_name):
    """list_basins pages by prefix, start_after and limit; list_all_basins follows the pages, with and without
    include_deleted (a deleted basin is gone at once here: no deleted_at to include)."""
    names = [f"{basin_name}-{i}" for i in range(4)]

    async def scenario():
        async with client(walk_server) as s2:
            for name in names:
                await s2.create_basin(name)
            page = await s2.list_basins(prefix=basin_name, limit=3)
            assert [b.name for b in page.items] == names[:3] and page.has_more
            page = await s2.list_basins(prefix=basin_name, start_after=names[2], limit=3)
            assert [b.name for b in page.items] == names[3:] and not page.has_more
            assert [b.name async for b in s2.list_all_basins(prefix=basin_name)] == names
            assert [b.name async for b in s2.list_all_basins(prefix=basin_name, start_after=names[1])] == names[2:]
            await s2.delete_basin(names[0])
            listed = [b async for b in s2.list_all_basins(prefix=basin_name, include_deleted=True)]
            assert [b.name for b in listed] == names[1:] and {b.deleted_at for b in listed} == {None}

    run(scenario())


def test_locations(walk, walk_server):
    async def scenario():
        async with client(walk_server) as s2:
            assert [loc.name for loc in await s2.list_locations()] == ["local"]
            default = await s2.get_default_location()
            assert (default.name, default.default_storage_class) == ("local", "express")
            assert (await s2.set_default_location("local")).name == "local"

    run(scenario())


# ---------------------------------------------------------------- access tokens
def test_access_tokens(walk, walk_server, basin_name):
    """issue_access_token (scope, expiry, auto_prefix_streams), list_access_tokens pages, list_all_access_tokens
    (prefix, start_after), the tokens at work within and outside their scope, revoke_access_token."""
    prefix = f"walk-{uuid.uuid4().hex[:8]}-"
    ids = [f"{prefix}{i}" for i in range(3)]
    expires = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    scope = AccessTokenScope(basins=ExactMatch(basin_name), streams=PrefixMatch("team/"),
                             op_groups=OperationGroupPermissions(stream=Permission.READ_WRITE),
                             ops=[Operation.LIST_STREAMS])

    async def scenario():
        async with client(walk_server) as admin:
            await admin.create_basin(basin_name)
            await admin.basin(basin_name).create_stream("team/s")
            await admin.basin(basin_name).create_stream("other")
            secrets = [await admin.issue_access_token(token_id, scope=scope, expires_at=expires,
                                                      auto_prefix_streams=token_id == ids[0]) for token_id in ids]
            page = await admin.list_access_tokens(prefix=prefix, limit=2)
            assert [t.id for t in page.items] == ids[:2] and page.has_more
            page = await admin.list_access_tokens(prefix=prefix, start_after=ids[1])
            assert [t.id for t in page.items] == ids[2:] and not page.has_more
            listed = [t async for t in admin.list_all_access_tokens(prefix=prefix)]
            assert [t.id for t in listed] == ids
            assert [t.auto_prefix_streams for t in listed] == [True, False, False]
            assert [(t.scope.basins, t.scope.streams, t.expires_at) for t in listed] == \
                [(ExactMatch(basin_name), PrefixMatch("team/"), expires)] * 3
            assert [t.id async for t in admin.list_all_access_tokens(prefix=prefix, start_after=ids[0])] == ids[1:]
        async with client(walk_server, secrets[1]) as scoped:
            await scoped.basin(basin_name).stream("team/s").append(AppendInput(records=[Record(body=b"in")]))
            with walk.raises(s2_sdk.S2ServerError) as outside:
                await scoped.basin(basin_name).stream("other").append(AppendInput(records=[Record(body=b"out")]))
            assert (outside.value.status_code, outside.value.code) == (403, "permission_denied")
        async with client(walk_server, secrets[0]) as namespaced:  # auto_prefix_streams: "s" means "team/s"
            assert (await namespaced.basin(basin_name).stream("s").check_tail()).seq_num == 1
            assert [s.name for s in (await namespaced.basin(basin_name).list_streams()).items] == ["s"]
        async with client(walk_server) as admin:
            await admin.revoke_access_token(ids[1])
            assert [t.id async for t in admin.list_all_access_tokens(prefix=prefix)] == [ids[0], ids[2]]
            with walk.raises(s2_sdk.S2ServerError) as again:
                await admin.revoke_access_token(ids[1])
            assert (again.value.status_code, again.value.code) == (404, "access_token_not_found")

    run(scenario())


# ---------------------------------------------------------------- metrics
def test_metrics(walk, walk_server, basin_name):
    """Every metric set of account_metrics, basin_metrics and stream_metrics, at every interval, answers values the
    SDK parses as the set's kind; stored bytes are what s2_sdk.metered_bytes says the records weigh."""
    records = [Record(body=b"body", headers=[(b"name", b"value")]), Record(body=b"")]

    async def scenario():
        async with client(walk_server) as s2:
            await (await new_stream(s2, basin_name)).append(AppendInput(records=records))
            for interval in TimeseriesInterval:
                for account_set in AccountMetricSet:
                    values = await s2.account_metrics(set=account_set, interval=interval)
                    kind = Label if account_set == AccountMetricSet.ACTIVE_BASINS else Accumulation
                    assert [(type(v), v.name) for v in values] == [(kind, account_set.value)], values
                    if kind is Label:
                        assert basin_name in values[0].values
                for basin_set in BasinMetricSet:
                    values = await s2.basin_metrics(basin_name, set=basin_set, interval=interval)
                    kind = Gauge if basin_set == BasinMetricSet.STORAGE else Accumulation
                    assert [(type(v), v.name) for v in values] == [(kind, basin_set.value)], values
                for stream_set in StreamMetricSet:
                    values = await s2.stream_metrics(basin_name, "s", set=stream_set, interval=interval)
                    assert [(type(v), v.name) for v in values] == [(Gauge, stream_set.value)], values
            for stored in (await s2.basin_metrics(basin_name, set=BasinMetricSet.STORAGE),
                           await s2.stream_metrics(basin_name, "s", set=StreamMetricSet.STORAGE)):
                assert [value for _, value in stored[0].values] == [s2_sdk.metered_bytes(records)]

    run(scenario())


# ---------------------------------------------------------------- streams
def test_stream_operations(walk, walk_server, basin_name):
    """create/ensure/get/reconfigure/delete_stream (delete with and without ignore_not_found), list_streams pages
    and list_all_streams."""

    async def scenario():
        async with client(walk_server) as s2:
            await s2.create_basin(basin_name)
            basin = s2.basin(basin_name)
            info = await basin.create_stream("a", config=StreamConfig(storage_class="standard"))
            assert (info.name, info.deleted_at, info.cipher) == ("a", None, None)
            ensured = await basin.ensure_stream("b")
            assert (ensured.stream.name, ensured.status) == ("b", EnsureStatus.CREATED)
            assert (await basin.ensure_stream("b")).status == EnsureStatus.CONFIG_UNCHANGED
            assert (await basin.ensure_stream("b", config=StreamConfig(retention_policy=60))).status == \
                EnsureStatus.CONFIG_UPDATED
            assert (await basin.get_stream_config("a")).storage_class == "standard"
            assert (await basin.get_stream_config("b")).retention_policy == 60
            reconfigured = await basin.reconfigure_stream("a", config=StreamConfig(retention_policy="infinite"))
            assert (reconfigured.storage_class, reconfigured.retention_policy) == ("standard", "infinite")
            await basin.create_stream("c")
            page = await basin.list_streams(limit=2)
            assert [s.name for s in page.items] == ["a", "b"] and page.has_more
            page = await basin.list_streams(start_after="b")
            assert [s.name for s in page.items] == ["c"] and not page.has_more
            assert [s.name async for s in basin.list_all_streams(prefix="b")] == ["b"]
            await basin.delete_stream("c")
            with walk.raises(s2_sdk.S2ServerError) as gone:
                await basin.delete_stream("c")
            assert (gone.value.status_code, gone.value.code) == (404, "stream_not_found")
            await basin.delete_stream("c", ignore_not_found=True)
            listed = [s async for s in basin.list_all_streams(include_deleted=True)]
            assert [s.name for s in listed] == ["a", "b"] and {s.deleted_at for s in listed} == {None}

    run(scenario())


# ---------------------------------------------------------------- records: unary, sessions, producer
def test_unary_append_read_and_tail(walk, walk_server, basin_name):
    """append, check_tail, read (by seq num, tail offset, metered bytes, long-poll wait), and the command records
    fence and trim as S2 applies them."""
    first = [Record(body=b"r0", headers=[(b"h", b"v")]), Record(body=b"r1"), Record(body=b"r2")]

    async def scenario():
        async with client(walk_server) as s2:
            stream = await new_stream(s2, basin_name)
            ack = await stream.append(AppendInput(records=first))
            assert (ack.start.seq_num, ack.end.seq_num, ack.tail.seq_num) == (0, 3, 3)
            assert await stream.check_tail() == ack.tail
            # The server meters a record as the SDK does: a byte limit of the first two records' weight reads two.
            two = await stream.read(start=SeqNum(0), limit=ReadLimit(bytes=s2_sdk.metered_bytes(first[:2])))
            assert [(r.body, r.headers) for r in two.records] == [(b"r0", [(b"h", b"v")]), (b"r1", [])]
            assert [r.body for r in (await stream.read(start=TailOffset(1))).records] == [b"r2"]
            await stream.append(AppendInput(records=[CommandRecord.fence("f-1")]))
            await stream.append(AppendInput(records=[CommandRecord.trim(1)], fencing_token="f-1"))
            batch = await stream.read(start=SeqNum(0))
            assert [(r.seq_num, r.is_command_record()) for r in batch.records] == \
                [(1, False), (2, False), (3, True), (4, True)]
            plain = await stream.read(start=SeqNum(0), ignore_command_records=True)
            assert [r.body for r in plain.records] == [b"r1", b"r2"]
            # A long poll: answered by the record appended while it waits (or at once, if the append came first).
            waiting = asyncio.create_task(stream.read(start=SeqNum(5), wait=30))
            await stream.append(AppendInput(records=[Record(body=b"r5")], fencing_token="f-1"))
            assert [r.body for r in (await waiting).records] == [b"r5"]

    run(scenario())


def test_append_session(walk, walk_server, basin_name):
    """append_session pipelines AppendInputs in order (built with s2_sdk.append_inputs / append_record_batches);
    each ticket resolves to its batch's ack; a closed session refuses more with S2ClientError."""

    async def scenario():
        async with client(walk_server) as s2:
            stream = await new_stream(s2, basin_name)
            by_two = Batching(max_records=2, linger=timedelta(0))  # no linger: batches cut by count alone
            batches = [batch async for batch in s2_sdk.append_record_batches(numbered(5), batching=by_two)]
            assert [[r.body for r in batch] for batch in batches] == [[b"r0", b"r1"], [b"r2", b"r3"], [b"r4"]]
            async with stream.append_session(max_unacked_batches=2) as session:
                tickets = [await session.submit(inp) async for inp in s2_sdk.append_inputs(
                    numbered(5), match_seq_num=0, batching=by_two)]
                acks = [await ticket for ticket in tickets]
            assert [(a.start.seq_num, a.end.seq_num) for a in acks] == [(0, 2), (2, 4), (4, 5)]
            with walk.raises(s2_sdk.S2ClientError):
                await session.submit(AppendInput(records=[Record(body=b"late")]))
            explicit = stream.append_session()
            ticket = await explicit.submit(AppendInput(records=[Record(body=b"r5")]))
            await explicit.close()
            assert (await ticket).end.seq_num == 6
            assert [r.body for r in (await stream.read(start=SeqNum(0))).records] == [f"r{i}".encode()
                                                                                     for i in range(6)]

    run(scenario())


def test_producer(walk, walk_server, basin_name):
    """producer batches single records (Batching) under a fencing token and match_seq_num; each ticket resolves to
    the record's own seq num and its batch's ack once flushed; a closed producer refuses records."""

    async def scenario():
        async with client(walk_server) as s2:
            stream = await new_stream(s2, basin_name)
            await stream.append(AppendInput(records=[CommandRecord.fence("p-1")]))
            async with stream.producer(fencing_token="p-1", match_seq_num=1,
                                       batching=Batching(max_records=2, linger=timedelta(0))) as producer:
                tickets = [await producer.submit(record) async for record in numbered(5)]
                await producer.flush()
                acks = [await ticket for ticket in tickets]
            assert [a.seq_num for a in acks] == [1, 2, 3, 4, 5]
            assert [(a.batch.start.seq_num, a.batch.end.seq_num) for a in acks] == \
                [(1, 3), (1, 3), (3, 5), (3, 5), (5, 6)]
            with walk.raises(s2_sdk.S2ClientError):
                await producer.submit(Record(body=b"late"))
            explicit = stream.producer()
            ticket = await explicit.submit(Record(body=b"r5"))
            await explicit.close()
            assert (await ticket).seq_num == 6
            records = (await stream.read(start=SeqNum(1))).records
            assert [r.body for r in records] == [f"r{i}".encode() for i in range(6)]

    run(scenario())


def test_read_session_and_caught_up(walk, walk_server, basin_name):
    """A read session delivers what is stored, then follows the tail; caught_up() resolves to the tail once the
    session has delivered everything before it, is_caught_up() says so; caught_up() of a session closed before
    it caught up fails."""

    async def scenario():
        async with client(walk_server) as s2:
            stream = await new_stream(s2, basin_name)
            await stream.append(AppendInput(records=[Record(body=b"r0"), Record(body=b"r1"), Record(body=b"r2")]))
            async with stream.read_session(start=SeqNum(0)) as session:
                reached = session.caught_up()
                assert not session.is_caught_up()
                got = []
                async for batch in session:
                    got += [r.body for r in batch.records]
                    if len(got) == 3:
                        break
                assert got == [b"r0", b"r1", b"r2"]
                assert (await reached).seq_num == 3 and session.is_caught_up()
                await stream.append(AppendInput(records=[Record(body=b"r3")]))
                assert [r.body for r in (await session.__anext__()).records] == [b"r3"]
                assert (await session.caught_up()).seq_num == 4 and session.is_caught_up()
            assert (await session.caught_up()).seq_num == 4  # closed once caught up: the last tail it saw
            unread = stream.read_session(start=SeqNum(0))
            await unread.close()
            with walk.raises(s2_sdk.S2ClientError):  # closed before it caught up
                await unread.caught_up()
            # A session at the tail of a stream with nothing new: S2 sends the tail as soon as the session starts
            # following it ("A heartbeat will be sent whenever a switch to following in real-time happens",
            # s2.proto ReadBatch), so caught_up() resolves at once, not at the first periodic heartbeat (60 s here).
            at_tail = stream.read_session(start=TailOffset(0))
            try:
                assert (await asyncio.wait_for(at_tail.caught_up(), 20)).seq_num == 4
                assert at_tail.is_caught_up()
            finally:
                await at_tail.close()

    run(scenario())


# ---------------------------------------------------------------- errors
def test_server_errors_carry_s2s_status_and_code(walk, walk_server, basin_name):
    """Server errors reach the caller as S2ServerError (an S2Error) with S2's status and code (openapi.json's
    ErrorInfo): 404 basin/stream not found, 409 already exists, 422 invalid, 400 bad_query, 403, 401."""

    async def scenario():
        async with client(walk_server) as s2:
            stream = await new_stream(s2, basin_name)
            expected = [
                (s2.get_basin_config(f"{basin_name}-none"), 404, "basin_not_found"),
                (s2.basin(basin_name).get_stream_config("none"), 404, "stream_not_found"),
                (s2.create_basin(basin_name), 409, "resource_already_exists"),
                (s2.basin(basin_name).create_stream("s"), 409, "resource_already_exists"),
                (s2.basin(basin_name).reconfigure_stream("s", config=StreamConfig(retention_policy=0)), 422,
                 "invalid"),
                (stream.append(AppendInput(records=[Record(body=b"x")], fencing_token="x" * 37)), 422, "invalid"),
                (s2.basin_metrics(basin_name, set=BasinMetricSet.STORAGE, start=2, end=1), 400, "bad_query"),
            ]
            for call, status, code in expected:
                with walk.raises(s2_sdk.S2ServerError) as error:
                    await call
                assert (error.value.status_code, error.value.code) == (status, code), error.value
                assert isinstance(error.value, s2_sdk.S2Error) and error.value.message
            past = datetime.now(UTC) - timedelta(seconds=1)
            expired = await s2.issue_access_token(f"walk-expired-{uuid.uuid4().hex[:8]}", expires_at=past,
                                                  scope=AccessTokenScope(ops=[Operation.LIST_BASINS]))
            denied = await s2.issue_access_token(f"walk-denied-{uuid.uuid4().hex[:8]}",
                                                 scope=AccessTokenScope(ops=[Operation.LIST_BASINS]))
        for token, status, code in ((expired, 401, "unauthorized"), (denied, 403, "permission_denied")):
            async with client(walk_server, token) as s2:
                with walk.raises(s2_sdk.S2Error) as error:
                    await s2.get_basin_config(basin_name)
                assert isinstance(error.value, s2_sdk.S2ServerError)
                assert (error.value.status_code, error.value.code) == (status, code)

    run(scenario())


def test_append_conditions(walk, walk_server, basin_name):
    """A failed match_seq_num or fencing token is AppendConditionError (SeqNumMismatchError /
    FencingTokenMismatchError, with what the stream expected) from append, an append session and a producer; on
    the wire it is 412 with one of openapi.json's AppendConditionFailed bodies, and nothing is appended."""

    async def scenario():
        async with client(walk_server) as s2:
            stream = await new_stream(s2, basin_name)
            await stream.append(AppendInput(records=[CommandRecord.fence("t-1"), Record(body=b"r1")]))
            with walk.raises(s2_sdk.AppendConditionError) as seq:
                await stream.append(AppendInput(records=[Record(body=b"x")], match_seq_num=7))
            assert isinstance(seq.value, s2_sdk.SeqNumMismatchError) and seq.value.status_code == 412
            assert seq.value.expected_seq_num == 2
            with walk.raises(s2_sdk.AppendConditionError) as fence:
                await stream.append(AppendInput(records=[Record(body=b"x")], fencing_token="t-2"))
            assert isinstance(fence.value, s2_sdk.FencingTokenMismatchError) and fence.value.status_code == 412
            assert fence.value.expected_fencing_token == "t-1"
            session = stream.append_session()
            ticket = await session.submit(AppendInput(records=[Record(body=b"x")], match_seq_num=0))
            with walk.raises(s2_sdk.SeqNumMismatchError) as in_session:
                await ticket
            assert in_session.value.expected_seq_num == 2
            with walk.raises(s2_sdk.SeqNumMismatchError):
                await session.close()
            producer = stream.producer(fencing_token="wrong")
            ticket = await producer.submit(Record(body=b"x"))
            with walk.raises(s2_sdk.FencingTokenMismatchError) as from_producer:
                await ticket
            assert from_producer.value.expected_fencing_token == "t-1"
            with walk.raises(s2_sdk.FencingTokenMismatchError):
                await producer.close()
            assert (await stream.check_tail()).seq_num == 2

    run(scenario())
    headers = {"s2-basin": basin_name, "content-type": "application/json"}
    for condition, body in (({"match_seq_num": 0}, {"seq_num_mismatch": 2}),
                            ({"fencing_token": "t-2"}, {"fencing_token_mismatch": "t-1"})):
        request = json.dumps({"records": [{"body": "x"}], **condition}).encode()
        status, _, answer = h2_request(walk_server.port, "POST", "/v1/streams/s/records", headers, request)
        assert (status, json.loads(answer)) == (412, body)


def test_read_past_the_tail(walk, walk_server, basin_name):
    """A read from beyond the tail is ReadUnwrittenError with the tail (416), unary and in a session, unless
    clamped (clamp_to_tail)."""

    async def scenario():
        async with client(walk_server) as s2:
            stream = await new_stream(s2, basin_name)
            await stream.append(AppendInput(records=[Record(body=b"r0")]))
            with walk.raises(s2_sdk.ReadUnwrittenError) as unary:
                await stream.read(start=SeqNum(5))
            assert (unary.value.status_code, unary.value.tail.seq_num) == (416, 1)
            with walk.raises(s2_sdk.ReadUnwrittenError) as in_session:
                async with stream.read_session(start=SeqNum(5)) as session:
                    await session.__anext__()
            assert in_session.value.tail.seq_num == 1
            # Clamped, the session starts at the tail and follows it: caught up at once, with the tail.
            clamped = stream.read_session(start=SeqNum(5), clamp_to_tail=True)
            try:
                assert (await asyncio.wait_for(clamped.caught_up(), 20)).seq_num == 1
            finally:
                await clamped.close()

    run(scenario())


def _unread_bytes(port: int) -> int:
    """Bytes the kernel holds for the server's sockets on `port` that the server has not read (/proc/net/tcp*)."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    total += int(fields[4].split(":")[1], 16)
    return total


def test_append_indefinite_failure(walk):
    """AppendIndefiniteFailureError: an append whose attempt may have taken effect (its request was sent, then the
    connection was lost) and whose retry failed without side effects (the server refuses connections). Produced by
    freezing the server (SIGSTOP), sending the append, then killing the server (SIGKILL, as a crash would)."""
    server = LocalS2().start()
    body = b"b" * 16384  # much larger than any HTTP/2 control frame the client may still send after SIGSTOP

    async def scenario():
        retry = s2_sdk.Retry(max_attempts=2, min_base_delay=timedelta(milliseconds=10))
        async with s2_sdk.S2(server.access_token, endpoints=server.endpoints, retry=retry) as s2:
            stream = await new_stream(s2, "indefinite-basin")
            await stream.append(AppendInput(records=[Record(body=b"first")]))
            os.kill(server.process.pid, signal.SIGSTOP)
            before = _unread_bytes(server.port)
            append = asyncio.create_task(stream.append(AppendInput(records=[Record(body=body)])))
            # The kernel does not tell when a frozen peer's socket buffer fills: poll it, with a deadline.
            deadline = time.monotonic() + 30
            while _unread_bytes(server.port) < before + len(body):
                assert not append.done(), append
                assert time.monotonic() < deadline, "the append never reached the server's socket"
                await asyncio.sleep(0.01)
            server.kill()
            with walk.raises(sdk_exceptions.AppendIndefiniteFailureError) as indefinite:
                await append
            # The final attempt could not connect: that attempt had no effect, the first one may have had.
            assert isinstance(indefinite.value.final_attempt_error, sdk_exceptions.ConnectError)

    try:
        run(scenario())
    finally:
        server.kill()
