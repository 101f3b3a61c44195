"""ArrowRows: engine entries (row numbers) back to Arrow rows, in entry order, across batches."""

import pyarrow as pa

from sluice.sink._encoding import ArrowRows


def test_rows_come_back_in_entry_order_even_when_they_cover_a_contiguous_range():
    rows = ArrowRows()
    first, _ = rows.add(pa.record_batch({"x": [10, 11, 12, 13]}))
    second, _ = rows.add(pa.record_batch({"x": [20, 21]}))
    assert list(first) == [0, 1, 2, 3] and list(second) == [4, 5]
    assert rows.table([0, 1, 2, 3]).column("x").to_pylist() == [10, 11, 12, 13]
    # 0..3 all present but not in order: a slice would return 10, 11, 12, 13
    assert rows.table([0, 2, 1, 3]).column("x").to_pylist() == [10, 12, 11, 13]
    assert rows.table([3, 4, 5]).column("x").to_pylist() == [13, 20, 21]
    rows.release([0, 1, 2, 3])
    assert rows.table([5, 4]).column("x").to_pylist() == [21, 20]
