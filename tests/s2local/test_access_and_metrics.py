"""Access tokens (issue, list, revoke, scopes, expiry) and metrics, through the official s2-sdk."""

import json
from datetime import UTC, datetime, timedelta

import pytest
import s2_sdk
from s2_sdk import (
    AccessTokenScope,
    AppendInput,
    BasinMetricSet,
    CommandRecord,
    ExactMatch,
    OperationGroupPermissions,
    Permission,
    PrefixMatch,
    Record,
    SeqNum,
    StreamMetricSet,
)

from sluice.s2local import LocalS2
from tests.s2local.conftest import run
from tests.s2local.raw import h2_request

ADMIN = "admin-token-for-tests"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    with LocalS2(tmp_path_factory.mktemp("s2-secured"), token=ADMIN) as server:
        yield server


def client(server, token):
    return s2_sdk.S2(token, endpoints=server.endpoints, retry=s2_sdk.Retry(max_attempts=1))


async def denied(call, status=403):
    with pytest.raises(s2_sdk.S2ServerError) as error:
        await call
    assert error.value.status_code == status, error.value
    return str(error.value)


def test_a_scoped_token_gets_what_its_scope_allows_and_403_for_the_rest(secured):
    async def scenario():
        async with client(secured, ADMIN) as admin:
            for basin in ("team-a-basin", "team-b-basin"):
                await admin.create_basin(basin)
                await admin.basin(basin).create_stream("s")
                await admin.basin(basin).stream("s").append(AppendInput(records=[Record(body=b"x")]))
            reader = await admin.issue_access_token(
                "reader/team-a", scope=AccessTokenScope(
                    basins=PrefixMatch("team-a-"), streams=ExactMatch("s"),
                    op_groups=OperationGroupPermissions(stream=Permission.READ)))
            listed = {t.id: t for t in (await admin.list_access_tokens()).items}
            assert listed["reader/team-a"].scope.basins == PrefixMatch("team-a-")
        async with client(secured, reader) as s2:
            stream = s2.basin("team-a-basin").stream("s")
            assert [r.body for r in (await stream.read(start=SeqNum(0))).records] == [b"x"]
            assert (await stream.check_tail()).seq_num == 1
            message = await denied(stream.append(AppendInput(records=[Record(body=b"y")])))
            assert "'append'" in message and "reader/team-a" in message
            assert "basin 'team-b-basin'" in await denied(s2.basin("team-b-basin").stream("s").read(start=SeqNum(0)))
            await denied(s2.basin("team-a-basin").stream("other").check_tail())  # stream outside the scope
            await denied(s2.create_basin("team-a-new"))
            await denied(s2.list_basins())
            await denied(s2.issue_access_token("escalate", scope=AccessTokenScope(
                op_groups=OperationGroupPermissions(account=Permission.READ_WRITE))))
        async with client(secured, ADMIN) as admin:
            assert (await admin.basin("team-a-basin").stream("s").check_tail()).seq_num == 1  # nothing appended

    run(scenario())


def test_trim_and_fence_need_their_own_operations(secured):
    async def scenario():
        async with client(secured, ADMIN) as admin:
            await admin.create_basin("cmd-basin-1")
            await admin.basin("cmd-basin-1").create_stream("s")
            writer = await admin.issue_access_token("writer", scope=AccessTokenScope(ops=[
                s2_sdk.Operation.APPEND, s2_sdk.Operation.READ]))
        async with client(secured, writer) as s2:
            stream = s2.basin("cmd-basin-1").stream("s")
            await stream.append(AppendInput(records=[Record(body=b"ok")]))
            assert "'trim'" in await denied(stream.append(AppendInput(records=[CommandRecord.trim(1)])))
            assert "'fence'" in await denied(stream.append(AppendInput(records=[CommandRecord.fence("t")])))

    run(scenario())


