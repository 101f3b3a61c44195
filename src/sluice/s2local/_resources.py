"""The local server's basins and streams as the event loop holds them, and append sessions."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from sluice.s2local._errors import S2Error


@dataclass
class Basin:
    name: str
    config: dict[str, Any]
    created_at: str
    request_token: str | None = None

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "created_at": self.created_at, "deleted_at": None, "location": "local"}


@dataclass
class Stream:
    id: int
    basin: str
    name: str
    config: dict[str, Any]
    created_at: str
    request_token: str | None = None
    next_seq: int = 0
    last_ts: int = 0
    fencing_token: str = ""
    trim_point: int = 0
    # The basin's stream_cipher when the stream was created (BasinConfig.stream_cipher: "Encryption algorithm to
    # apply to newly created streams in the basin"): a later change of the basin's cipher leaves it as it is.
    cipher: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    # Since the server started (metrics): append/read ops, records and metered bytes.
    usage: Counter[str] = field(default_factory=Counter, repr=False)
    # (arrival in ms, seq num after the records that arrived then), oldest first: what the retention age trims.
    arrivals: deque[tuple[int, int]] = field(default_factory=deque, repr=False)
    # Records below this were stored before the server started: their arrival is gone, their timestamp stands in.
    stored_before_start: int = 0

    def info(self) -> dict[str, Any]:
        """StreamInfo; `cipher` is "Encryption algorithm for this stream, if encryption is enabled" (null if not)."""
        return {"name": self.name, "created_at": self.created_at, "deleted_at": None, "cipher": self.cipher}

    @property
    def tail(self) -> tuple[int, int]:
        return self.next_seq, self.last_ts

    def arrived(self, at_ms: int, end_seq: int) -> None:
        """Records up to `end_seq` arrived by `at_ms` (for the retention age; one entry per second at most)."""
        if self.arrivals and at_ms - self.arrivals[-1][0] < 1000:
            self.arrivals[-1] = (self.arrivals[-1][0], end_seq)
        else:
            self.arrivals.append((at_ms, end_seq))

    def publish(self) -> None:
        """Wake every reader following this stream (a fresh Event per generation)."""
        event, self.changed = self.changed, asyncio.Event()
        event.set()


class Session:
    """An append session: once one of its batches fails, none of its later batches may be applied."""

    def __init__(self) -> None:
        self.failed: S2Error | None = None
