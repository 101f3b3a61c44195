"""The tracking column's checks every store shares (sluice.source._tracking_column), on a store's type mapping
written here: the column and tie-breakers exist, the type maps to a kind, the tie-breaker is not the column, and
tracking.start is a value of the kind. No store."""

import pytest

from sluice.connector import OptionError, TrackingSettings, tracking_column_kind

TYPES = {"id": "bigint", "at": "timestamptz", "name": "text", "Key": "text"}
KINDS = {"bigint": "int", "timestamptz": "timestamp"}
WORKS = "a bigint or a timestamptz"


def settings(column: str, start: str = "beginning") -> TrackingSettings:
    return TrackingSettings(column, 5000, start, None)


def kind(column: str, start: str = "beginning", **more) -> str:
    return tracking_column_kind(settings(column, start), TYPES, KINDS.get, source="table t", works=WORKS, **more)


def test_a_column_of_a_type_the_store_maps_gives_its_kind():
    assert kind("id") == "int"
    assert kind("at", "2026-12-06T00:00:00Z", tie_breaker=["id", "Key"]) == "timestamp"
    assert kind("id", "42") == "int" and kind("id", "now") == "int"


def test_a_missing_column_or_tie_breaker_is_refused_with_the_case_hint_and_the_columns():
    with pytest.raises(OptionError) as refused:
        kind("key")
    assert str(refused.value) == ("tracking.column 'key' is not a column of table t (the table has 'Key': names are "
                                  "case-sensitive); its columns: ['id', 'at', 'name', 'Key']")
    with pytest.raises(OptionError, match=r"^tracking.column 'key' is not a column of the query \(the source has "
                                          r"'Key': names are case-sensitive\)"):
        tracking_column_kind(settings("key"), TYPES, KINDS.get, source="the query", works=WORKS, where="the source")
    with pytest.raises(OptionError, match=r"^tracking.tie-breaker 'nope' is not a column of table t; its columns"):
        kind("at", tie_breaker=["id", "nope"])
    with pytest.raises(OptionError, match=r"its fields: .*\. Add it\.$"):
        kind("gone", noun="field", advice="Add it.")


def test_a_type_the_store_does_not_map_is_refused_naming_the_column_its_type_and_what_works():
    with pytest.raises(OptionError) as refused:
        kind("name")
    assert str(refused.value) == ("tracking.column 'name' has type text; a tracking column must be a bigint or a "
                                  "timestamptz")

    def own_refusal(found: str) -> str:
        raise OptionError(f"the store's own words about {found}")

    with pytest.raises(OptionError, match=r"^the store's own words about bigint$"):
        tracking_column_kind(settings("id"), TYPES, own_refusal, source="table t", works=WORKS)


def test_a_tie_breaker_naming_the_column_and_a_start_not_of_its_kind_are_refused():
    with pytest.raises(OptionError, match=r"tracking.tie-breaker names the tracking column 'at' itself"):
        kind("at", tie_breaker=["id", "at"])
    with pytest.raises(OptionError, match=r"tracking.start"):
        kind("id", "2026-01-01")
    with pytest.raises(OptionError, match=r"tracking.start"):
        kind("at", "yesterday")
