"""A streaming read's enumerator keeps one S2 client between micro-batches (sluice/connectors/s2/_calls.py), and
a server restart costs it a reconnect, not a failed micro-batch."""

import asyncio
import threading

import s2_sdk

from sluice.connector import Split
from sluice.connectors.s2._client import Connection
from sluice.connectors.s2._options import READ_SPEC, ReadOptions
from sluice.connectors.s2._source import S2Enumerator
from sluice.s2local import LocalS2


def enumerator_over(server: LocalS2, basin: str, *, batch: bool) -> S2Enumerator:
    opts = READ_SPEC.parse({"s2.basin": basin, "s2.streams": "s", "s2.endpoints.account": server.url,
                            "s2.endpoints.basin": server.url, "s2.auth-token": "local"})
    return S2Enumerator(Connection.from_options(opts), ReadOptions.of(opts), batch=batch)


def append(server: LocalS2, basin: str, count: int) -> None:
    async def scenario():
        async with s2_sdk.S2("local", endpoints=server.endpoints) as client:
            stream = client.basin(basin).stream("s")
            await stream.append(s2_sdk.AppendInput(records=[s2_sdk.Record(body=b"x") for _ in range(count)]))

    asyncio.run(scenario())


def create(server: LocalS2, basin: str) -> None:
    async def scenario():
        async with s2_sdk.S2("local", endpoints=server.endpoints) as client:
            await client.create_basin(basin)
            await client.basin(basin).create_stream("s")

    asyncio.run(scenario())


def test_a_streaming_enumerator_asks_every_time_on_one_client_and_a_batch_one_keeps_none(s2_local):
    create(s2_local, "kept-one")
    streaming = enumerator_over(s2_local, "kept-one", batch=False)
    try:
        for n in range(1, 21):  # twenty micro-batches' plans
            append(s2_local, "kept-one", 1)
            assert streaming.end_positions([Split("s")]) == {"s": n}
        assert streaming._kept is not None and streaming._kept.opened == 1
    finally:
        streaming.close()
    assert not [t for t in threading.enumerate() if t.name == "sluice-s2-driver"], "close() ends the loop"
    batch = enumerator_over(s2_local, "kept-one", batch=True)  # the negative control: plans once, keeps nothing
    assert batch.end_positions([Split("s")]) == {"s": 20}
    assert batch._kept is None


def test_a_kept_client_reconnects_after_the_server_restarts(tmp_path):
    data = tmp_path / "s2"
    server = LocalS2(data, port=0).start()
    port = server.port
    try:
        create(server, "kept-restart")
        append(server, "kept-restart", 3)
        enumerator = enumerator_over(server, "kept-restart", batch=False)
        assert enumerator.end_positions([Split("s")]) == {"s": 3}
        server.stop()
        server = LocalS2(data, port=port).start()  # the same address, the data kept
        append(server, "kept-restart", 2)
        assert enumerator.end_positions([Split("s")]) == {"s": 5}
        enumerator.close()
    finally:
        server.stop()
