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
