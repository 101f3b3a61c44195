"""The split framework without Spark: cutting, packing small ranges into tasks, fair row budgets, AvailableNow and
discovery."""

from sluice.source import Split, SplitGroup, SplitPartition, SplitStreamReader, cut, pack, tasks
from sluice.spark._compat import ReadAllAvailable, ReadMaxRows
from tests.source.helpers import ListEnumerator, NoReader


def stream(ends, max_records=None):
    return SplitStreamReader(ListEnumerator(ends), NoReader(), None, max_records, None)


def test_cut_covers_the_range_exactly_once():
    parts = cut(Split("s"), 5, 27, 10)
    assert [(p.start, p.end) for p in parts] == [(5, 15), (15, 25), (25, 27)]
    assert cut(Split("s"), 5, 5, 10) == []
    assert [(p.start, p.end) for p in cut(Split("s"), 0, 100, None)] == [(0, 100)]


def test_small_ranges_are_packed_into_tasks_and_large_ones_stay_alone():
    parts = [SplitPartition(Split(f"t-{i:02d}"), 0, n) for i, n in enumerate([40, 40, 30, 250, 10, 100, 5])]
    packed = pack(parts, 100)
    shapes = [[(p.split.split_id, p.end) for p in t.parts] if isinstance(t, SplitGroup) else (t.split.split_id, t.end)
              for t in packed]
    assert shapes == [[("t-00", 40), ("t-01", 40)], ("t-03", 250), ("t-05", 100),
                      [("t-02", 30), ("t-04", 10), ("t-06", 5)]]
    assert pack(list(reversed(parts)), 100) == packed  # the same ranges, the same tasks (a replayed micro-batch)
    assert pack(parts, None) == parts and pack(parts, 0) == parts  # off: a task per range
    # A range cut for parallel reads (max-records-per-partition) keeps its pieces apart; whole ones are packed.
    planned = tasks([(Split("a"), 0, 250), (Split("b"), 0, 10), (Split("c"), 0, 10)], 100, 1000)
    assert [(t.split.split_id, t.start) for t in planned[:3]] == [("a", 0), ("a", 100), ("a", 200)]
    assert [p.split.split_id for p in planned[3].parts] == ["b", "c"] and len(planned) == 4


def test_row_budget_is_shared_fairly_and_unused_shares_go_around():
    reader = stream({"a": 1000, "b": 3, "c": 1000}, max_records=100)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    taken = {k: end["splits"][k] - start["splits"][k] for k in "abc"}
    assert sum(taken.values()) == 100 and taken["b"] == 3 and abs(taken["a"] - taken["c"]) <= 1


def test_read_all_available_ignores_the_option_limit():
    reader = stream({"a": 500}, max_records=10)
    assert reader.latestOffset(reader.initialOffset(), ReadAllAvailable()) == {"v": 2, "splits": {"a": 500}, "runs": {}}


def test_available_now_never_goes_past_the_target_and_new_splits_start_at_zero():
    ends = {"a": 50}
    reader = stream(ends)
    offset = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    ends["a"] = 80  # arrives after the query started
    ends["b"] = 7  # a new split, too
    assert reader.latestOffset(offset, ReadMaxRows(1000)) == {"v": 2, "splits": {"a": 50}, "runs": {}}
    plain = stream({"a": 50})
    first = plain.latestOffset(plain.initialOffset(), ReadAllAvailable())
    plain.enumerator.ends["b"] = 7
    second = plain.latestOffset(first, ReadAllAvailable())
    assert second == {"v": 2, "splits": {"a": 50, "b": 7}, "runs": {}}
    parts = plain.partitions(first, second)
    assert [(p.split.split_id, p.start, p.end) for p in parts] == [("b", 0, 7)]
    assert [(p.split.split_id, p.start, p.end) for p in plain.partitions(first, second)] == \
        [("b", 0, 7)]  # replaying the same offsets plans the same partitions


def test_an_enumerator_implements_one_of_each_pair_of_position_methods_and_gets_the_other():
    import pytest

    from sluice.source import SplitEnumerator

    class Batched(SplitEnumerator):  # asks its store once for many splits
        def discover(self):
            return [Split("a"), Split("b")]

        def start_positions(self, splits):
            return {s.split_id: 1 for s in splits}

        def end_positions(self, splits, starts=None):
            return {s.split_id: 10 for s in splits}

    batched = Batched()
    assert (batched.start_position(Split("a")), batched.end_position(Split("b"))) == (1, 10)
    assert ListEnumerator({"a": 7}).end_positions([Split("a")]) == {"a": 7}  # one at a time, made into many
    with pytest.raises(TypeError, match=r"Neither must implement end_position\(\) or end_positions\(\)"):
        class Neither(SplitEnumerator):  # would recurse between the two forever
            def discover(self):
                return []

            def start_position(self, split):
                return 0


def test_a_committed_micro_batch_reports_each_splits_records_behind_and_their_sum():
    """The framework's driver side tells a metrics collector, per split, where the commit stands against the head
    the last planning saw (a split source gets it without code of its own); its read tasks name their split."""
    import time

    import pyarrow as pa

    import sluice.metrics
    from sluice.metrics import SplitLag
    from sluice.metrics._reads import ReadObserver

    class StampedReader(NoReader):
        def read(self, split, start, end):
            yield pa.record_batch({"timestamp": pa.array([int(time.time() * 1000) - 60_000], pa.timestamp("ms"))})

    ends = {"a": 100, "b": 10}
    with sluice.metrics.serve() as server:
        reader = SplitStreamReader(ListEnumerator(ends), StampedReader(), None, 40, None, source=("fmt", "two splits"),
                                   reads=ReadObserver.on_driver("fmt", event_time="timestamp"))
        first = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())  # a: 30, b: 10
        reader.commit(first)
        for partition in reader.partitions(reader.initialOffset(), first):
            list(reader.read(partition))
        [report] = server.sources.snapshot()
        lags = server.reads.split_lags()
    assert report.splits == (SplitLag("a", 30, 100, 70), SplitLag("b", 10, 10, 0))
    assert report.pending_records == 70  # the total, as before
    assert [lag.split for lag in lags] == ["a", "b"] and all(60_000 <= lag.lag_ms < 120_000 for lag in lags)


class CountingEnumerator(ListEnumerator):
    """Counts where a new split's position is asked (a Kafka enumerator makes an admin request for each)."""

    def __init__(self, ends):
        super().__init__(ends)
        self.asked = []

    def new_split_position(self, split):
        self.asked.append(split.split_id)
        return 0


def test_planning_asks_a_new_splits_position_only_for_the_splits_the_start_lacks():
    ends = {f"p{i}": 10 for i in range(50)}
    reader = SplitStreamReader(CountingEnumerator(ends), NoReader(), None, None, None)
    first = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    reader.partitions(reader.initialOffset(), first)
    assert reader.enumerator.asked == []  # every split is in the start: nothing to ask, at 50 splits as at 1
    ends["new"] = 4
    second = reader.latestOffset(first, ReadAllAvailable())
    reader.partitions(first, second)
    # The one split found since: asked when the end is planned and when its range is (each planning on its own).
    assert reader.enumerator.asked == ["new", "new"]
