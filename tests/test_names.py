"""The SDK's refusals of names a store lacks (sluice._names): the case hint, the option's refusal and the DataFrame
columns' check, as connectors call them through sluice.connector. No store."""

import pytest

from sluice.connector import OptionError, case_hint, check_dataframe_columns, check_option_columns, require_name


def test_the_case_hint_names_the_spelling_that_differs_only_in_case():
    assert case_hint("name", ["id", "Name"]) == " (the table has 'Name': names are case-sensitive)"
    assert case_hint("events", ["Events"], "database default") == (" (database default has 'Events': names are "
                                                                  "case-sensitive)")
    assert case_hint("sluice", ["Sluice", "other"], None) == " (did you mean 'Sluice'? names are case-sensitive)"


def test_the_case_hint_is_empty_when_no_name_differs_by_case_alone():
    assert case_hint("name", ["id", "title"]) == ""
    assert case_hint("name", []) == ""
    assert case_hint("name", ["name"]) == "", "the same name is no hint (the caller found it missing elsewhere)"


def test_require_name_passes_a_known_name_and_refuses_another_naming_option_place_and_names():
    require_name("at", {"id": "bigint", "at": "timestamp"}, "tracking.column", "table t")
    with pytest.raises(OptionError) as refused:
        require_name("AT", {"id": "bigint", "at": "timestamp"}, "tracking.column", "table t")
    assert str(refused.value) == ("tracking.column 'AT' is not a column of table t (did you mean 'at'? names are "
                                  "case-sensitive); its columns: ['id', 'at']")
    with pytest.raises(OptionError, match=r"^tracking.tie-breaker 'k' is not a field of index 'i'; its fields: "
                                          r"\['a'\]\. Add it\.$"):
        require_name("k", ["a"], "tracking.tie-breaker", "index 'i'", "field", "Add it.")
    with pytest.raises(OptionError, match=r"^tracking.column 'a' is not a field of index 'i' \(the mapping has 'A': "):
        require_name("a", ["A"], "tracking.column", "index 'i'", "field", where="the mapping")


def test_dataframe_columns_all_in_the_table_pass_and_the_first_missing_is_refused():
    check_dataframe_columns(["id", "Name"], ["id", "Name", "extra"], "db.t")
    check_dataframe_columns([], [], "db.t")
    with pytest.raises(OptionError) as refused:
        check_dataframe_columns(["id", "name", "other"], {"id": "Int64", "Name": "String"}, "db.t")
    assert str(refused.value) == ("column 'name' of the DataFrame is not in table db.t (the table has 'Name': names "
                                  "are case-sensitive); table columns: ['id', 'Name']. Drop or rename it.")
    with pytest.raises(OptionError, match=r"column 'x' of the DataFrame is not in table s\.t; table columns: "
                                          r"\['id'\]\. Drop or rename it, or add it to the table\.$"):
        check_dataframe_columns(["x"], ["id"], "s.t", "Drop or rename it, or add it to the table.")


def test_options_naming_dataframe_columns_pass_and_the_first_missing_is_refused_naming_its_option():
    names = ["id", "Op", "ts"]
    check_option_columns({"upsert.op-column": "Op", "write.ttl-column": None, "mapping.id": ("id", "ts"),
                          "mapping.exclude": ()}, names)
    with pytest.raises(OptionError) as refused:
        check_option_columns({"write.timestamp-column": "ts", "upsert.op-column": "op"}, names)
    assert str(refused.value) == ("upsert.op-column 'op' is not a DataFrame column (the DataFrame has 'Op': names "
                                  "are case-sensitive) (columns: ['id', 'Op', 'ts']).")
    with pytest.raises(OptionError, match=r"^mapping.id 'key' is not a DataFrame column \(columns: "):
        check_option_columns({"mapping.id": ("id", "key")}, names)