def test_expired_and_revoked_tokens_are_refused(secured):
    async def scenario():
        async with client(secured, ADMIN) as admin:
            scope = AccessTokenScope(op_groups=OperationGroupPermissions(account=Permission.READ))
            past = await admin.issue_access_token("expired", scope=scope,
                                                  expires_at=datetime.now(UTC) - timedelta(seconds=1))
            live = await admin.issue_access_token("revoked", scope=scope)
            async with client(secured, live) as s2:
                await s2.list_basins()
                await admin.revoke_access_token("revoked")
                await denied(s2.list_basins(), 401)
            async with client(secured, past) as s2:
                assert "expired" in await denied(s2.list_basins(), 401)
            assert "revoked" not in {t.id for t in (await admin.list_access_tokens()).items}
            # A token issues tokens that expire no later than itself.
            soon = datetime.now(UTC) + timedelta(hours=1)
            issuer = await admin.issue_access_token("issuer", expires_at=soon, scope=AccessTokenScope(
                op_groups=OperationGroupPermissions(account=Permission.READ_WRITE)))
            async with client(secured, issuer) as s2:
                await s2.issue_access_token("child", scope=scope)
                later = soon + timedelta(days=1)
                assert "expiry" in await denied(s2.issue_access_token("greedy", scope=scope, expires_at=later), 422)
            child = {t.id: t for t in (await admin.list_access_tokens()).items}["child"]
            assert child.expires_at is not None and abs((child.expires_at - soon).total_seconds()) < 1

    run(scenario())


def test_tokens_survive_a_restart_and_are_not_stored_in_the_clear(tmp_path):
    data = tmp_path / "s2"
    with LocalS2(data, token=ADMIN) as server:
        async def issue():
            async with client(server, ADMIN) as admin:
                return await admin.issue_access_token("durable", scope=AccessTokenScope(
                    op_groups=OperationGroupPermissions(account=Permission.READ)))
        secret = run(issue())
    assert not any(secret.encode() in f.read_bytes() for f in data.iterdir() if f.is_file())
    with LocalS2(data, token=ADMIN) as server:
        async def use():
            async with client(server, secret) as s2:
                await s2.list_basins()
        run(use())


def test_metrics_report_what_was_appended_read_and_stored(secured):
    async def scenario():
        async with client(secured, ADMIN) as admin:
            await admin.create_basin("metrics-basin")
            basin = admin.basin("metrics-basin")
            await basin.create_stream("m")
            stream = basin.stream("m")
            records = [Record(body=b"x" * 10) for _ in range(5)]  # 18 metered bytes each
            await stream.append(AppendInput(records=records))
            await stream.append(AppendInput(records=records))
            await stream.read(start=SeqNum(0))
            (storage,) = await admin.stream_metrics("metrics-basin", "m", set=StreamMetricSet.STORAGE)
            assert storage.values[-1][1] == 10 * 18
            (appends,) = await admin.basin_metrics("metrics-basin", set=BasinMetricSet.APPEND_OPS)
            assert appends.values[-1][1] == 2
            (appended,) = await admin.basin_metrics("metrics-basin", set=BasinMetricSet.APPEND_THROUGHPUT)
            assert appended.values[-1][1] == 10 * 18 and appended.unit == s2_sdk.MetricUnit.BYTES
            (reads,) = await admin.basin_metrics("metrics-basin", set=BasinMetricSet.READ_OPS)
            assert reads.values[-1][1] == 1
            (active,) = await admin.account_metrics(set=s2_sdk.AccountMetricSet.ACTIVE_BASINS)
            assert "metrics-basin" in active.values
            no_metrics = await admin.issue_access_token("no-metrics", scope=AccessTokenScope(
                op_groups=OperationGroupPermissions(stream=Permission.WRITE)))
        async with client(secured, no_metrics) as s2:
            await denied(s2.stream_metrics("metrics-basin", "m", set=StreamMetricSet.STORAGE))

    run(scenario())


# ---------------------------------------------------------------- AccessTokenInfo.auto_prefix_streams
# openapi.json AccessTokenInfo.auto_prefix_streams: "Namespace streams based on the configured stream-level scope,
# which must be a prefix. Stream name arguments will be automatically prefixed, and the prefix will be stripped when
# listing streams."
STREAM_RW = OperationGroupPermissions(basin=Permission.READ_WRITE, stream=Permission.READ_WRITE)


