"""binary_column: a string/binary column's values as bytes entries with their byte sizes, read from the column's
buffers (offsets), so slices of a batch (Spark hands them over) and multi-byte UTF-8 must come out right."""

import numpy as np
import pyarrow as pa
import pytest

from sluice._errors import OptionError
from sluice.engine._buffer import sizes_from_running
from sluice.sink._encoding import binary_column, binary_running_sums, binary_sizes

VALUES = ["", "é", "abc" * 50, "x", "日本語"]


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
@pytest.mark.parametrize("start", [0, 1, 3])
def test_entries_are_the_values_as_bytes_and_sizes_their_byte_lengths(kind, start):
    raw = VALUES if pa.types.is_string(kind) or pa.types.is_large_string(kind) else [v.encode() for v in VALUES]
    batch = pa.RecordBatch.from_arrays([pa.array(raw, kind)], names=["body"]).slice(start, 2)
    entries, sizes = binary_column(batch, "body")
    expected = [v.encode() for v in VALUES[start:start + 2]]
    assert entries == expected
    assert sizes == [len(v) for v in expected]  # bytes, not characters: "é" is 2
    assert all(type(e) is bytes for e in entries) and all(type(s) is int for s in sizes)


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_binary_sizes_are_the_byte_lengths_of_a_slice(kind):
    raw = VALUES if pa.types.is_string(kind) or pa.types.is_large_string(kind) else [v.encode() for v in VALUES]
    batch = pa.RecordBatch.from_arrays([pa.array(raw, kind)], names=["body"]).slice(1, 3)
    assert binary_sizes(batch, "body").tolist() == [len(v.encode()) for v in VALUES[1:4]]


@pytest.mark.parametrize("kind", [pa.string(), pa.binary(), pa.large_string(), pa.large_binary()])
def test_binary_running_sums_are_the_running_sums_of_the_sizes_of_a_slice(kind):
    raw = VALUES if pa.types.is_string(kind) or pa.types.is_large_string(kind) else [v.encode() for v in VALUES]
    whole = pa.RecordBatch.from_arrays([pa.array(raw, kind)], names=["body"])
    for batch, values in ((whole, VALUES), (whole.slice(2, 3), VALUES[2:5])):  # the slice's first offset is 2
        running = binary_running_sums(batch, "body")
        assert running.tolist() == np.cumsum([len(v.encode()) for v in values]).tolist()
        assert sizes_from_running(running).tolist() == [len(v.encode()) for v in values]


def test_a_null_body_is_refused_naming_the_column():
    batch = pa.RecordBatch.from_arrays([pa.array(["a", None])], names=["payload"])
    with pytest.raises(OptionError, match="column 'payload' has 1 null"):
        binary_column(batch, "payload")
