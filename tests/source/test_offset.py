"""A split source's offset (sluice/source/_offset.py): its one serialized form, compact at thousands of partitions,
earlier checkpoints read back, a checkpoint of another version refused, and Spark's own offset handed back when
nothing moved. No Spark."""

import json

import pytest

from sluice.connector import SluiceError
from sluice.source import SplitOffset, SplitStreamReader
from sluice.spark._compat import ReadAllAvailable
from tests.source.helpers import ListEnumerator, NoReader


def test_an_offset_round_trips_through_its_one_serialized_form():
    for offset in (SplitOffset({}), SplitOffset({"a": 0}), SplitOffset({"s/1": 17, "s/2": 1 << 40}),
                   SplitOffset({"t:0": 5, "t:1": 6, "t:3": 8, "u:2": 1, "t:07": 9, "odd:": 2, "x:y:4": 3})):
        serialized = offset.to_json()
        assert serialized["v"] == 2
        assert SplitOffset.from_json(json.loads(json.dumps(serialized))) == offset
    assert SplitOffset({"a": 5, "t:1": 7, "t:0": 6, "t:3": 9}).to_json() == \
        {"v": 2, "splits": {"a": 5}, "runs": {"t": [[0, [6, 7]], [3, [9]]]}}, "numbered ids as runs, in order"


def test_an_offset_of_thousands_of_partitions_holds_little_more_than_their_positions():
    positions = {f"orders-by-customer:{p}": 1_000_000 + p for p in range(3000)}
    compact = len(json.dumps(SplitOffset(positions).to_json()))
    assert compact < 3000 * (len("1000000") + 2) + 100
    # The negative control: the form that names each split takes over three and a half times that.
    assert len(json.dumps({"v": 1, "splits": positions})) > 3.5 * compact


def test_offsets_of_version_one_and_before_the_version_field_are_read():
    assert SplitOffset.from_json({"v": 1, "splits": {"a": 5, "t:0": 7}}) == SplitOffset({"a": 5, "t:0": 7})
    assert SplitOffset.from_json({"splits": {"a": 5, "b": 7}}) == SplitOffset({"a": 5, "b": 7})
    assert SplitOffset.from_json({}) == SplitOffset({}), "no splits known yet"


def test_an_offset_of_another_version_is_refused_naming_the_format_and_what_to_do():
    with pytest.raises(SluiceError, match=r"s2 offset of version 3.*reads version 2.*new checkpoint"):
        SplitOffset.from_json({"v": 3, "splits": {"a": 5}}, "s2")
    with pytest.raises(SluiceError, match=r"split source offset of version 3"):
        SplitOffset.from_json({"v": 3, "splits": {"a": 5}})


def test_an_unmoved_offset_hands_spark_back_its_own_start_and_a_moved_one_the_new_form():
    start = SplitOffset.from_json({"splits": {"a": 5}})  # as a checkpoint without the version field holds it
    assert SplitOffset({"a": 5}).json_or(start) is start.raw, "no position moved: Spark's own offset, no empty batch"
    assert SplitOffset({"a": 6}).json_or(start) == {"v": 2, "splits": {"a": 6}, "runs": {}}
    assert SplitOffset({"a": 5, "b": 0}).json_or(start) == {"v": 2, "splits": {"a": 5, "b": 0}, "runs": {}}, \
        "a new split"


def test_a_restart_from_a_checkpoint_without_the_version_field_runs_no_extra_micro_batch():
    reader = SplitStreamReader(ListEnumerator({"a": 50, "b": 7}), NoReader(), None, None, None)
    checkpointed = {"splits": {"a": 50, "b": 7}}  # the end of the last micro-batch, written before "v"
    assert reader.latestOffset(checkpointed, ReadAllAvailable()) is checkpointed
    reader.enumerator.ends["a"] = 60
    moved = reader.latestOffset(checkpointed, ReadAllAvailable())
    assert moved == {"v": 2, "splits": {"a": 60, "b": 7}, "runs": {}}
    assert [(p.split.split_id, p.start, p.end) for p in reader.partitions(checkpointed, moved)] == [("a", 50, 60)]
