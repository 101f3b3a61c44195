"""The change stream's offset (changes/_offset.py): its one serialized form, today's checkpoints read back, and a
checkpoint of another version refused. Pure logic, no server and no Spark."""

import pytest

from sluice.connector import SluiceError
from sluice.connectors.postgres.changes._offset import ChangeOffset, SnapshotSplit


def test_every_kind_of_offset_round_trips_through_its_one_serialized_form():
    splits = (SnapshotSplit("public.t", "id < 500", 500), SnapshotSplit("public.t", "id >= 500", 499))
    for offset in (ChangeOffset(0x16B3748), ChangeOffset(7, quiet=True),
                   ChangeOffset(1 << 32, snapshot="00000003-00000002-1", channel="sluice_snap_ab12"),
                   ChangeOffset(1 << 32, "00000003-00000002-1", "sluice_snap_ab12", splits, done=1)):
        serialized = offset.to_json()
        assert serialized["v"] == 1
        assert ChangeOffset.from_json(serialized) == offset
    assert ChangeOffset(0x16B3748).to_json() == {"v": 1, "lsn": "0/16B3748"}, "the LSN as PostgreSQL writes it"


def test_an_offset_written_before_the_version_field_reads_as_version_one():
    old = {"lsn": "1/A0", "snapshot": "00000003-00000002-1", "channel": "sluice_snap_ab12",
           "splits": [["public.t", "id < 500", 500]], "done": 1}
    offset = ChangeOffset.from_json(old)
    assert offset == ChangeOffset((1 << 32) + 0xA0, "00000003-00000002-1", "sluice_snap_ab12",
                                  (SnapshotSplit("public.t", "id < 500", 500),), 1)
    assert offset.in_snapshot and not ChangeOffset.from_json({"lsn": "0/0"}).in_snapshot


def test_an_unmoved_position_hands_spark_back_its_own_start_and_a_moved_one_the_new_form():
    start = ChangeOffset.from_json({"lsn": "0/10"})  # as an older checkpoint holds it
    assert ChangeOffset(0x10).json_or(start) is start.raw, "same position: Spark's own offset, no empty batch"
    assert ChangeOffset(0x20).json_or(start) == {"v": 1, "lsn": "0/20"}


def test_an_offset_of_another_version_is_refused_with_what_to_do():
    with pytest.raises(SluiceError, match=r"version 2.*reads version 1.*new checkpoint"):
        ChangeOffset.from_json({"v": 2, "lsn": "0/10"})


def test_an_offset_inside_the_snapshot_names_the_shared_snapshot_and_one_after_it_refuses_to():
    inside = ChangeOffset(0x1A2B3C, "00000003-0000001B-1", "sluice_snap_x")
    shared = inside.shared_snapshot()
    assert (shared.snapshot_id, shared.channel, shared.lsn) == ("00000003-0000001B-1", "sluice_snap_x", "0/1A2B3C")
    with pytest.raises(AssertionError, match="not an offset inside the snapshot"):
        ChangeOffset(0x1A2B3C).shared_snapshot()
