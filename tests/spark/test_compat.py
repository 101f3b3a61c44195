"""sluice/spark/_compat.py: one stream reader for every Spark line. Spark 4.2+ calls latestOffset(start, limit);
4.0/4.1 call latestOffset() and announce the latest offset after a restart with partitions(latest, latest)."""

import logging

import pytest
from pyspark.sql.datasource import InputPartition

from sluice.spark import _compat
from sluice.spark._compat import AdmissionControlledReader, ReadAllAvailable, ReadMaxRows

pytestmark = pytest.mark.lines


class Positions(AdmissionControlledReader):
    """Records 0..head-1; a micro-batch takes at most `cap` of them."""

    cap_options = ("max-records-per-trigger",)

    def __init__(self, head: int, cap: int | None) -> None:
        self.head, self.cap = head, cap

    def initialOffset(self) -> dict:
        return {"pos": 0}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.cap) if self.cap else ReadAllAvailable()

    def latest_offset(self, start: dict, limit) -> dict:
        upto = self.head if isinstance(limit, ReadAllAvailable) else min(self.head, start["pos"] + limit.max_rows)
        return {"pos": upto}

    def plan_partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition((start["pos"], end["pos"]))]

    def read(self, partition):
        yield from ()


def run_without_admission_control(reader: Positions, triggers: int) -> list[tuple[int, int]]:
    """What Spark 4.0/4.1 do each trigger: latestOffset() with nothing, then plan from the last end to it."""
    batches, last = [], None
    for _ in range(triggers):
        end = reader.latestOffset()
        start = last or reader.initialOffset()
        if end != start:
            batches += [p.value for p in reader.partitions(start, end)]
        last = end
    return batches


def test_without_admission_control_the_reader_caps_each_micro_batch_from_where_the_last_one_ended():
    reader = Positions(head=25, cap=10)
    assert run_without_admission_control(reader, 4) == [(0, 10), (10, 20), (20, 25)]


def test_after_a_restart_the_cap_counts_from_the_offset_spark_announces_not_from_the_beginning():
    restarted = Positions(head=45, cap=10)
    assert restarted.partitions({"pos": 20}, {"pos": 20}) == []  # Spark's setLatestSeenOffset: nothing to read
    assert restarted.latestOffset() == {"pos": 30}
    # Negative control: without the announcement the reader can only count from its initial offset.
    assert Positions(head=45, cap=10).latestOffset() == {"pos": 10}


def test_with_admission_control_sparks_start_and_limit_are_used_as_given():
    reader = Positions(head=100, cap=10)
    assert reader.latestOffset({"pos": 50}, ReadMaxRows(7)) == {"pos": 57}
    assert reader.latestOffset({"pos": 50}, ReadAllAvailable()) == {"pos": 100}  # AvailableNow's limit


def test_a_cap_that_leaves_data_behind_is_warned_once_naming_the_option_and_the_line(caplog):
    with caplog.at_level(logging.WARNING, "sluice.spark"):
        run_without_admission_control(Positions(head=25, cap=10), 4)
        run_without_admission_control(Positions(head=5, cap=10), 2)  # the cap never bites: no warning
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "max-records-per-trigger" in warned[0] and f"Spark {_compat.SPARK_LINE}" in warned[0]
    assert "AvailableNow" in warned[0] and "4.2" in warned[0]


def test_the_running_lines_capabilities_are_what_its_pyspark_offers():
    import pyspark.sql.datasource as ds

    line = _compat.SPARK_VERSION
    assert _compat.HAS_ARROW_STREAM_WRITER == hasattr(ds, "DataSourceStreamArrowWriter") == (line >= (4, 1))
    assert (line >= (4, 1)) == _compat.HAS_FILTER_PUSHDOWN
    assert (line >= (4, 2)) == _compat.HAS_ADMISSION_CONTROL


def test_a_pyspark_older_than_4_0_is_refused_at_import_with_the_fix(monkeypatch):
    import importlib
    import sys

    import pyspark

    monkeypatch.setattr(pyspark, "__version__", "3.5.6")
    monkeypatch.delitem(sys.modules, "sluice.spark._compat")
    with pytest.raises(ImportError, match=r"pyspark >= 4\.0.*pyspark 3\.5\.6.*sluice\[spark\]"):
        importlib.import_module("sluice.spark._compat")
    monkeypatch.undo()
    importlib.import_module("sluice.spark._compat")
