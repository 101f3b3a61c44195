"""The SDK's micro-batch numbering (sluice._micro_batch): numbers a replay gives again, each micro-batch above
the one before, and the refusals outside a stream or past a task's share. No store."""

import numpy as np
import pytest

from sluice.connector import OptionError, micro_batch_numbers

PER_TASK = 1 << 32


def test_a_micro_batchs_rows_are_numbered_after_the_rows_seen_and_above_every_earlier_micro_batch():
    first = micro_batch_numbers(3, 0, 2, per_task=PER_TASK, option="write.timestamp", instead="x")
    more = micro_batch_numbers(3, 2, 3, per_task=PER_TASK, option="write.timestamp", instead="x")
    assert first.dtype == np.int64 and first.tolist() == [3 * PER_TASK, 3 * PER_TASK + 1]
    assert more.tolist() == [3 * PER_TASK + 2, 3 * PER_TASK + 3, 3 * PER_TASK + 4]
    replayed = micro_batch_numbers(3, 0, 2, per_task=PER_TASK, option="write.timestamp", instead="x")
    assert replayed.tolist() == first.tolist(), "a replay numbers its rows as the first run did"
    last_of_previous = micro_batch_numbers(2, PER_TASK - 1, 1, per_task=PER_TASK, option="o", instead="x")
    assert last_of_previous[0] < first[0]
    assert micro_batch_numbers(0, 0, 1, per_task=1 << 24, option="o", instead="x", base=1 << 24).tolist() == [1 << 24]
    assert micro_batch_numbers(5, 0, 0, per_task=8, option="o", instead="x").tolist() == []


def test_outside_a_stream_or_past_a_tasks_share_the_numbering_is_refused_naming_the_option():
    with pytest.raises(OptionError, match=r"^write.version=micro-batch numbers documents by their micro-batch: it "
                                          r"needs a streaming query\. Use mapping.version, or write.version=none, "
                                          r"here\.$"):
        micro_batch_numbers(None, 0, 1, per_task=PER_TASK, option="write.version",
                            instead="mapping.version, or write.version=none,", unit="documents")
    micro_batch_numbers(1, 6, 2, per_task=8, option="write.timestamp", instead="x")  # exactly the share: fine
    with pytest.raises(OptionError, match=r"write.timestamp=micro-batch numbers at most 8 rows per task and "
                                          r"micro-batch; use more partitions"):
        micro_batch_numbers(1, 6, 3, per_task=8, option="write.timestamp", instead="x")
