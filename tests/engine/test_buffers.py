import numpy as np

from sluice.engine import (
    Chunk,
    DequeRequestBuffer,
    KeyedRequestBuffer,
    PartitionKeyBatchCreator,
    RequestInfo,
    SimpleBatchCreator,
)


def info(batch_size=10, max_bytes=1000, now=0.0, busy=()):
    return RequestInfo(batch_size, max_bytes, now, frozenset(busy))


def test_deque_buffer_per_entry_api_keeps_fifo_and_prioritized_head():
    buf = DequeRequestBuffer()
    buf.add("a", 1)
    buf.add("b", 2)
    buf.add("z", 5, prioritize=True)
    assert buf.size() == 3 and buf.total_size_bytes() == 8
    assert buf.peek() == ("z", 5)
    assert [buf.poll(), buf.poll(), buf.poll(), buf.poll()] == [("z", 5), ("a", 1), ("b", 2), None]
    assert buf.is_empty() and buf.total_size_bytes() == 0


def test_simple_batch_creator_respects_record_and_byte_limits_across_chunks():
    buf = DequeRequestBuffer()
    buf.add_chunk(Chunk(list("abcde"), [10] * 5))
    buf.add_chunk(Chunk(list("fgh"), [10] * 3))
    creator = SimpleBatchCreator()
    first = creator.create_next_batch(info(batch_size=7, max_bytes=1000), buf)
    assert first.entries == list("abcdefg") and first.size_bytes == 70 and first.record_count == 7
    second = creator.create_next_batch(info(batch_size=7, max_bytes=15), buf)
    assert second.entries == ["h"]
    assert creator.create_next_batch(info(), buf) is None


def test_byte_limit_cuts_inside_a_chunk_and_an_oversized_entry_goes_alone():
    buf = DequeRequestBuffer()
    buf.add_chunk(Chunk(["big", "s1", "s2"], [500, 40, 40]))
    creator = SimpleBatchCreator()
    assert creator.create_next_batch(info(max_bytes=100), buf).entries == ["big"]
    assert creator.create_next_batch(info(max_bytes=60), buf).entries == ["s1"]
    assert buf.buffered_state() == [("s2", 40)]


def test_retry_chunk_waits_for_its_backoff_and_is_not_mixed_with_fresh_entries():
    buf = DequeRequestBuffer()
    buf.add_chunk(Chunk(["new"], [1]))
    buf.add_chunk(Chunk(["old1", "old2"], [1, 1], attempt=1, ready_at=5.0), prioritize=True)
    creator = SimpleBatchCreator()
    assert creator.create_next_batch(info(now=1.0), buf) is None  # head not ready: order is kept
    assert creator.next_ready_at(info(now=1.0), buf) == 5.0
    retry = creator.create_next_batch(info(now=5.0), buf)
    assert retry.entries == ["old1", "old2"] and retry.attempt == 1
    assert creator.create_next_batch(info(now=5.0), buf).entries == ["new"]


def test_partition_key_creator_never_mixes_keys_and_skips_busy_keys():
    buf = KeyedRequestBuffer()
    buf.add_chunk(Chunk(["a1", "a2"], [1, 1], key="a"))
    buf.add_chunk(Chunk(["b1"], [1], key="b"))
    buf.add_chunk(Chunk(["a3"], [1], key="a"))
    creator = PartitionKeyBatchCreator()
    first = creator.create_next_batch(info(busy={"a"}), buf)
    assert first.partition_key == "b" and first.entries == ["b1"]
    second = creator.create_next_batch(info(), buf)
    assert second.partition_key == "a" and second.entries == ["a1", "a2", "a3"]
    assert buf.size() == 0 and creator.create_next_batch(info(), buf) is None


def test_keyed_buffer_accounting_and_state():
    buf = KeyedRequestBuffer()
    buf.add("x", 3, key=1)
    buf.add("y", 4, key=2)
    buf.add("w", 2, key=1, prioritize=True)
    assert buf.size() == 3 and buf.total_size_bytes() == 9
    assert buf.buffered_state() == [("w", 2), ("x", 3), ("y", 4)]


