"""`format("elasticsearch")` writes: the bulk API, one engine batch per bulk request, each document one entry.

- Order: with `mapping.id`, the sink runs partition-ordered by the id columns (rows of one id share a task and a
  bucket, one bulk of a bucket in flight at a time): one id's changes reach the index in order, different ids go
  concurrently. Without ids the engine generates them and the write is unordered (a retry may index twice).
- Replays: with `mapping.version` or `write.version=micro-batch`, every action carries an external version; the
  engine applies a write only if its version is higher than the stored one, so a replayed or late write never wins
  over a newer one (its version conflict is expected and counted as stale, not an error).
- Per-item results: 429s and other passing failures are retried alone (RetryEntries, Flink's retryForEntries),
  together with the later changes of the same ids. A document refused for what it holds (a 4xx item: a mapping
  conflict, a value that does not parse, an existing id under write.operation=create) is a refused record
  (RefusedRecords): it fails the write naming its id and the server's reason, or, with errors.tolerance=all
  (write.error-index is a shorthand), goes to the dead-letter target as the row it came from (_rows.py). A refusal no
  document can fix (no index, a closed or blocked index, no permission) fails the write.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import (
    Batch,
    BlockingStore,
    Committer,
    Encoded,
    OptionError,
    RecordError,
    RefusedRecords,
    ReplayGuard,
    RetryableError,
    RetryEntries,
    TaskWriter,
    ThrottledError,
    WriteContext,
    WritePlan,
    delete_mask,
    first_null,
    micro_batch_numbers,
    refuse_truncate,
)
from sluice.connectors.elasticsearch._client import Connection, ElasticsearchError
from sluice.connectors.elasticsearch._options import WriteOptions
from sluice.connectors.elasticsearch._rows import EntryRows
from sluice.connectors.elasticsearch._types import json_rows

log = logging.getLogger("sluice.elasticsearch")

MICRO_BATCH_ROWS = 1 << 32  # rows one task may write in one micro-batch under write.version=micro-batch
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)  # one, reused: cheaper
# Item failures that no document can fix, which stay a task failure rather than a refused record: no permission, and
# an index that is missing, closed or blocked (read-only, disk flood stage).
NOT_PER_RECORD_STATUSES = frozenset({401, 403})
NOT_PER_RECORD_TYPES = frozenset({"index_not_found_exception", "index_closed_exception", "cluster_block_exception",
                                  "security_exception"})


@dataclass(frozen=True)
class DocPlan:
    """How a DataFrame row becomes a bulk action, decided on the driver."""

    index: str
    operation: str
    source_columns: tuple[str, ...]  # written into the document
    id_columns: tuple[str, ...]
    routing_column: str | None
    version_column: str | None
    micro_batch_versions: bool
    op_column: str | None

    @property
    def versioned(self) -> bool:
        return self.version_column is not None or self.micro_batch_versions


def _ids(batch: pa.RecordBatch, columns: tuple[str, ...]) -> list[str]:
    if len(columns) == 1:
        return batch.column(columns[0]).cast(pa.string()).to_pylist()
    parts = json_rows(batch, list(columns))
    return [json.dumps([row[c] for c in columns], separators=(",", ":"), ensure_ascii=False) for row in parts]


class DocEncoder:
    """One task's encoder: Arrow chunk -> bulk entries (an action line, and a source line unless it deletes)."""

    def __init__(self, plan: DocPlan, context: WriteContext, rows: EntryRows | None = None) -> None:
        self.plan, self.context, self.rows = plan, context, rows
        self.rows_seen = 0

    def _versions(self, batch: pa.RecordBatch, ids: list[str] | None) -> list[int] | None:
        plan, n = self.plan, batch.num_rows
        if plan.version_column is not None:
            column = batch.column(plan.version_column)
            if column.null_count or (n and pc.min(column).as_py() < 0):
                row = first_null(column) if column.null_count else int(np.argmin(column.to_numpy()))
                raise OptionError(f"mapping.version '{plan.version_column}' is null or negative for document "
                                  f"{ids[row] if ids else row!r}; every document needs a version >= 0.")
            return column.cast(pa.int64()).to_pylist()
        if plan.micro_batch_versions:
            return micro_batch_numbers(self.context.epoch, self.rows_seen, n, per_task=MICRO_BATCH_ROWS,
                                       option="write.version", instead="mapping.version, or write.version=none,",
                                       unit="documents").tolist()
        return None

    def __call__(self, batch: pa.RecordBatch) -> Encoded:
        plan, n = self.plan, batch.num_rows
        if plan.op_column:
            refuse_truncate(batch.column(plan.op_column), plan.op_column, "elasticsearch")
        for name in plan.id_columns:
            if batch.column(name).null_count:
                row = self.rows_seen + first_null(batch.column(name))
                raise OptionError(f"mapping.id column '{name}' is null in row {row} "
                                  f"of this task writing into index '{plan.index}': every document needs an id. "
                                  "Filter such rows out or fill them in.")
        ids = _ids(batch, plan.id_columns) if plan.id_columns else None
        versions = self._versions(batch, ids)
        routing = batch.column(plan.routing_column).cast(pa.string()).to_pylist() if plan.routing_column else None
        deletes = np.zeros(n, dtype=bool)
        if plan.op_column:
            deletes = delete_mask(batch.column(plan.op_column)).to_numpy(zero_copy_only=False)
        sources = json_rows(batch, list(plan.source_columns))
        encode = _JSON.encode
        # Action lines are built as text: a dict and a json.dumps per row cost more than the document itself.
        write_head = f'{{"{"update" if plan.operation == "upsert" else plan.operation}":{{"_index":{encode(plan.index)}'
        delete_head = f'{{"delete":{{"_index":{encode(plan.index)}'
        entries, sizes = [], []
        for i in range(n):
            meta = ""
            if ids is not None:
                meta += f',"_id":{encode(ids[i])}'
            if routing is not None and routing[i] is not None:
                meta += f',"routing":{encode(routing[i])}'
            if versions is not None:
                meta += f',"version":{versions[i]},"version_type":"external"'
            if deletes[i]:
                text = f"{delete_head}{meta}}}}}\n"
            else:
                source = sources[i]
                if plan.operation == "update":
                    source = {"doc": source}
                elif plan.operation == "upsert":
                    source = {"doc": source, "doc_as_upsert": True}
                try:
                    text = f"{write_head}{meta}}}}}\n{encode(source)}\n"
                except ValueError as e:  # NaN or infinity: JSON has no such numbers
                    bad = [c for c, v in sources[i].items() if isinstance(v, float) and not np.isfinite(v)]
                    what = f"document {ids[i]!r}" if ids is not None else f"row {self.rows_seen + i}"
                    raise RecordError(f"{what} has {bad or 'a value'} that JSON cannot carry ({e}); replace NaN "
                                      "and infinities (e.g. with null) before writing.", rows=[i]) from None
            entry = text.encode()
            entries.append(entry)
            sizes.append(len(entry))
        self.rows_seen += n
        if self.rows is not None:
            self.rows.add(batch, entries)
        return Encoded(entries, sizes)