async def _namespaced(admin, token_id, namespace="tenant-a/", **scope):
    return await admin.issue_access_token(token_id, auto_prefix_streams=True, scope=AccessTokenScope(
        streams=PrefixMatch(namespace), **{"op_groups": STREAM_RW, **scope}))


def test_issue_access_token_auto_prefix_streams_needs_a_stream_prefix_scope(secured):
    """S2 refuses auto_prefix_streams without a `prefix` stream scope with 422 invalid, this message
    (s2-sdk-rust tests/account_ops.rs, issue_access_token_with_auto_prefix_streams_but_without_prefix_errors)."""

    async def scenario():
        async with client(secured, ADMIN) as admin:
            for streams in (None, ExactMatch("tenant-a/s")):
                message = await denied(admin.issue_access_token(
                    "bad-prefix", auto_prefix_streams=True,
                    scope=AccessTokenScope(streams=streams, op_groups=STREAM_RW)), 422)
                assert "Auto prefixing is only allowed for streams with prefix matching" in message
            assert await _namespaced(admin, "good-prefix")
            assert "bad-prefix" not in {t.id for t in (await admin.list_access_tokens()).items}

    run(scenario())
    body = json.dumps({"id": "not-a-bool", "auto_prefix_streams": "yes", "scope": {
        "streams": {"prefix": "p/"}, "op_groups": {"stream": {"read": True}}}}).encode()
    status, _, data = h2_request(secured.port, "POST", "/v1/access-tokens",
                                 {"content-type": "application/json", "authorization": f"Bearer {ADMIN}"}, body)
    assert status == 422 and json.loads(data)["code"] == "invalid"


def test_auto_prefix_streams_prefixes_every_stream_name_argument(secured):
    """Create (body), ensure, get/reconfigure config, append, read, sessions, tail, metrics, delete: the token's
    names are in its namespace; the streams it gets back (StreamInfo) are named without it."""

    async def scenario():
        async with client(secured, ADMIN) as admin:
            await admin.create_basin("prefix-args-basin")
            await admin.basin("prefix-args-basin").create_stream("orders")  # outside the namespace
            token = await _namespaced(admin, "ns-args", ops=[s2_sdk.Operation.STREAM_METRICS])
        async with client(secured, token) as s2:
            basin = s2.basin("prefix-args-basin")
            assert (await basin.create_stream("orders")).name == "orders"
            assert (await basin.ensure_stream("ensured")).status == s2_sdk.EnsureStatus.CREATED
            await basin.reconfigure_stream("orders", config=s2_sdk.StreamConfig(retention_policy=3600))
            assert (await basin.get_stream_config("orders")).retention_policy == 3600
            stream = basin.stream("orders")
            await stream.append(AppendInput(records=[Record(body=b"unary")]))
            async with stream.append_session() as session:
                await (await session.submit(AppendInput(records=[Record(body=b"session")])))
            assert (await stream.check_tail()).seq_num == 2
            assert [r.body for r in (await stream.read(start=SeqNum(0))).records] == [b"unary", b"session"]
            read = [r.body async for batch in stream.read_session(start=SeqNum(0), limit=s2_sdk.ReadLimit(count=2))
                    for r in batch.records]
            assert read == [b"unary", b"session"]
            (storage,) = await s2.stream_metrics("prefix-args-basin", "orders", set=StreamMetricSet.STORAGE)
            assert storage.values[-1][1] > 0
            await basin.delete_stream("ensured")
        async with client(secured, ADMIN) as admin:
            basin = admin.basin("prefix-args-basin")
            assert [s.name for s in (await basin.list_streams()).items] == ["orders", "tenant-a/orders"]
            assert (await basin.stream("orders").check_tail()).seq_num == 0  # the token never wrote here
            assert [r.body for r in (await basin.stream("tenant-a/orders").read(start=SeqNum(0))).records] == \
                [b"unary", b"session"]
            assert (await basin.get_stream_config("tenant-a/orders")).retention_policy == 3600

    run(scenario())


