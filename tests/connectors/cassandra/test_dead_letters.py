"""format("cassandra") with errors.tolerance=all on a real Cassandra 5.0: rows Cassandra cannot take go to a dead-letter
table with their reason, the others are stored; with errors.tolerance=none (the default) the same rows fail the write,
naming what is wrong."""

import json

import pytest

import sluice

pytestmark = pytest.mark.spark

TABLE = "pk text, ck int, v text, PRIMARY KEY ((pk), ck)"
ROWS = 300
NULL_KEYS = (17, 150, 299)  # a null clustering key: the encoder refuses these before anything is sent
EMPTY_KEYS = (40, 41)  # an empty partition key: the server refuses these ("Key may not be empty")


def rows(spark):
    data = [("" if i in EMPTY_KEYS else f"p{i % 30}", None if i in NULL_KEYS else i, f"v{i}") for i in range(ROWS)]
    return spark.createDataFrame(data, "pk string, ck int, v string").repartition(2)


def letters(tmp_path) -> dict[str, str]:
    return {"errors.tolerance": "all", "errors.deadletter.format": "tablestore", "errors.deadletter.table": "refused",
            "errors.deadletter.warehouse": str(tmp_path / "warehouse"),
            "errors.deadletter.meta": str(tmp_path / "meta.db")}


@pytest.mark.parametrize("grouping", ["partition", "none"])
def test_refused_rows_go_to_the_dead_letter_table_and_the_others_are_stored(spark, cass, tmp_path, grouping):
    """partition: a one-partition batch refused as a whole is split until the row is alone; none: the statement that
    failed is known (RefusedRecords), its neighbours count as stored."""
    table = cass.table(TABLE)
    sluice.write(rows(spark), "cassandra", cass.opts(table, **{"batch.grouping": grouping}, **letters(tmp_path)))
    good = {i for i in range(ROWS) if i not in NULL_KEYS + EMPTY_KEYS}
    assert {r.ck for r in cass.cql(f"SELECT ck FROM sluice.{table}")} == good
    summary = sluice.last_write_summary("cassandra")
    assert summary["dead_letters"] == 5 and summary["records"] == len(good), summary
    # Only a batch refused as a whole is split to find the row.
    assert ("split" in summary["flush_reasons"]) == (grouping == "partition"), summary

    dead = spark.read.format("tablestore").options(table="refused", warehouse=str(tmp_path / "warehouse"),
                                                    meta=str(tmp_path / "meta.db")).load().collect()
    by_v = {json.loads(d.record)["v"]: d for d in dead}
    assert sorted(by_v) == sorted(f"v{i}" for i in NULL_KEYS + EMPTY_KEYS)
    for i in NULL_KEYS:  # the user's columns, as they were
        assert json.loads(by_v[f"v{i}"].record) == {"pk": f"p{i % 30}", "ck": None, "v": f"v{i}"}
        assert "primary key column 'ck' is null" in by_v[f"v{i}"].error_message
    for i in EMPTY_KEYS:
        assert json.loads(by_v[f"v{i}"].record) == {"pk": "", "ck": i, "v": f"v{i}"}
        assert "Key may not be empty" in by_v[f"v{i}"].error_message
    assert {(d.connector, d.error_class) for d in dead} == {("cassandra", "RecordError")}
    assert all(table in d.target for d in dead)


def test_without_tolerance_the_same_rows_fail_the_write_naming_them(spark, cass):
    """The negative control: errors.tolerance=none, as by default."""
    table = cass.table(TABLE)
    with pytest.raises(Exception, match=r"primary key column 'ck' is null .*'pk': 'p\d+'.*errors\.tolerance=all"):
        sluice.write(rows(spark), "cassandra", cass.opts(table))
    no_null_keys = rows(spark).where("ck IS NOT NULL")
    with pytest.raises(Exception, match=r"Key may not be empty.*errors\.tolerance=all"):
        sluice.write(no_null_keys, "cassandra", cass.opts(table))
