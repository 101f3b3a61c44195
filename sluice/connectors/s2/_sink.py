"""`format("s2")` / `format("s2_upsert")` writes: the plan every task opens its encoder and S2Store from."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from sluice.connector import Committer, TaskWriter, WriteContext, WritePlan
from sluice.connectors.s2._codec import S2Encoder
from sluice.connectors.s2._commits import append_commit_fences
from sluice.connectors.s2._kinds import RecordKind
from sluice.connectors.s2._options import Connection, explain_sdk_error
from sluice.connectors.s2._store import S2Store

log = logging.getLogger("sluice.s2")


class S2Committer(Committer):
    """Records are durable once acknowledged; exactly-once comes from the writers' fencing and resume (see
    _store.py), which also makes a replayed epoch a no-op. What an exactly-once commit publishes is the end of
    the micro-batch: a commit fence on every stream it wrote, which read-committed readers stop at (_commits.py)."""

    def __init__(self, conn: Connection | None) -> None:
        """`conn`: where to append commit fences (exactly-once writes); None: nothing to publish."""
        self.conn = conn

    def commit(self, messages: list[Any], context: WriteContext) -> None:
        streams = sorted({s for m in messages if m for s in m.get("streams", {})})
        if self.conn is not None and streams:
            asyncio.run(self._fence(streams, context))
        log.debug("s2 epoch %s of %s committed by %d task(s)", context.epoch, context.write_id, len(messages))

    async def _fence(self, streams: list[str], context: WriteContext) -> None:
        import s2_sdk

        async with self.conn.client() as client:
            try:
                basin = client.basin(self.conn.basin)
                await append_commit_fences([self.conn.stream(basin, name) for name in streams], context.write_id,
                                           context.epoch)
            except s2_sdk.S2Error as error:
                raise explain_sdk_error(error, self.conn.basin, None, "append", self.conn) \
                    or error from None

    def abort(self, messages: list[Any], context: WriteContext) -> None:
        streams = sorted({s for m in messages if m for s in m.get("streams", {})})
        log.warning("s2 write %s epoch %s aborted. Tasks that finished had appended to %s; failed tasks may have "
                    "appended part of their rows too, to any target stream. S2 streams are append-only: those "
                    "records stay. A streaming query restarted from its checkpoint resumes this epoch without "
                    "duplicates; re-running a batch write is a new write and appends its rows again.",
                    context.write_id, context.epoch, streams or "no stream")


@dataclass(frozen=True)
class S2WritePlan(WritePlan):
    kind: RecordKind = RecordKind.APPEND

    def open_task(self, context: WriteContext) -> TaskWriter:
        opts = self.options
        exactly_once = opts["sink.transactional"]
        stamp = opts["s2.stamp-writer"] or exactly_once
        encoder = S2Encoder(self.kind, opts, self.schema.fieldNames(), context, stamp)
        store = S2Store(Connection.from_options(opts, exactly_once), opts["s2.stream"],
                        create_streams=opts["s2.create-streams"], create_basin=opts["s2.create-basin"],
                        exactly_once=exactly_once, max_sessions=opts["s2.max-append-sessions"])
        return TaskWriter(encoder, store)

    def committer(self) -> Committer:
        exactly_once = self.options["sink.transactional"]
        return S2Committer(Connection.from_options(self.options, True) if exactly_once else None)