@dataclass(frozen=True)
class ItemFailure:
    position: int
    doc_id: str | None
    status: int
    kind: str
    reason: str

    def describe(self, index: str) -> str:
        where = f"document '{self.doc_id}'" if self.doc_id is not None else f"a document (entry {self.position})"
        return f"{where} of index '{index}': {self.status} {self.kind}: {self.reason}"


class BulkStore(BlockingStore):
    """One task's writer: every engine batch is one POST /_bulk; per-item results decide what goes again."""

    name = "elasticsearch"

    def __init__(self, conn: Connection, plan: DocPlan, refresh: str, rows: EntryRows | None,
                 connections: int) -> None:
        super().__init__()
        self.conn, self.plan, self.refresh, self.rows = conn, plan, refresh, rows
        self.io_threads = connections
        self._lock = threading.Lock()
        self._requests = 0
        self.stale = 0  # versioned writes the index already had at the same or a newer version

    @property
    def target(self) -> str:
        return self.conn.display

    def _node(self) -> int:
        with self._lock:
            self._requests += 1
            return self._requests

    def write_batch(self, batch: Batch) -> None:
        body = b"".join(batch.entries)
        try:
            _, answer = self.conn.request(
                "POST", "/_bulk", body, ndjson=True, node=self._node(),
                refresh="wait_for" if self.refresh == "wait_for" else None,
                filter_path="errors,items.*.status,items.*.error,items.*._id")
        except ElasticsearchError as e:
            if e.status != 413:
                raise
            if len(batch.entries) > 1:
                raise ElasticsearchError(f"a bulk request of {len(body)} bytes ({len(batch.entries)} documents) is "
                                         "over the node's http.max_content_length (413): lower sink.flush-buffer.size "
                                         "below it.", 413) from None
            action = batch.entries[0].split(b"\n", 1)[0].decode(errors="replace")
            raise RecordError(f"one document of {len(body)} bytes is over the node's http.max_content_length "
                              f"(413), alone in its bulk request ({action}): shrink the document or raise the "
                              "limit.") from None
        if not answer.get("errors"):
            if self.rows is not None:
                self.rows.release(batch.entries)
            return
        retry, throttled = [], False
        refused: list[ItemFailure] = []
        failed: list[ItemFailure] = []
        retried_ids: set[str] = set()
        for position, item in enumerate(answer["items"]):
            (op, result), = item.items()
            status, doc_id, error = result.get("status", 500), result.get("_id"), result.get("error")
            if doc_id in retried_ids:  # a later change of an id that goes again: it must follow, not precede
                retry.append(position)
            elif status < 300 or (op == "delete" and status == 404):
                continue
            elif status == 409 and self.plan.versioned and error and error.get("type") == (
                    "version_conflict_engine_exception"):
                self.stale += 1
            elif status == 429 or status >= 500:
                throttled |= status == 429
                retry.append(position)
                if doc_id is not None:
                    retried_ids.add(doc_id)
            else:
                kind = (error or {}).get("type", "error")
                item_failure = ItemFailure(position, doc_id, status, kind,
                                           self.conn.scrub(str((error or {}).get("reason"))))
                (failed if status in NOT_PER_RECORD_STATUSES or kind in NOT_PER_RECORD_TYPES else refused).append(
                    item_failure)
        if failed:  # the index or the cluster refused, not the document: no other document would fare better
            shown = "; ".join(f.describe(self.plan.index) for f in failed[:5])
            more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
            raise ElasticsearchError(f"the cluster refused {len(failed)} of {len(batch.entries)} documents of a bulk "
                                     f"request for a reason no document can fix: {shown}{more}.", failed[0].status)
        again = None
        if retry:
            cause = (ThrottledError if throttled else RetryableError)(
                f"{len(retry)} of {len(batch.entries)} documents refused for now (429 or unavailable shards)")
            again = RetryEntries(str(cause), retry, cause)
        if self.rows is not None:  # rows of the stored documents (and of stale ones) are no longer needed
            kept = {f.position for f in refused}.union(retry)
            self.rows.release([entry for i, entry in enumerate(batch.entries) if i not in kept])
        if refused:
            errors: list[BaseException] = [ElasticsearchError(f.describe(self.plan.index), f.status) for f in refused]
            raise RefusedRecords(f"the cluster refused {len(refused)} of {len(batch.entries)} documents of a bulk "
                                 f"request for what they hold: {errors[0]}", [f.position for f in refused], errors,
                                 again)
        if again is not None:
            raise again

    def refused_rows(self, entries: Sequence[bytes]) -> pa.Table | list[dict[str, object]]:
        """The rows refused documents were encoded from, as the user's columns (errors.tolerance=all keeps them)."""
        if self.rows is None:  # not kept (no dead-letter route): the bulk entries themselves
            return super().refused_rows(entries)
        return self.rows.take(entries)

    def close(self) -> None:
        if self.stale:
            log.info("elasticsearch: %d writes were older than the documents' stored versions and were skipped",
                     self.stale)
        super().close()


