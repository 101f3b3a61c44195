import asyncio
import uuid

import pytest
import s2_sdk

from sluice.s2local import LocalS2


@pytest.fixture(scope="session")
def s2_server():
    with LocalS2() as server:
        yield server


@pytest.fixture
def basin_name():
    return f"test-{uuid.uuid4().hex[:12]}"


def run(coro):
    return asyncio.run(coro)


def client_for(server, **kwargs):
    return s2_sdk.S2(server.access_token, endpoints=server.endpoints, **kwargs)


def create_stream(server, basin, stream="s"):
    """Create a basin and one stream in it through the SDK."""

    async def scenario():
        async with client_for(server) as s2:
            await s2.create_basin(basin)
            await s2.basin(basin).create_stream(stream)

    run(scenario())
