import asyncio
import uuid

import pytest
import s2_sdk

from sluice.s2local import LocalS2


@pytest.fixture(scope="session")
def s2_local():
    with LocalS2() as server:
        yield server


@pytest.fixture
def s2_opts(s2_local):
    basin = f"sink-{uuid.uuid4().hex[:12]}"
    return {"s2.basin": basin, "s2.stream": "s", "s2.create-streams": "true", "s2.create-basin": "true",
            "s2.endpoints.account": s2_local.url, "s2.endpoints.basin": s2_local.url, "s2.auth-token": "local"}


def read_stream(server, basin, stream, *, include_commands=False):
    """Every record of a stream, through the official SDK."""

    async def scenario():
        async with s2_sdk.S2("local", endpoints=server.endpoints) as client:
            target = client.basin(basin).stream(stream)
            tail = (await target.check_tail()).seq_num
            out = []
            if tail:
                async for batch in target.read_session(start=s2_sdk.SeqNum(0), limit=s2_sdk.ReadLimit(count=tail)):
                    out.extend(batch.records)
            return out if include_commands else [r for r in out if not r.is_command_record()]

    return asyncio.run(scenario())


def list_streams(server, basin):
    async def scenario():
        async with s2_sdk.S2("local", endpoints=server.endpoints) as client:
            return sorted([s.name async for s in client.basin(basin).list_all_streams()])

    return asyncio.run(scenario())
