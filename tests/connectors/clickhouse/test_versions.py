"""ClickHouse versions: servers older than 23.3 are refused by name; types are parsed as every version spells them."""

import re
import subprocess

import pytest

import sluice
from sluice.connectors.clickhouse._table import MINIMUM_VERSION
from sluice.connectors.clickhouse._types import parse_type, read_type
from sluice.testing import LocalClickHouse
from sluice.testing._clickhouse import find_server

pytestmark = pytest.mark.spark


def needs_an_old_server(binary: str, version: str | None) -> None:
    """Fail, saying what the test needs, unless `version` is older than the oldest sluice supports (None: unknown
    yet). The test refuses a server only when the machine's binary is an old one; with a newer binary it would
    show nothing, so it must not pass."""
    oldest = ".".join(map(str, MINIMUM_VERSION))
    if version is not None and tuple(int(part) for part in version.split(".")[:2]) >= MINIMUM_VERSION:
        pytest.fail(f"this test needs a ClickHouse server older than {oldest} (Debian bookworm's clickhouse-server "
                    f"18.16: apt-get install -y clickhouse-server); {binary} is {version}, which sluice supports")


def test_a_server_older_than_23_3_is_refused_naming_its_version(spark):
    binary = find_server()  # the binary LocalClickHouse runs
    # Current binaries say their version; 18.16's has no --version ("Unknown option specified"): its server says it.
    said = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    stated = re.search(r"version (\d+\.\d+[.\d]*)", said.stdout + said.stderr)
    needs_an_old_server(binary, stated.group(1).rstrip(".") if stated else None)
    with LocalClickHouse() as old:
        version = old.rows("SELECT version()")[0][0]
        needs_an_old_server(binary, version)
        old.sql("CREATE TABLE t (id Int64) ENGINE = MergeTree() ORDER BY id")
        opts = {"url": old.url, "table": "t", "password": old.password}
        refused = (rf"ClickHouse {re.escape(version)} at http://127\.0\.0\.1:\d+ is older than 23\.3, the oldest "
                   r"version sluice supports .* Upgrade the server")
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
