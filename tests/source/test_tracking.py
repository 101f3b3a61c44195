"""The tracking-column stream's own parts, without a store: its offset's JSON and refusals, start values, and the
lag window's choice of the head to read to (on a clock the test moves), a range's tasks."""

import pytest

from sluice import OptionError
from sluice._errors import SluiceError
from sluice.source._framework import Split
from sluice.source._tracking import (
    BEGINNING,
    LagWindow,
    TrackingEnumerator,
    TrackingOffset,
    TrackingPosition,
    TrackingStreamReader,
    parse_value,
)
from sluice.source._tracking_options import TrackingSettings


def test_the_offset_round_trips_as_versioned_json_and_refuses_another_version_or_column():
    offset = TrackingOffset("at", "timestamp", {"all": TrackingPosition(1_795_867_200_000_001, ("4711", "eu")),
                                                "b": BEGINNING, "c": TrackingPosition(5, None)})
    raw = offset.to_json()
    assert raw == {"v": 1, "column": "at", "kind": "timestamp",
                   "splits": {"all": {"value": 1_795_867_200_000_001, "key": ["4711", "eu"]},
                              "b": {"value": None, "key": None}, "c": {"value": 5, "key": None}}}
    back = TrackingOffset.from_json(raw, "postgres", "at", "timestamp")
    assert back == offset and back.json_or(back) is raw, "an unmoved offset goes back to Spark exactly as it came"
    with pytest.raises(SluiceError, match="offset of version 2"):
        TrackingOffset.from_json({**raw, "v": 2}, "postgres", "at", "timestamp")
    with pytest.raises(OptionError, match=r"tracks column .at. \(timestamp\), this query tracking.column .id."):
        TrackingOffset.from_json(raw, "postgres", "id", "int")


def test_start_values_parse_by_the_columns_kind_and_bad_ones_name_the_option():
    assert parse_value("int", "42", "tracking.start") == 42
    assert parse_value("timestamp", "1970-01-01T00:00:01.000002", "tracking.start") == 1_000_002  # UTC, no zone
    assert parse_value("timestamp", "1970-01-01T02:00:00+02:00", "tracking.start") == 0
    assert TrackingPosition(1_000_002).describe("timestamp") == "1970-01-01T00:00:01.000002+00:00"
    with pytest.raises(OptionError, match=r"option .tracking.start. must be beginning, now or a whole number"):
        parse_value("int", "2026-01-01", "tracking.start")


def test_the_window_reads_to_the_newest_head_seen_at_least_a_window_ago():
    now = [100.0]
    window = LagWindow(5.0, clock=lambda: now[0])
    assert not window.seen_any() and window.settled("all") is None
    first, second, third = (TrackingPosition(v, ()) for v in (10, 20, 30))
    window.observe({"all": first})
    now[0] = 103.0
    window.observe({"all": second})
    assert window.settled("all") is None, "nothing has been seen for a whole window yet"
    now[0] = 104.0
    window.observe({"all": second})  # the same head again: its first sighting (103) counts
    now[0] = 105.0
    assert window.settled("all") == first
    now[0] = 107.9
    window.observe({"all": third})
    assert window.settled("all") == first, "the second head has been seen for 4.9 s only"
    now[0] = 108.0
    assert window.settled("all") == second
    now[0] = 113.0
    assert window.settled("all") == third
    no_window = LagWindow(0.0, clock=lambda: now[0])
    no_window.observe({"all": first})
    assert no_window.settled("all") == first, "window 0: the head just seen (the naive poller)"


class Listed(TrackingEnumerator):
    """An in-process enumerator over a list of integer values (the mechanism's own test, not a store)."""

    column, kind = "n", "int"

    def __init__(self, values, pieces=1):
        self.values, self.slices = sorted(values), pieces

    def heads(self, splits):
        return {s.split_id: TrackingPosition(self.values[-1], ()) for s in splits}

    def end_within(self, split, after, upto, rows):
        within = [v for v in self.values if (after.value is None or v > after.value) and v <= upto.value]
        if not within:
            return None
        return TrackingPosition(within[min(len(within), rows or len(within)) - 1], ())

    def pieces(self, split):
        return [Split(split.split_id, {"piece": i}) for i in range(self.slices)] if self.slices > 1 else [split]


def test_a_range_is_planned_as_a_task_per_cut_and_per_piece_of_the_split_each_with_the_whole_cut():
    settings = TrackingSettings("n", 0, "beginning", None, rows_per_task=2)
    plain = TrackingStreamReader(Listed([1, 2, 3, 4, 5]), None, settings, source=("test", "t"))
    start = plain.initialOffset()
    end = plain.latestOffset(start, plain.getDefaultReadLimit())
    assert [(p.after.value, p.upto.value) for p in plain.partitions(start, end)] == [(None, 2), (2, 4), (4, 5)]
    sliced = TrackingStreamReader(Listed([1, 2, 3, 4, 5], pieces=3), None, settings, source=("test", "t"))
    parts = sliced.partitions(start, end)
    assert [(p.split.info["piece"], p.after.value, p.upto.value) for p in parts] == [
        (piece, after, upto) for after, upto in [(None, 2), (2, 4), (4, 5)] for piece in range(3)]
    assert {p.split.split_id for p in parts} == {"all"}, "positions stay the split's"