def test_auto_prefix_streams_list_streams_is_relative_to_the_namespace(secured):
    """list_streams: names come back without the namespace; `prefix` and `start_after` are relative to it."""

    async def scenario():
        async with client(secured, ADMIN) as admin:
            await admin.create_basin("prefix-list-basin")
            basin = admin.basin("prefix-list-basin")
            for name in ("a", "tenant-a", "tenant-a/x/1", "tenant-a/x/2", "tenant-a/y", "tenant-b/x/1"):
                await basin.create_stream(name)
            token = await _namespaced(admin, "ns-list")
        async with client(secured, token) as s2:
            basin = s2.basin("prefix-list-basin")
            assert [s.name for s in (await basin.list_streams()).items] == ["x/1", "x/2", "y"]
            assert [s.name for s in (await basin.list_streams(prefix="x/")).items] == ["x/1", "x/2"]
            assert [s.name for s in (await basin.list_streams(start_after="x/1")).items] == ["x/2", "y"]
            page = await basin.list_streams(prefix="x/", start_after="x/1", limit=1)
            assert [s.name for s in page.items] == ["x/2"] and not page.has_more

    run(scenario())


def test_list_access_tokens_reports_auto_prefix_streams(secured):
    """AccessTokenInfo.auto_prefix_streams comes back as issued (the admin sees the scope as stored); a namespaced
    token that issues tokens names streams in its namespace, and a token it issues without a stream scope gets
    the namespace, not every stream; it is shown stream scopes relative to its namespace."""

    async def scenario():
        async with client(secured, ADMIN) as admin:
            issuer = await _namespaced(admin, "ns-issuer", namespace="team-x/",
                                       access_tokens=PrefixMatch("ns-"),
                                       op_groups=OperationGroupPermissions(account=Permission.READ_WRITE))
        async with client(secured, issuer) as s2:
            await s2.issue_access_token("ns-child", auto_prefix_streams=True, scope=AccessTokenScope(
                streams=PrefixMatch("sub/"), op_groups=STREAM_RW))
            await s2.issue_access_token("ns-whole", scope=AccessTokenScope(op_groups=STREAM_RW))
            seen = {t.id: t for t in (await s2.list_access_tokens(prefix="ns-")).items}
            assert seen["ns-child"].scope.streams == PrefixMatch("sub/") and seen["ns-child"].auto_prefix_streams
            assert seen["ns-whole"].scope.streams == PrefixMatch("")
            assert seen["ns-issuer"].scope.streams == PrefixMatch("")
        async with client(secured, ADMIN) as admin:
            listed = {t.id: t for t in (await admin.list_access_tokens(prefix="ns-")).items}
            assert listed["ns-issuer"].auto_prefix_streams and listed["ns-child"].auto_prefix_streams
            assert not listed["ns-whole"].auto_prefix_streams
            assert listed["ns-issuer"].scope.streams == PrefixMatch("team-x/")
            assert listed["ns-child"].scope.streams == PrefixMatch("team-x/sub/")
            assert listed["ns-whole"].scope.streams == PrefixMatch("team-x/")

    run(scenario())


def test_auto_prefix_streams_survives_a_restart(tmp_path):
    data = tmp_path / "s2"
    with LocalS2(data, token=ADMIN) as server:
        async def issue():
            async with client(server, ADMIN) as admin:
                await admin.create_basin("prefix-restart")
                return await _namespaced(admin, "ns-durable")
        secret = run(issue())
    with LocalS2(data, token=ADMIN) as server:
        async def use():
            async with client(server, secret) as s2:
                await s2.basin("prefix-restart").create_stream("s")
            async with client(server, ADMIN) as admin:
                assert [s.name for s in (await admin.basin("prefix-restart").list_streams()).items] == ["tenant-a/s"]
                (info,) = (await admin.list_access_tokens(prefix="ns-durable")).items
                assert info.auto_prefix_streams
        run(use())
