"""Where a micro-batch of logical decoding messages (option 'messages.prefix') ends, found on the driver by peeking
the slot: the counterpart of ChangeStreamReader._cut for a stream of messages."""

from __future__ import annotations

from typing import Any

from sluice.connectors.postgres._pgoutput import format_lsn
from sluice.connectors.postgres.changes._publication import ChangeStream
from sluice.connectors.postgres.changes._slot import busy_retry


def cut_messages(pg: Any, stream: ChangeStream, begin: int, upto: int, budget: int | None) -> int:
    """Where the next batch ends: `upto`, or within `budget` messages of the streamed prefixes after the last whole
    transaction (its commit LSN + 1) or non-transactional message (its LSN, the end of its WAL record: a peek up
    to it decodes the record, and a slot there skips it) that fits; `begin` when none came (no empty micro-batches).
    Without a budget the peek decodes up to `upto` whole: a first transaction or message tells nothing, since its
    prefix may not be streamed."""
    count = None if budget is None else 2 * budget + 16  # the peek counts every message, BEGIN and COMMIT included
    matches = " OR ".join(["substring(data FROM 11 FOR %s) = %s"] * len(stream.messages))
    params: list[Any] = []
    for prefix in stream.messages:
        raw = prefix.encode() + b"\0"
        params += [len(raw), raw]
    rows = busy_retry(lambda: pg.execute(
        "SELECT get_byte(data, 0), CASE get_byte(data, 0) WHEN 66 THEN substring(data FROM 2 FOR 8) "
        "WHEN 77 THEN substring(data FROM 3 FOR 8) END, get_byte(data, 0) = 77 AND get_byte(data, 1) & 1 = 1, "
        f"get_byte(data, 0) = 77 AND ({matches}) FROM {stream.peek(format_lsn(upto), count)}", params).fetchall(),
        f"peeking slot '{stream.slot}'", stream.conn)
    items: list[list[int]] = []  # [where a batch ending after it ends, messages streamed] in the order they came
    txn: list[int] | None = None
    for kind, position, transactional, streamed in rows:
        if kind == 66:  # B
            commit = int.from_bytes(position, "big")
            txn = [commit + 1, 0] if commit >= begin else None
            if txn is not None:
                items.append(txn)
        elif kind == 77 and transactional:
            if txn is not None and streamed:
                txn[1] += 1
        elif kind == 77:  # sent by the server from its position on: all after `begin`
            items.append([int.from_bytes(position, "big"), int(bool(streamed))])
    truncated = count is not None and len(rows) >= count
    wanted = [item for item in items if item[1]]
    if not wanted:  # only other prefixes: past them when the peek stopped short, else nothing yet
        return items[-1][0] if truncated and items else begin
    if budget is None:
        return upto
    taken = whole_units(wanted, budget)
    if taken == len(wanted) and not truncated:
        return upto
    return wanted[taken - 1][0]


def whole_units(units: list[Any], budget: int) -> int:
    """How many of `units` ((position, count) each: a transaction and its changes, a message) fit `budget` counted,
    whole and in order; at least one, so a micro-batch always moves."""
    taken = total = 0
    for _, count in units:
        if taken and total + count > budget:
            break
        taken += 1
        total += count
    return taken