def test_keyed_buffer_finds_the_fullest_key_through_its_index_after_any_adds_and_takes():
    import random

    rng = random.Random(7)
    buf = KeyedRequestBuffer()
    model: dict[int, int] = {}
    for step in range(3000):
        key = rng.randrange(40)
        if rng.random() < 0.6:
            n = rng.randrange(1, 5)
            buf.add_chunk(Chunk([(key, step)] * n, [1] * n, key=key), prioritize=rng.random() < 0.1)
            model[key] = model.get(key, 0) + n
        elif model.get(key):
            taken = buf.take(rng.randrange(1, 6), 1 << 30, 0.0, key)
            model[key] -= len(taken.entries)
            if not model[key]:
                del model[key]
        order = list(buf.fullest_keys())
        assert sorted(order) == sorted(model), "the index lost or kept a key"
        sizes = [model[k] for k in order]
        assert sizes == sorted(sizes, reverse=True), "fullest_keys is not ordered by entries held"
        assert buf.size() == sum(model.values())


def test_partition_key_creator_cuts_only_full_batches_when_partial_is_not_allowed():
    buf = KeyedRequestBuffer()
    buf.add_chunk(Chunk(["a1", "a2"], [1, 1], key="a"))
    buf.add_chunk(Chunk(["b1"], [300], key="b"))
    creator = PartitionKeyBatchCreator()
    held = RequestInfo(3, 300, 0.0, partial=False)
    assert creator.create_next_batch(held, buf) is None  # "a" holds 2 of 3 records, 2 of 300 bytes
    buf.add_chunk(Chunk(["a3"], [1], key="a"))
    assert creator.create_next_batch(held, buf).entries == ["a1", "a2", "a3"]
    assert creator.create_next_batch(held, buf).entries == ["b1"]  # full by bytes


def test_records_given_without_a_key_are_batched_under_the_key_none():
    """A chunk without a key (a dead-letter writer's, into an HBase or Cassandra target) is cut like any key's: the
    creator once took None for "no key found", and the task's flush waited for it without end."""
    buf = KeyedRequestBuffer()
    buf.add_chunk(Chunk(["d1", "d2"], [1, 1], key=None))
    assert PartitionKeyBatchCreator().create_next_batch(info(), buf).entries == ["d1", "d2"]
    assert buf.size() == 0


def test_retry_backoff_is_found_among_delayed_keys_only():
    buf = KeyedRequestBuffer()
    buf.add_chunk(Chunk(["x"], [1], key="fresh"))
    buf.add_chunk(Chunk(["r"], [1], key="retried", attempt=1, ready_at=9.0), prioritize=True)
    creator = PartitionKeyBatchCreator()
    assert buf.delayed_keys() == ["retried"]
    assert creator.next_ready_at(info(now=1.0), buf) == 9.0
    assert creator.create_next_batch(info(now=1.0), buf).entries == ["x"]
    assert creator.create_next_batch(info(now=9.0), buf).entries == ["r"]
    assert buf.delayed_keys() == [] and buf.size() == 0


def test_row_number_ranges_and_size_arrays_are_cut_like_lists():
    """Entries as a range and sizes as a numpy array (what ArrowRows gives) make the same batches as lists do, by
    records and by bytes, across chunks; consecutive ranges stay one range, arrays stay arrays."""
    import numpy as np

    def cut(entries_kind, sizes_kind):
        buf = DequeRequestBuffer()
        buf.add_chunk(Chunk(entries_kind(range(0, 5)), sizes_kind([10, 20, 30, 40, 50])))
        buf.add_chunk(Chunk(entries_kind(range(5, 8)), sizes_kind([10, 10, 500])))
        creator, out = SimpleBatchCreator(), []
        for batch_size, max_bytes in [(3, 1000), (4, 1000), (10, 25), (10, 1000), (10, 10)]:
            batch = creator.create_next_batch(info(batch_size=batch_size, max_bytes=max_bytes), buf)
            out.append(None if batch is None else (list(batch.entries), [int(s) for s in batch.sizes],
                                                   batch.size_bytes, type(batch.size_bytes)))
        return out, buf.size(), buf.total_size_bytes()

    as_lists = cut(list, list)
    assert as_lists == ([([0, 1, 2], [10, 20, 30], 60, int), ([3, 4, 5, 6], [40, 50, 10, 10], 110, int),
                         ([7], [500], 500, int), None, None], 0, 0)
    assert cut(lambda r: r, lambda s: np.array(s, dtype=np.int64)) == as_lists

    buf = DequeRequestBuffer()
    buf.add_chunk(Chunk(range(0, 4), np.full(4, 7, dtype=np.int64)))
    buf.add_chunk(Chunk(range(4, 8), np.full(4, 7, dtype=np.int64)))
    batch = SimpleBatchCreator().create_next_batch(info(batch_size=6), buf)
    assert batch.entries == range(0, 6) and isinstance(batch.sizes, np.ndarray) and batch.size_bytes == 42
    assert buf.buffered_state() == [(6, 7), (7, 7)] and buf.total_size_bytes() == 14


