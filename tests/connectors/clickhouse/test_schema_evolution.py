"""schema.evolution on the ClickHouse sink: add-columns adds a DataFrame column the table lacks before any row of the
write is sent, typed from the Spark type; none (the default) refuses it by name, and a type clash is refused either
way."""

import pytest

import sluice

pytestmark = pytest.mark.spark


def test_add_columns_adds_the_missing_columns_and_none_refuses_them_naming_column_and_option(spark, ch):
    table = ch.table("id Int64, v String")
    sluice.write(spark.createDataFrame([(1, "a")], "id long, v string"), "clickhouse", ch.opts(table))
    wider = spark.createDataFrame([(2, "b", 7, [1.5])], "id long, v string, extra int, scores array<double>")
    # The negative control: without the option the write is refused before any row, naming the column and option.
    with pytest.raises(Exception, match=r"column 'extra' of the DataFrame is not in table default\.\S+; table "
                                        r"columns: \['id', 'v'\]\. .*set schema\.evolution=add-columns"):
        sluice.write(wider, "clickhouse", ch.opts(table))
    assert ch.rows(f"SELECT count() FROM {table}") == [["1"]]

    evolving = ch.opts(table, **{"schema.evolution": "add-columns"})
    sluice.write(wider, "clickhouse", evolving)
    assert ch.rows(f"SELECT name, type FROM system.columns WHERE database = 'default' AND table = '{table}' "
                   "ORDER BY position") == [["id", "Int64"], ["v", "String"], ["extra", "Nullable(Int32)"],
                                            ["scores", "Array(Nullable(Float64))"]]
    assert ch.rows(f"SELECT id, v, isNull(extra), ifNull(extra, 0), scores FROM {table} ORDER BY id") == [
        ["1", "a", "1", "0", "[]"], ["2", "b", "0", "7", "[1.5]"]]
    # A type clash with a column the table has is not evolution: refused by name as ever.
    with pytest.raises(Exception, match=r"column 'extra' is string in the DataFrame but Nullable\(Int32\) in the "
                                        r"table; cast it first"):
        sluice.write(spark.createDataFrame([(3, "c", "x")], "id long, v string, extra string"), "clickhouse", evolving)
    assert ch.rows(f"SELECT count() FROM {table}") == [["2"]]
