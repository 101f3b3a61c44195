"""Basins and streams through the official s2-sdk, and raw requests for idempotency and name rules."""

import asyncio
import json

import pytest
import s2_sdk
from s2_sdk import BasinConfig, EnsureStatus, StreamConfig, Timestamping, TimestampingMode

from tests.s2local.conftest import client_for, run
from tests.s2local.raw import h2_request


def test_basin_lifecycle(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            info = await s2.create_basin(basin_name)
            assert info.name == basin_name and info.created_at is not None
            with pytest.raises(s2_sdk.S2ServerError) as exists:
                await s2.create_basin(basin_name)
            assert exists.value.status_code == 409 and exists.value.code == "resource_already_exists"
            ensured = await s2.ensure_basin(basin_name)
            assert ensured.status == EnsureStatus.CONFIG_UNCHANGED
            cfg = BasinConfig(create_stream_on_append=True)
            assert (await s2.ensure_basin(basin_name, config=cfg)).status == EnsureStatus.CONFIG_UPDATED
            assert (await s2.get_basin_config(basin_name)).create_stream_on_append is True
            new = await s2.reconfigure_basin(basin_name, config=BasinConfig(create_stream_on_read=True))
            assert new.create_stream_on_read is True and new.create_stream_on_append is True
            await s2.delete_basin(basin_name)
            with pytest.raises(s2_sdk.S2ServerError) as gone:
                await s2.get_basin_config(basin_name)
            assert gone.value.status_code == 404 and gone.value.code == "basin_not_found"
            created = await s2.ensure_basin(basin_name)
            assert created.status == EnsureStatus.CREATED
            await s2.delete_basin(basin_name)

    run(scenario())


def test_basin_listing_paginates(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            names = [f"{basin_name}-{i}" for i in range(5)]
            for name in names:
                await s2.create_basin(name)
            page = await s2.list_basins(prefix=basin_name, limit=2)
            assert [b.name for b in page.items] == names[:2] and page.has_more
            page = await s2.list_basins(prefix=basin_name, start_after=names[3], limit=2)
            assert [b.name for b in page.items] == names[4:] and not page.has_more
            assert [b.name async for b in s2.list_all_basins(prefix=basin_name)] == names
            for name in names:
                await s2.delete_basin(name)

    run(scenario())


def test_stream_lifecycle_and_listing(s2_server, basin_name):
    async def scenario():
        async with client_for(s2_server) as s2:
            await s2.create_basin(basin_name)
            basin = s2.basin(basin_name)
            cfg = StreamConfig(timestamping=Timestamping(mode=TimestampingMode.ARRIVAL))
            info = await basin.create_stream("orders/eu", config=cfg)
            assert info.name == "orders/eu"
            with pytest.raises(s2_sdk.S2ServerError) as exists:
                await basin.create_stream("orders/eu")
            assert exists.value.code == "resource_already_exists"
            got = await basin.get_stream_config("orders/eu")
            assert got.timestamping.mode == TimestampingMode.ARRIVAL
            assert (await basin.ensure_stream("orders/eu")).status == EnsureStatus.CONFIG_UNCHANGED
            assert (await basin.ensure_stream("orders/us")).status == EnsureStatus.CREATED
            updated = await basin.ensure_stream("orders/us", config=StreamConfig(retention_policy=3600))
            assert updated.status == EnsureStatus.CONFIG_UPDATED
            reconf = await basin.reconfigure_stream("orders/us", config=StreamConfig(retention_policy="infinite"))
            assert reconf.retention_policy == "infinite"
            for i in range(3):
                await basin.create_stream(f"logs/{i}")
            page = await basin.list_streams(prefix="orders/")
            assert [s.name for s in page.items] == ["orders/eu", "orders/us"] and not page.has_more
            page = await basin.list_streams(limit=2)
            assert page.has_more and len(page.items) == 2
            await basin.delete_stream("orders/eu")
            with pytest.raises(s2_sdk.S2ServerError) as gone:
                await basin.get_stream_config("orders/eu")
            assert gone.value.code == "stream_not_found"
            await s2.delete_basin(basin_name)

    run(scenario())


def test_create_with_the_same_request_token_is_idempotent(s2_server, basin_name):
    headers = {"content-type": "application/json", "s2-request-token": "tok-1"}
    body = json.dumps({"basin": basin_name}).encode()
    first = h2_request(s2_server.port, "POST", "/v1/basins", headers, body)
    again = h2_request(s2_server.port, "POST", "/v1/basins", headers, body)
    other = h2_request(s2_server.port, "POST", "/v1/basins", {**headers, "s2-request-token": "tok-2"}, body)
    assert first[0] == 201 and again[0] == 200
    assert json.loads(first[2])["created_at"] == json.loads(again[2])["created_at"]
    assert other[0] == 409 and json.loads(other[2])["code"] == "resource_already_exists"
    stream_headers = {**headers, "s2-basin": basin_name}
    sbody = json.dumps({"stream": "s"}).encode()
    assert h2_request(s2_server.port, "POST", "/v1/streams", stream_headers, sbody)[0] == 201
    assert h2_request(s2_server.port, "POST", "/v1/streams", stream_headers, sbody)[0] == 200


@pytest.mark.parametrize("name", ["short", "UpperCase1", "-leading-dash", "trailing-dash-", "x" * 49, "bad_char!"])
def test_bad_basin_names_are_rejected_by_the_server(s2_server, name):
    status, _, body = h2_request(s2_server.port, "POST", "/v1/basins", {"content-type": "application/json"},
                                 json.dumps({"basin": name}).encode())
    assert status == 422 and json.loads(body)["code"] == "invalid"


def test_bad_stream_names_are_rejected(s2_server, basin_name):
    run(_create_basin(s2_server, basin_name))
    for name in ["", ".", "..", "a\u0000b", "x" * 513]:
        status, _, body = h2_request(s2_server.port, "POST", "/v1/streams",
                                     {"content-type": "application/json", "s2-basin": basin_name},
                                     json.dumps({"stream": name}).encode())
        assert status == 422, name
        assert json.loads(body)["code"] == "invalid"


async def _create_basin(server, name):
    async with client_for(server) as s2:
        await s2.create_basin(name)


def test_unimplemented_endpoints_answer_with_a_clear_error(s2_server, basin_name):
    """Reads as server-sent events (openapi.json ReadEvent) are not served: 501 not_implemented, never a hang."""
    run(_create_basin(s2_server, basin_name))
    status, _, body = h2_request(s2_server.port, "GET", "/v1/streams/s/records",
                                 {"s2-basin": basin_name, "accept": "text/event-stream"})
    assert status == 501 and json.loads(body)["code"] == "not_implemented"


def test_concurrent_creates_of_one_stream_race_cleanly_on_a_durable_server(tmp_path):
    """Many requests creating or ensuring the same stream at once (s2.create-streams from every Spark task): on a
    durable server the inserts wait for the writer thread, so all pass the in-memory check first. One creates the
    stream; the other creates get resource_already_exists (not a 500 from the database); every ensure succeeds."""
    import asyncio

    from sluice.s2local._core import Core
    from sluice.s2local._errors import S2Error

    async def scenario():
        core = Core(tmp_path / "data")
        await core.start()
        await core.create_basin("race-basin", None, None)

        async def create():
            try:
                await core.create_stream("race-basin", "s", None, None)
                return "created"
            except S2Error as e:
                return e.code

        creates = await asyncio.gather(*(create() for _ in range(8)))
        ensures = await asyncio.gather(*(core.ensure_stream("race-basin", "e", None) for _ in range(8)))
        # The same for basins (s2.create-basin from every task: seen failing in bench/faults/)
        basins = await asyncio.gather(*(core.ensure_basin("race-basin-2", None) for _ in range(8)))
        await core.stop()
        return creates, [status for _, status in ensures], [status for _, status in basins]

    creates, ensures, basins = asyncio.run(scenario())
    assert sorted(creates) == ["created"] + ["resource_already_exists"] * 7, creates
    assert sorted(ensures) == ["created"] + ["noop"] * 7, ensures
    assert sorted(basins) == ["created"] + ["noop"] * 7, basins


def test_streams_inherit_the_basins_default_config_on_every_creation_path(s2_server, basin_name):
    default = StreamConfig(storage_class="express", retention_policy=3600,
                           timestamping=Timestamping(mode=TimestampingMode.ARRIVAL), delete_on_empty_min_age=60)
    # What the streams report: the basin's defaults, and S2's default for the field it leaves unset.
    effective = StreamConfig(storage_class="express", retention_policy=3600, delete_on_empty_min_age=60,
                             timestamping=Timestamping(mode=TimestampingMode.ARRIVAL, uncapped=False))

    async def scenario():
        async with client_for(s2_server) as s2:
            await s2.create_basin(basin_name, config=BasinConfig(default_stream_config=default,
                                                                 create_stream_on_append=True,
                                                                 create_stream_on_read=True))
            basin = s2.basin(basin_name)
            await basin.create_stream("created")
            await basin.create_stream("partly", config=StreamConfig(retention_policy="infinite"))
            await basin.ensure_stream("ensured")
            await basin.stream("on-append").append(s2_sdk.AppendInput(records=[s2_sdk.Record(body=b"x")]))
            await basin.stream("on-read").check_tail()
            for name in ("created", "ensured", "on-append", "on-read"):
                assert await basin.get_stream_config(name) == effective, name
            partly = await basin.get_stream_config("partly")
            assert partly.retention_policy == "infinite" and partly.storage_class == "express"

    run(scenario())


@pytest.mark.parametrize(("config", "message"), [
    ({"retention_policy": {"age": 0}}, "retention_policy.age"),
    ({"retention_policy": {"age": -1}}, "retention_policy.age"),
    ({"retention_policy": {"age": 5, "infinite": {}}}, "retention_policy"),
    ({"retention_policy": 7}, "retention_policy"),
    ({"storage_class": "cold"}, "storage_class"),
    ({"timestamping": {"mode": "sometimes"}}, "timestamping.mode"),
    ({"timestamping": {"uncapped": "yes"}}, "timestamping.uncapped"),
    ({"timestamping": {"speed": 1}}, "timestamping field"),
    ({"delete_on_empty": {"min_age_secs": -5}}, "delete_on_empty.min_age_secs"),
    ({"delete_on_empty": 3}, "delete_on_empty"),
])
def test_stream_configs_are_validated_with_422(s2_server, basin_name, config, message):
    run(_create_basin(s2_server, basin_name))
    for method, path, body in [("POST", "/v1/streams", {"stream": "s", "config": config}),
                               ("PUT", "/v1/streams/s2", config),
                               ("POST", "/v1/basins", {"basin": basin_name + "-d",
                                                       "config": {"default_stream_config": config}})]:
        status, _, raw = h2_request(s2_server.port, method, path, {"s2-basin": basin_name,
                                                                   "content-type": "application/json"},
                                    json.dumps(body).encode())
        assert (status, json.loads(raw)["code"]) == (422, "invalid"), (method, path, raw)
        assert message in json.loads(raw)["message"]


def test_bad_basin_reconfigurations_and_list_limits(s2_server, basin_name):
    run(_create_basin(s2_server, basin_name))
    for body in (b"null", b"[]", b'{"create_stream_on_append": "yes"}'):
        status, _, raw = h2_request(s2_server.port, "PATCH", f"/v1/basins/{basin_name}",
                                    {"content-type": "application/json"}, body)
        assert status == 422, (body, raw)
    # S2 clamps list limits to 1000 instead of refusing them.
    status, _, raw = h2_request(s2_server.port, "GET", "/v1/basins?limit=5000")
    assert status == 200 and "basins" in json.loads(raw)
    status, _, raw = h2_request(s2_server.port, "GET", "/v1/streams?limit=1001", {"s2-basin": basin_name})
    assert status == 200 and "streams" in json.loads(raw)


def test_concurrent_appends_to_a_new_stream_create_it_once_and_all_land(tmp_path, basin_name):
    """create_stream_on_append, as S2 does it: many appends racing to a stream that does not exist yet all succeed
    (the first creates it), none fails with resource_already_exists. A durable server: its writes to disk are
    where two creates overlap."""
    from s2_sdk import AppendInput, Record

    from sluice.s2local import LocalS2

    async def scenario(server):
        async with client_for(server) as s2:
            await s2.create_basin(basin_name, config=BasinConfig(create_stream_on_append=True))
            basin = s2.basin(basin_name)
            acks = await asyncio.gather(*(basin.stream(f"new/{i % 2}").append(
                AppendInput(records=[Record(body=f"r{i}".encode())])) for i in range(20)))
            assert len(acks) == 20
            tails = [(await basin.stream(f"new/{k}").check_tail()).seq_num for k in (0, 1)]
            assert tails == [10, 10]

    with LocalS2(data_dir=tmp_path / "s2") as server:
        run(scenario(server))
