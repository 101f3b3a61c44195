"""`spark.readStream.format("postgres_changes")`: a table's committed changes, in order, from logical replication.

A sibling format rather than an option of `format("postgres")`: its options (slot, publication, snapshot, ...)
have nothing in common with a batch read's beyond the connection, and each format validates and documents
exactly its own.

How it works (the built-in `pgoutput` plugin, so any PostgreSQL >= 12 with wal_level=logical):
- **Offsets are LSNs** in Spark's checkpoint. A micro-batch (start, end] holds every transaction of the
  publication whose commit record lies in [start, end), whole: `pg_logical_slot_peek_binary_changes(slot,
  end, ...)` decodes transactions committed before `end` and never consumes them. The slot is advanced to
  a batch's start when the next batch is planned (Spark has then committed everything before it) and in
  `commit()`, so a restarted query replays exactly the batches Spark did not commit. The end of a batch is
  the server's flushed WAL position, or with `max-changes-per-trigger` the commit after the last transaction
  that fits (at least one transaction, never a part of one). When only tables outside the publication wrote
  (`quiet-advance-wal-bytes` of WAL), a batch without rows moves past their WAL, so the slot does not hold it back.
- **A batch's fetch is overlapped with its decoding** (`fetch-ranges`): the server materializes a whole peek
  before sending any of it, so a large batch is fetched as consecutive WAL ranges, each after the first from a
  temporary copy of the slot advanced to the range's start (the copy skips earlier transactions on the server;
  each range's decoder keeps only its own), the next range fetched in a thread while this one is decoded.
- **Initial snapshot without gap or overlap**: on first start the slot is created over the replication
  protocol with an exported snapshot (held open by a small process, see _snapshot.py); micro-batch 0 reads
  the tables in that snapshot, in parallel splits as `format("postgres")` does, and every later batch
  streams from the slot's consistent point, where that snapshot ends. With `max-changes-per-trigger` the
  snapshot is cut into splits of about that many rows (table statistics) and read over as many micro-batches,
  whole splits each; the splits are planned once and carried in the offsets, so a replayed batch reads the same
  ones (typed in _offset.py, with their serialized form).
- **Rows**: the tables' columns typed as `format("postgres")` types them, then `_op` (insert, update, delete:
  values `upsert.op-column` takes; snapshot rows are inserts; truncate, one row per emptied table with the
  columns null, unless option truncate=fail), `_lsn` (the commit LSN as a number),
  `_commit_time`, `_xid` (null for snapshot rows), `_table` (schema.name) and `_unchanged` (the columns an UPDATE
  left unchanged and pgoutput did not send, TOASTed values: null in the row; what `upsert.unchanged-column` takes).
- **Logical decoding messages** (option 'messages.prefix', PostgreSQL 14+): instead of table changes, the
  messages of the listed prefixes (pg_logical_emit_message), transactional ones with their transaction in commit
  order, each batch read from the slot moved to the batch's start (_messages.py plans, _pgmessages.py decodes).
- **A lost slot is data loss**: dropped, invalidated (max_slot_wal_keep_size) or moved past the query's
  position by someone else (checked when a batch is planned and again, on the executor, after its changes are
  fetched). failOnDataLoss=true (default) fails; false warns, re-creates the slot and goes on from its new position.
- **Snapshots on demand** (_backfill): a table new to the capture at a restart, or one a signal table's
  `execute-snapshot` row names, is read in primary-key chunks, one per micro-batch and first in it, as `read` rows.
- **One query per slot** (SlotGuard): the driver holds an advisory lock named after the slot for the query's life,
  so a second query on it fails at start instead of advancing the slot past the first one's changes.

The package, one concern per module: _options (the options), _publication (what the driver resolves: publication,
tables, columns), _slot (slot state, the one-query-per-slot guard, operations on slots), _offset (the offset Spark
checkpoints, typed), _messages (where a batch of messages ends), _backfill (snapshots on demand: requests, chunks and
their snapshots), _stream (the driver's side: micro-batch planning,
the slot moved as Spark commits), _read (the executors' side: snapshot splits and WAL ranges read and decoded) and
_datasource (the Spark data source).
"""

from sluice.connectors.postgres.changes._datasource import PostgresChangesDataSource
from sluice.connectors.postgres.changes._options import CHANGES_SPEC
from sluice.connectors.postgres.changes._slot import INVALIDATION_REASONS, SlotInfo, drop_slot, list_slots

__all__ = ["CHANGES_SPEC", "INVALIDATION_REASONS", "PostgresChangesDataSource", "SlotInfo", "drop_slot", "list_slots"]
