"""What a table commit is given besides its files: who commits which barrier (`BarrierCommit`), and the table's
maintenance after each commit (`Upkeep`)."""

from __future__ import annotations

from dataclasses import dataclass

# Versions between Delta checkpoints (delta.checkpointInterval of Delta Lake on Spark; delta-rs uses 100): opening a
# table reads the newest checkpoint and at most this many log entries after it (on object storage, one GET each).
CHECKPOINT_INTERVAL = 10
# Compaction: files below this size are small; they are rewritten into files of about this size.
COMPACT_TARGET_BYTES = 128 * 1024 * 1024
# Versions whose log entries the sink keeps when it trims the log (besides those consistent reads may need).
LOG_RETENTION = 100


@dataclass(frozen=True)
class BarrierCommit:
    """Who commits which barrier: `job` is the Delta app transaction id (a replay of its barrier is detected by it),
    `job_id` the MetaService job recorded with the barrier (None: no registered writer)."""

    job: str
    barrier: int
    job_id: str | None = None


@dataclass(frozen=True)
class Upkeep:
    """A table's maintenance after each commit: a Delta checkpoint every `checkpoint_interval` versions; once
    `compact_min_files` files are smaller than `compact_target_bytes` (0: never), a compaction and a clean keeping
    the last `log_retention` versions (and every version a consistent read may open); that clean also every
    `log_retention` versions, for a table that never compacts."""

    checkpoint_interval: int = CHECKPOINT_INTERVAL
    compact_min_files: int = 0
    compact_target_bytes: int = COMPACT_TARGET_BYTES
    log_retention: int = LOG_RETENTION


DEFAULT_UPKEEP = Upkeep()  # of a commit made outside the sink: checkpoints, never a compaction
