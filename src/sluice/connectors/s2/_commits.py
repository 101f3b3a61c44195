"""Read committed on exactly-once S2 streams: a commit fence after each micro-batch, readers that stop at the last one.

S2 has no transactions: an append is atomic up to 1,000 records and 1 MiB, so a micro-batch larger than that
reaches a stream in several appends, and a reader planning between two of them would see half of it (half of a
source transaction, for change capture). An exactly-once write (sink.transactional=true) therefore ends every
micro-batch, once all its tasks have appended, with a `fence` command record on each stream it wrote (S2's API:
a fence sets the stream's fencing token). The fence is a command record, so consumers that skip command records
(S2's own tools, sluice's reader) see no extra data, and it also shuts out a straggling task of the committed
micro-batch (its appends carry the token its opening fence set, which no longer matches).

A reader with `s2.read-committed` (the default) takes a stream's end as the position after the last commit fence
whenever the records after it belong to a micro-batch still in progress: an opening fence of an exactly-once
writer, or records it stamped (@writer). A stream whose last record is plain data or a commit fence is read to
its tail, so streams written any other way read exactly as before, for one extra one-record read per plan.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from typing import Any

COMMIT_FENCE_PREFIX = "sluice-commit "
_OPENING_FENCE = re.compile(rb"^[0-9a-f]{24}#")  # opening_token(): a writer's digest, '#', its attempt
_SCAN_WINDOW = 1000  # records per read while looking back for a commit fence (S2's most per read)
MAX_CONCURRENT_FENCES = 64  # as the store's unary requests in flight (_store.py)


def writer_digest(writer_id: bytes) -> str:
    return hashlib.sha256(writer_id).hexdigest()[:24]


def opening_token(writer_id: bytes, attempt: int, task_attempt_id: int) -> str:
    """The token a task's writer fences a stream with before its first append (at most S2's 36 bytes)."""
    return f"{writer_digest(writer_id)}#{attempt}.{task_attempt_id}"[:36]


def commit_token(write_id: str, epoch: int | None) -> str:
    """The token of the fence that ends micro-batch `epoch` of write `write_id` on a stream."""
    return f"{COMMIT_FENCE_PREFIX}{writer_digest(write_id.encode())[:12]} {epoch or 0}"[:36]


async def append_commit_fences(streams: list[Any], write_id: str, epoch: int | None) -> None:
    """One commit fence on each stream (SDK handles), MAX_CONCURRENT_FENCES at a time (a write routed over many
    streams must stay inside a connection's HTTP/2 stream limit). No fencing token is given: the writers' tokens
    end here."""
    import s2_sdk

    record = s2_sdk.CommandRecord.fence(commit_token(write_id, epoch))
    slots = asyncio.Semaphore(MAX_CONCURRENT_FENCES)

    async def fence(stream: Any) -> None:
        async with slots:
            await stream.append(s2_sdk.AppendInput(records=[record]))

    await asyncio.gather(*(fence(stream) for stream in streams))


def _fence_token(record: Any) -> bytes | None:
    headers = record.headers
    if len(headers) == 1 and headers[0][0] == b"" and headers[0][1] == b"fence":
        return bytes(record.body)
    return None


def _in_progress(record: Any) -> bool:
    """Whether a stream ending in `record` may be in the middle of an exactly-once micro-batch."""
    token = _fence_token(record)
    if token is not None:
        return bool(_OPENING_FENCE.match(token))
    return any(name == b"@writer" for name, _ in record.headers)


async def tail_and_last(stream: Any) -> tuple[int, Any | None]:
    """The stream's tail and the record just before it (None: empty, or not known from this one read), in one read
    when S2 answers the tail with it (S2's ReadBatch.tail: "present when reading recent records")."""
    import s2_sdk

    try:
        batch = await stream.read(start=s2_sdk.TailOffset(1), limit=s2_sdk.ReadLimit(count=1))
    except s2_sdk.ReadUnwrittenError as empty:
        return empty.tail.seq_num, None
    if batch.tail is None:
        return (await stream.check_tail()).seq_num, None
    last = batch.records[-1] if batch.records else None
    return batch.tail.seq_num, last if last is not None and last.seq_num == batch.tail.seq_num - 1 else None


async def committed_end(stream: Any, tail: int, floor: int, last: Any | None = None) -> int:
    """The position up to which `stream` is committed: `tail` unless a micro-batch is in progress there; then the
    position after its last commit fence, or `floor` (where the reader stands) when none is found after it.
    `last`: the record at `tail` - 1, when known.

    A stamped stream with no fence at all between `floor` and `tail` is an at-least-once stream written with
    s2.stamp-writer: read to its tail."""
    if tail <= floor:
        return tail
    if last is None or last.seq_num != tail - 1:
        before = await _records_between(stream, tail - 1, tail)
        last = before[-1] if before else None
    if last is None or not _in_progress(last):
        return tail
    position, opened = tail, False
    while position > floor:
        begin = max(floor, position - _SCAN_WINDOW)
        records = await _records_between(stream, begin, position)
        for record in reversed(records):
            token = _fence_token(record)
            if token is None:
                continue
            if token.startswith(COMMIT_FENCE_PREFIX.encode()):
                return record.seq_num + 1
            opened = opened or bool(_OPENING_FENCE.match(token))
        position = begin
    return floor if opened else tail


async def uncommitted(stream: Any) -> tuple[int, int, str | None]:
    """(committed end, tail, the last commit fence's token) of `stream`: what `sluice doctor` reports when an
    exactly-once micro-batch was opened there and never committed (committed end < tail). The token (None: no
    commit fence before the end) names the write that committed last: `commit_token(write_id, epoch)`."""
    tail, last = await tail_and_last(stream)
    end = await committed_end(stream, tail, 0, last)
    if end == tail or end == 0:
        return end, tail, None
    (fence,) = await _records_between(stream, end - 1, end)
    token = _fence_token(fence)
    return end, tail, token.decode() if token is not None and token.startswith(COMMIT_FENCE_PREFIX.encode()) else None


async def _records_between(stream: Any, begin: int, end: int) -> list[Any]:
    """Records [begin, end) in order (several reads when the bytes limit of one read cuts it short)."""
    import s2_sdk

    out: list[Any] = []
    position = begin
    while position < end:
        batch = await stream.read(start=s2_sdk.SeqNum(position), limit=s2_sdk.ReadLimit(count=end - position))
        if not batch.records:
            break
        out.extend(r for r in batch.records if r.seq_num < end)
        position = batch.records[-1].seq_num + 1
    return out