class Refresher(Committer):
    """write.refresh=true: at Spark's commit, the index is refreshed so that searches see the write."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def commit(self, messages: list, context: WriteContext) -> None:
        self.conn.request("POST", f"/{self.conn.index}/_refresh")


@dataclass(frozen=True)
class IndexReplayGuard(ReplayGuard):
    """write.replay-guard: a document per query and target in `index` holds the last micro-batch committed, as its
    external version (version_type=external_gte: a replay that marks again never lowers it)."""

    conn: Connection
    index: str

    def _doc(self, write_id: str) -> str:
        return f"/{self.index}/_doc/{quote(f'{write_id}:{self.conn.index}', safe='')}"

    def last_committed(self, write_id: str) -> int | None:
        status, body = self.conn.request("GET", self._doc(write_id), ok=(404,))
        return None if status == 404 else int(body["_version"])

    def mark_committed(self, write_id: str, epoch: int) -> None:
        self.conn.request("PUT", self._doc(write_id), {"query": write_id, "index": self.conn.index, "batch": epoch},
                          ok=(409,), version=epoch, version_type="external_gte")


@dataclass(frozen=True)
class ElasticsearchWritePlan(WritePlan):
    conn: Connection
    docs: DocPlan
    write: WriteOptions

    @property
    def commits_on_driver(self) -> bool:
        return self.write.write_refresh == "true"

    def committer(self) -> Committer | None:
        return Refresher(self.conn)

    def replay_guard(self) -> ReplayGuard | None:
        return IndexReplayGuard(self.conn, self.write.write_replay_guard_index) if self.write.write_replay_guard \
            else None

    def open_task(self, context: WriteContext) -> TaskWriter:
        # errors.tolerance=all (or write.error-index): keep the rows entries came from, for the dead letters
        rows = EntryRows() if self.config.errors.tolerates else None
        store = BulkStore(self.conn, self.docs, self.write.write_refresh, rows, self.write.connections_per_task)
        return TaskWriter(DocEncoder(self.docs, context, rows), store)
