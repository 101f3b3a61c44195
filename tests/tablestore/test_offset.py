"""A table-store stream's offset (sluice/tablestore/_offset.py): its one serialized form, today's checkpoints read
back, a checkpoint of another version refused, and Spark's own offset handed back when nothing moved. No Spark:
the reader runs against a SQLite MetaService."""

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from sluice.connector import SluiceError
from sluice.meta import MetaService
from sluice.tablestore import StoreTable
from sluice.tablestore._offset import BarrierOffset
from sluice.tablestore._source import TableStoreStreamReader


def test_an_offset_round_trips_through_its_one_serialized_form():
    for offset in (BarrierOffset(0, 0), BarrierOffset(1_700_000_000_000, 42)):
        serialized = offset.to_json()
        assert serialized["v"] == 1
        assert BarrierOffset.from_json(serialized) == offset
    assert BarrierOffset(1000, 3).to_json() == {"v": 1, "barrier": 1000, "version": 3}


def test_an_offset_written_before_the_version_field_reads_as_version_one():
    assert BarrierOffset.from_json({"barrier": 1000, "version": 3}) == BarrierOffset(1000, 3)


def test_an_offset_of_another_version_is_refused_naming_the_format_and_what_to_do():
    with pytest.raises(SluiceError, match=r"tablestore offset of version 2.*reads version 1.*new checkpoint"):
        BarrierOffset.from_json({"v": 2, "barrier": 1000, "version": 3})


def test_an_unmoved_offset_hands_spark_back_its_own_start_and_a_moved_one_the_new_form():
    start = BarrierOffset.from_json({"barrier": 1000, "version": 3})  # as a checkpoint without "v" holds it
    assert BarrierOffset(1000, 3).json_or(start) is start.raw, "nothing moved: Spark's own offset, no empty batch"
    assert BarrierOffset(2000, 4).json_or(start) == {"v": 1, "barrier": 2000, "version": 4}


@pytest.mark.parametrize("aligned_with", [(), ("totals",)])
def test_a_restart_from_a_checkpoint_without_the_version_field_runs_no_extra_micro_batch(tmp_path, aligned_with):
    meta = str(tmp_path / "meta.db")
    for table in ("orders", "totals"):
        MetaService(meta).complete_barrier(table, 1000, 1)
    reader = TableStoreStreamReader(StoreTable("orders", str(tmp_path / "wh")), meta,
                                    StructType([StructField("id", LongType())]), aligned_with)
    checkpointed = {"barrier": 1000, "version": 1}  # the end of the last micro-batch, written before "v"
    assert reader.latestOffset(checkpointed, None) is checkpointed
    for table in ("orders", "totals"):
        MetaService(meta).complete_barrier(table, 2000, 2)
    moved = reader.latestOffset(checkpointed, None)
    assert moved == {"v": 1, "barrier": 2000, "version": 2}
    [batch] = reader.partitions(checkpointed, moved)
    assert (batch.first, batch.last, batch.barrier) == (1, 2, 2000)
