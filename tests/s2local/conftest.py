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
