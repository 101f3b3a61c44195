"""Access tokens (issue, list, revoke, scopes, expiry) and metrics, through the official s2-sdk."""

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