class CountedSizes(np.ndarray):
    """Sizes that count their running sums (cumsum: a pass over every entry)."""

    running_sums = 0

    def cumsum(self, *args, **kwargs):
        CountedSizes.running_sums += 1
        return super().cumsum(*args, **kwargs)


def test_a_run_of_full_batches_is_what_take_cuts_and_a_chunk_cut_whole_never_sums_every_entry():
    sizes = np.arange(1, 2001, dtype=np.int64)
    cut, taken = DequeRequestBuffer(), DequeRequestBuffer()
    CountedSizes.running_sums = 0
    for buf in (cut, taken):
        buf.add_chunk(Chunk(range(0, 2000), sizes.view(CountedSizes)))
        buf.add_chunk(Chunk(range(2000, 2700), np.full(700, 7, dtype=np.int64)))
    chunk, run = cut.full_run(500, 1 << 40, 0.0)
    assert CountedSizes.running_sums == 0, "cutting a chunk into whole batches made the running sums of its entries"
    assert len(run) == 4 and chunk.entries == range(0, 2000)
    cut.take_run(3, 500, sum(run[:3]))  # the caller sent three of the four
    expected = [taken.take(500, 1 << 40, 0.0) for _ in range(3)]
    assert run[:3] == [t.size_bytes for t in expected]
    assert (cut.size(), cut.total_size_bytes()) == (taken.size(), taken.total_size_bytes()) == (1200, 4900 + sum(
        range(1501, 2001)))
    assert cut.take(1000, 1 << 40, 0.0).entries == taken.take(1000, 1 << 40, 0.0).entries == range(1500, 2500)
    # over the byte limit, a run stops before the batch take would cut smaller
    assert cut.full_run(100, 699, 0.0) is None and cut.full_run(100, 700, 0.0)[1] == [700, 700]


class SummedSizes(np.ndarray):
    """Sizes that count the passes summing them (sum, cumsum, and a reshaped view's sum)."""

    passes = 0

    def sum(self, *args, **kwargs):
        SummedSizes.passes += 1
        return super().sum(*args, **kwargs)

    def cumsum(self, *args, **kwargs):
        SummedSizes.passes += 1
        return super().cumsum(*args, **kwargs)


def test_a_chunk_handed_its_running_sums_cuts_what_one_without_cuts_and_never_sums_its_sizes():
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 300, 3000).astype(np.int64)
    cuts = []
    for running in (None, sizes.cumsum()):
        SummedSizes.passes = 0
        buf = DequeRequestBuffer()
        buf.add_chunk(Chunk(range(0, 3000), sizes.view(SummedSizes), running=running))
        out = [buf.full_run(500, 1 << 40, 0.0)[1]]
        buf.take_run(2, 500, sum(out[0][:2]))
        out.append((buf.size(), buf.total_size_bytes()))
        while buf.size():  # batches of up to 400 entries and 30,000 bytes: cut inside the chunk by bytes
            taken = buf.take(400, 30_000, 0.0)
            out.append((taken.entries, taken.size_bytes))
        cuts.append((out, SummedSizes.passes))
    (without, passes_without), (handed, passes_handed) = cuts
    assert handed == without
    assert passes_without > 0 and passes_handed == 0, (passes_without, passes_handed)
