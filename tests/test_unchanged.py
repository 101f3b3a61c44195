"""upsert.unchanged-column's shared parts (sluice/_unchanged.py) on Arrow alone: the option's checks, which rows name
a column, a refusal for sinks that cannot keep a value, and the fill of a commit's rows of one key."""

import pyarrow as pa
import pytest

from sluice import OptionError
from sluice._errors import RecordError
from sluice.connector import check_unchanged_column, fill_unchanged, marked_rows, refuse_unchanged

MARKS = pa.list_(pa.string())


def test_the_option_names_a_list_of_strings_column_and_needs_a_key():
    schema = pa.schema([("id", pa.int64()), ("_unchanged", MARKS), ("s", pa.string())])
    check_unchanged_column(schema, "_unchanged", ["id"])
    with pytest.raises(OptionError, match=r"'nope' is not in the DataFrame"):
        check_unchanged_column(schema, "nope", ["id"])
    with pytest.raises(OptionError, match=r"'s' is string; it must be a list of column names"):
        check_unchanged_column(schema, "s", ["id"])
    with pytest.raises(OptionError, match=r"needs primary-key"):
        check_unchanged_column(schema, "_unchanged", [])


def test_a_later_row_that_leaves_a_column_unchanged_takes_the_value_an_earlier_row_of_its_key_set():
    rows = pa.table({"id": [1, 2, 1, 1, 3], "doc": ["A", "B", None, None, None],
                     "_unchanged": pa.array([None, None, ["doc"], ["doc"], ["doc"]], MARKS), "row": [0, 1, 2, 3, 4]})
    assert marked_rows(rows["_unchanged"], "doc").tolist() == [False, False, True, True, True]
    last, keeps = fill_unchanged(rows, ["id"], "_unchanged", "row")
    assert [(r["id"], r["doc"], r[keeps["doc"]]) for r in last.to_pylist()] == [
        (2, "B", False), (1, "A", False), (3, None, True)]  # key 3: no row set it, the store keeps its value


def test_a_sink_that_cannot_keep_a_value_refuses_the_rows_naming_key_and_column():
    rows = pa.table({"id": [1, 2], "_unchanged": pa.array([None, ["doc"]], MARKS)})
    refuse_unchanged(rows.slice(0, 1), "_unchanged", ["id"], "store x", "Do y.")  # no row names one: nothing
    with pytest.raises(RecordError, match=r"store x cannot keep a stored value: the row with key \{'id': 2\} leaves "
                                          r"column\(s\) \['doc'\] unchanged .*Do y\.") as refused:
        refuse_unchanged(rows, "_unchanged", ["id"], "store x", "Do y.")
    assert refused.value.rows == [1]
