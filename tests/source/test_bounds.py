"""A bounded read's check of its splits' bounds (sluice.source._bounds), as Kafka and S2 call it. No store."""

import pytest

from sluice.connector import OptionError, forward_bounds


def test_bounds_in_order_come_back_as_pairs():
    assert forward_bounds({"t-0": [0, 10], "t-1": [5, 5]}, "the start is after the end in {}", "Check.") == {
        "t-0": (0, 10), "t-1": (5, 5)}
    assert forward_bounds({}, "{}", "") == {}


def test_a_start_after_its_end_is_refused_naming_every_such_split_in_order():
    with pytest.raises(OptionError) as refused:
        forward_bounds({"t-1": [9, 3], "t-0": [4, 2], "t-2": [0, 1]}, "the start is after the end in partition(s) {}",
                       "Check startingOffsets and endingOffsets.")
    assert str(refused.value) == ("the start is after the end in partition(s) t-0 (4 > 2), t-1 (9 > 3): the read "
                                  "would return nothing. Check startingOffsets and endingOffsets.")
