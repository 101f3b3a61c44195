"""schema.evolution's shared part: which DataFrame columns are new to a target, or the refusal that names the option."""

import pytest

from sluice.connector import ADD_COLUMNS, OptionError, new_columns


def test_add_columns_gives_the_new_columns_in_order_and_none_refuses_the_first_naming_the_option():
    assert new_columns(["id", "b", "v", "a"], ["id", "v"], "s.t", ADD_COLUMNS) == ["b", "a"]
    assert new_columns(["id"], ["id", "v"], "s.t", "none") == []
    with pytest.raises(OptionError, match=r"^column 'b' of the DataFrame is not in table s\.t; table columns: "
                                          r"\['id', 'v'\]\. Drop or rename it, or add it to the table, or set "
                                          r"schema\.evolution=add-columns to have the sink add it\.$"):
        new_columns(["id", "b"], ["id", "v"], "s.t", "none")


def test_a_name_the_table_has_in_another_case_is_refused_even_with_add_columns():
    with pytest.raises(OptionError, match=r"column 'V' of the DataFrame is not in table s\.t \(the table has 'v': "
                                          r"names are case-sensitive\).*Rename it to the table's spelling"):
        new_columns(["id", "V"], ["id", "v"], "s.t", ADD_COLUMNS)
