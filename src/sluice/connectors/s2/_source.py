"""Reading S2 streams: `spark.read.format("s2")` / `readStream`, and `format("s2_upsert")` changelogs; the options
and the driver's side (the records themselves are read in _reader.py).

A split is one stream; positions are seq nums. The enumerator lists streams (`s2.streams`, or every
stream under `s2.discovery-prefix`, re-listed every `s2.discovery-interval-ms`) and resolves start/end
positions (with s2.read-committed, ends at the last committed micro-batch: _commits.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sluice.connector import (
    OptionError,
    Split,
    SplitEnumerator,
    forward_bounds,
)
from sluice.connectors.s2._calls import KeptClient
from sluice.connectors.s2._client import Connection, explain_sdk_error
from sluice.connectors.s2._commits import committed_end, tail_and_last
from sluice.connectors.s2._options import ReadOptions

log = logging.getLogger("sluice.s2")
T = TypeVar("T")

DEFAULT_SCHEMA = ("stream string, seq_num long, timestamp timestamp, "
                  "headers array<struct<name: binary, value: binary>>, body binary")


def parse_position(text: str, option: str) -> tuple[str, int | None]:
    """('earliest'|'latest', None), ('seq', n) or ('timestamp', epoch ms)."""
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return value.lower(), None
    if value.isdigit():
        return "seq", int(value)
    if value.lower().startswith("timestamp:") and value[10:].strip().isdigit():
        return "timestamp", int(value[10:])
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(f"{option}={text!r}: use earliest, latest, a seq num, timestamp:<epoch ms> or an ISO 8601 "
                          "timestamp") from None
    if moment.tzinfo is None:
        raise OptionError(f"{option}={text!r}: give the timestamp a time zone, e.g. {value}Z")
    return "timestamp", int(moment.timestamp() * 1000)


def _number(kind: str, value: int | None) -> int:
    """The seq num or epoch ms of a ('seq' or 'timestamp', n) position (parse_position always gives them one)."""
    if value is None:
        raise OptionError(f"an s2 position of kind '{kind}' carries no number")
    return value


class S2Enumerator(SplitEnumerator):
    def __init__(self, conn: Connection, options: ReadOptions, batch: bool) -> None:
        self.conn = conn
        self.streams = options.s2_streams
        self.prefix = options.s2_discovery_prefix
        self.interval = options.s2_discovery_interval_ms / 1000.0
        self.start = parse_position(options.s2_start, "s2.start")
        self.end = parse_position(options.s2_end, "s2.end") if batch else ("latest", None)
        if self.end[0] == "earliest":
            raise OptionError("s2.end=earliest would read nothing; use latest, a seq num or a timestamp")
        (start_kind, start_at), (end_kind, end_at) = self.start, self.end
        if start_kind == end_kind and start_at is not None and end_at is not None and start_at > end_at:  # seq, time
            # Refused as given, before positions are clamped to a stream's tail (which could hide it).
            raise OptionError(f"s2.start={options.s2_start} is after s2.end={options.s2_end}: the read would return "
                              "nothing. Swap them, or check which one you meant.")
        self.read_committed = options.s2_read_committed
        # A streaming read asks again every micro-batch (and every poll while idle): one client kept (_calls.py).
        self._kept = None if batch else KeptClient(conn)
        self._listed: list[Split] = []
        self._listed_at = float("-inf")

    def _with_client(self, call: Callable[[Any], Awaitable[T]]) -> T:
        """`call(client)` on the kept client of a streaming read, else on a client of its own."""
        if self._kept is not None:
            return self._kept.run(call)

        async def once() -> T:
            async with self.conn.client() as client:
                return await call(client)

        return asyncio.run(once())

    def close(self) -> None:
        if self._kept is not None:
            self._kept.close()

    def discover(self) -> list[Split]:
        if self.streams:
            return [Split(s) for s in self.streams]
        if time.monotonic() - self._listed_at >= self.interval:
            async def listing(client: Any) -> list[str]:
                import s2_sdk

                try:
                    return [s.name async for s in client.basin(self.conn.basin).list_all_streams(prefix=self.prefix)]
                except s2_sdk.S2Error as error:
                    raise explain_sdk_error(error, self.conn.basin, None, "list-streams", self.conn) \
                        or error from None

            self._listed = [Split(name) for name in sorted(self._with_client(listing))]
            self._listed_at = time.monotonic()
        return self._listed

    def _resolve(self, splits: Sequence[Split], *wheres: tuple[str, int | None],
                 floors: Mapping[str, int] | None = None) -> dict[str, list[int]]:
        """Seq num of each of `wheres` in every split: one client, one tail check per stream, streams asked
        concurrently. With s2.read-committed, "latest" is the committed end (_commits.py)
        above each split's floor: `floors`, or the first of `wheres`."""
        import s2_sdk

        async def resolve(basin: Any, split: Split) -> list[int]:
            try:
                floor = None if floors is None else floors.get(split.split_id)
                return await positions(self.conn.stream(basin, split.split_id), floor)
            except s2_sdk.S2Error as error:
                raise explain_sdk_error(error, self.conn.basin, split.split_id, "check-tail or read", self.conn) \
                    or error from None

        committed = self.read_committed and any(kind == "latest" for kind, _ in wheres)

        async def positions(stream: Any, floor: int | None) -> list[int]:
            tail, last = await tail_and_last(stream) if committed else ((await stream.check_tail()).seq_num, None)
            out: list[int] = []
            for kind, value in wheres:
                if kind == "latest" and committed and (floor is not None or out):
                    out.append(await committed_end(stream, tail, out[0] if floor is None else floor, last))
                elif kind == "latest":
                    out.append(tail)
                elif kind == "seq":
                    out.append(min(_number(kind, value), tail))
                elif kind == "earliest" and tail == 0:
                    out.append(0)  # nothing was ever written: reading would only get S2's 416
                else:
                    start = s2_sdk.SeqNum(0) if kind == "earliest" else s2_sdk.Timestamp(_number(kind, value))
                    try:
                        batch = await stream.read(start=start, limit=s2_sdk.ReadLimit(count=1))
                    except s2_sdk.ReadUnwrittenError as at_tail:
                        # S2 answers 416 when the start resolves to the tail: every record trimmed, or a
                        # timestamp after the last record's. Reading from there means reading new records
                        # (never past the tail this plan saw, so a batch read's start stays <= its end).
                        out.append(min(at_tail.tail.seq_num, tail))
                        continue
                    out.append(batch.records[0].seq_num if batch.records else tail)
            return out

        async def resolve_all(client: Any) -> list[list[int]]:
            basin = client.basin(self.conn.basin)
            return await asyncio.gather(*(resolve(basin, split) for split in splits))

        if not splits:
            return {}
        return dict(zip([s.split_id for s in splits], self._with_client(resolve_all), strict=True))

    def start_positions(self, splits: Sequence[Split]) -> dict[str, int]:
        return {sid: found[0] for sid, found in self._resolve(splits, self.start).items()}

    def end_positions(self, splits: Sequence[Split], starts: Mapping[str, int] | None = None) -> dict[str, int]:
        return {sid: found[0] for sid, found in self._resolve(splits, self.end, floors=starts).items()}

    def bounds(self, splits: Sequence[Split]) -> dict[str, tuple[int, int]]:
        return forward_bounds(self._resolve(splits, self.start, self.end),
                              "s2.start is after s2.end on stream(s) {} (seq nums)", "Check s2.start and s2.end.")

    def bytes_end(self, split: Split, start: int, end: int, max_bytes: int) -> tuple[int, int]:
        import s2_sdk

        async def scan(client: Any) -> tuple[int, int]:
            position, used = start, 0
            stream = self.conn.stream(client.basin(self.conn.basin), split.split_id)
            while position < end and used < max_bytes:
                try:
                    batch = await stream.read(start=s2_sdk.SeqNum(position),
                                              limit=s2_sdk.ReadLimit(count=min(1000, end - position)))
                except s2_sdk.ReadUnwrittenError:  # trimmed up to the tail meanwhile: nothing left to meter
                    break
                if not batch.records:
                    break
                for record in batch.records:
                    size = s2_sdk.metered_bytes([record])
                    if used + size > max_bytes and position > start:
                        return position, used
                    used += size
                    position = record.seq_num + 1
                    if position >= end:
                        break
            return min(position, end), used

        return self._with_client(scan)
