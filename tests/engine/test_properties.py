"""Property: whatever the store does (fail, throttle, delay), no entry is lost and each mode's order holds."""

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.engine import AsyncSinkWriter, SinkConfig
from sluice.testing import FlakyStore

workloads = st.fixed_dictionaries({
    "keys": st.lists(st.integers(0, 6), min_size=1, max_size=300),
    "chunk": st.integers(1, 40),
    "batch": st.integers(1, 20),
    "buffered_extra": st.integers(1, 50),
    "inflight": st.integers(1, 8),
    "parallelism": st.integers(1, 5),
    "fail": st.floats(0, 0.3),
    "throttle": st.floats(0, 0.2),
    "seed": st.integers(0, 2**16),
    "max_bytes": st.integers(3, 200),
})


def run(mode: str, w: dict, **extra):
    entries = [(key, seq) for seq, key in enumerate(w["keys"])]
    store = FlakyStore(fail_rate=w["fail"], throttle_rate=w["throttle"], max_delay_s=0.002, seed=w["seed"])
    config = SinkConfig(
        mode=mode, batch_max_size=w["batch"], requests_max_buffered=w["batch"] + w["buffered_extra"],
        requests_max_inflight=w["inflight"], parallelism=w["parallelism"], max_retries=100, retry_delay_ms=0,
        flush_buffer_timeout=5, flush_buffer_size=w["max_bytes"], **extra,
    )
    with AsyncSinkWriter(store, config) as writer:
        for start in range(0, len(entries), w["chunk"]):
            part = entries[start:start + w["chunk"]]
            writer.write_keyed(part, [3] * len(part), [k % w["parallelism"] for k, _ in part])
        writer.finish()
    return entries, store, writer


def per_key(seq):
    out = defaultdict(list)
    for key, n in seq:
        out[key].append(n)
    return out


common = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@common
@given(workloads)
def test_unordered_loses_nothing(w):
    entries, store, writer = run("unordered", w)
    assert sorted(store.accepted_entries()) == sorted(entries)
    assert writer.stats.records == len(entries)
    assert all(b.size_bytes <= max(w["max_bytes"], 3) and b.record_count <= w["batch"] for b in store.submitted)


@common
@given(workloads, st.booleans())
def test_partition_ordered_keeps_per_key_order_and_never_mixes_keys(w, hold):
    entries, store, _writer = run("partition-ordered", w, flush_on_checkpoint=hold)
    accepted = store.accepted_entries()
    assert sorted(accepted) == sorted(entries)
    assert per_key(accepted) == per_key(entries)
    for batch in store.submitted:
        assert len({key % w["parallelism"] for key, _ in batch.entries}) == 1, "a batch mixed partition keys"
    assert store.violations == []


@common
@given(workloads)
def test_global_ordered_keeps_total_order(w):
    entries, store, _writer = run("global-ordered", w)
    assert store.accepted_entries() == entries
    assert store.max_inflight_seen == 1
