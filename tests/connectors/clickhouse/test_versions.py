"""ClickHouse versions: servers older than 23.3 are refused by name; types are parsed as every version spells them."""

import pytest

import sluice
from sluice.connectors.clickhouse._types import parse_type, read_type
from sluice.testing import LocalClickHouse

pytestmark = pytest.mark.spark


def test_a_server_older_than_23_3_is_refused_naming_its_version(spark):
    with LocalClickHouse() as old:  # Debian bookworm's clickhouse-server: 18.16, from 2018
        old.sql("CREATE TABLE t (id Int64) ENGINE = MergeTree() ORDER BY id")
        opts = {"url": old.url, "table": "t", "password": old.password}
        refused = (r"ClickHouse 18\.16\.\d+ at http://127\.0\.0\.1:\d+ is older than 23\.3, the oldest version sluice "
                   r"supports .* Upgrade the server")
        with pytest.raises(Exception, match=refused):
            sluice.write(spark.range(3), "clickhouse", opts)
        with pytest.raises(Exception, match=refused):
            spark.read.format("clickhouse").options(**opts).load().collect()
        assert old.rows("SELECT count() FROM t") == [["0"]]


@pytest.mark.parametrize(("spelled", "read_as"), [
    ("Nullable(Decimal(9, 2))", "Nullable(Decimal(9, 2))"),
    ("Decimal256(10)", "String"),
    ("LowCardinality(Nullable(String))", "Nullable(String)"),
    ("Array(Tuple(a Nullable(UInt32), `b c` LowCardinality(String)))",
     "Array(Tuple(`a` Nullable(Int64), `b c` String))"),
    ("Map(String, Array(UInt64))", "Map(String, Array(Decimal(20, 0)))"),
    ("Tuple(Int32, DateTime('Europe/Berlin'))", "Tuple(`_1` Int32, `_2` DateTime64(6, 'UTC'))"),
    ("Enum8('red' = 1, 'it\\'s' = -2)", "String"),
    ("SimpleAggregateFunction(sum, UInt64)", "Decimal(20, 0)"),
    ("JSON(max_dynamic_paths = 10, a.b UInt32, SKIP c)", "String"),
    ("Date", "Date32"),
])
def test_types_are_parsed_as_system_columns_spells_them_and_read_as_spark_takes_them(spelled, read_as):
    parsed = parse_type(spelled)
    assert str(read_type(parsed)) == read_as
    assert parse_type(str(parsed)) == parsed  # what sluice writes into SQL parses back to the same type
