"""The driver's S2 calls of a streaming read, on one client kept open between micro-batches.

A streaming query asks for each stream's tail at every latestOffset, which Spark calls every few milliseconds
while there is nothing new. A new SDK client costs about 20 ms before its first request (it builds an SSL context
and loads the CA store, also for plain-HTTP endpoints) against under a millisecond for a tail check on an open
one; so a streaming read's enumerator keeps one client, on an event loop of its own (the SDK's clients belong to
the loop they were opened on). A restarted server costs a reconnect: the SDK's connection pool opens a new connection
when the old one is gone (tests/connectors/s2/test_kept_client.py). Batch reads plan once and use a client per
call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sluice.connectors.s2._client import Connection

T = TypeVar("T")


class KeptClient:
    """Runs `call(client)` coroutines on one kept client and loop; close() ends both. Not pickled: a copy (e.g. in
    a task) starts without them and opens its own when first asked."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self.opened = 0  # clients opened so far (tests count them)

    def run(self, call: Callable[[Any], Awaitable[T]]) -> T:
        loop = self._running_loop()
        future = asyncio.run_coroutine_threadsafe(self._call(call), loop)
        return future.result()

    async def _call(self, call: Callable[[Any], Awaitable[T]]) -> T:
        if self._client is None:
            client = self.conn.client()
            await client.__aenter__()
            self._client = client
            self.opened += 1
        return await call(self._client)

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # closing a client whose server is gone fails too: dropped anyway
                await client.__aexit__(None, None, None)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="sluice-s2-driver", daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._drop_client(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        assert thread is not None
        thread.join()
        loop.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"conn": self.conn}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["conn"])  # type: ignore[misc]
