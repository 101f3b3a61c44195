"""`format("s2")` / `format("s2_upsert")` writes: the plan every task opens its encoder and S2Store from."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from sluice.connector import Committer, TaskWriter, WriteContext, WritePlan
from sluice.connectors.s2._client import Connection, explain_sdk_error
from sluice.connectors.s2._codec import S2Encoder
from sluice.connectors.s2._commits import append_commit_fences
from sluice.connectors.s2._options import FormatWriteOptions, template_columns
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
            asyncio.run(self._fence(self.conn, streams, context))
        log.debug("s2 epoch %s of %s committed by %d task(s)", context.epoch, context.write_id, len(messages))

    @staticmethod
    async def _fence(conn: Connection, streams: list[str], context: WriteContext) -> None:
        import s2_sdk

        async with conn.client() as client:
            try:
                basin = client.basin(conn.basin)
                await append_commit_fences([conn.stream(basin, name) for name in streams], context.write_id,
                                           context.epoch)
            except s2_sdk.S2Error as error:
                raise explain_sdk_error(error, conn.basin, None, "append", conn) \
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
    """`write`: the format's own options; `conn`: the basin, resolved on the driver (exactly-once writes with the
    NO_SIDE_EFFECTS retry policy), for the tasks and the committer alike."""

    write: FormatWriteOptions
    conn: Connection

    def open_task(self, context: WriteContext) -> TaskWriter:
        write, exactly_once = self.write, self.config.transactional
        one_stream = None if template_columns(write.s2_stream) else write.s2_stream  # a fixed s2.stream: bare records
        encoder = S2Encoder(write, self.schema.fieldNames(), context, stamp=write.s2_stamp_writer or exactly_once,
                            bare_records=one_stream is not None)
        store = S2Store(self.conn, write.s2_stream, create_streams=write.s2_create_streams,
                        create_basin=write.s2_create_basin, exactly_once=exactly_once,
                        max_sessions=write.s2_max_append_sessions, one_stream=one_stream)
        return TaskWriter(encoder, store)

    def committer(self) -> Committer:
        return S2Committer(self.conn if self.config.transactional else None)
