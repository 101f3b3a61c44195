"""Numbers that order a streaming write's rows by micro-batch (Cassandra's and HBase's cell timestamps,
Elasticsearch's external versions): a replayed micro-batch gives each row the number it gave before, so the
store's last-write-wins keeps what the first run wrote, and every later micro-batch numbers higher."""

from __future__ import annotations

import numpy as np

from sluice._errors import OptionError


def micro_batch_numbers(epoch: int | None, rows_seen: int, n: int, *, per_task: int, option: str, instead: str,
                        unit: str = "rows", base: int = 0) -> np.ndarray:
    """The numbers of a task's next `n` rows in micro-batch `epoch` (`rows_seen` before them in this task):
    `base + epoch * per_task + rows_seen + i`. Refuses a write outside a streaming query (`epoch` None: use
    `instead`) and a task with more than `per_task` rows in one micro-batch; `option` names the setting
    (write.timestamp, write.version)."""
    if epoch is None:
        raise OptionError(f"{option}=micro-batch numbers {unit} by their micro-batch: it needs a streaming query. Use "
                          f"{instead} here.")
    if rows_seen + n > per_task:
        raise OptionError(f"{option}=micro-batch numbers at most {per_task} rows per task and micro-batch; use more "
                          "partitions or a smaller maxOffsetsPerTrigger.")
    return base + epoch * per_task + rows_seen + np.arange(n, dtype=np.int64)
