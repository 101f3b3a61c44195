"""ClickHouse (23.3+) from PySpark: `format("clickhouse")` appends, upserts and deletes over HTTP; reads in splits.

    import sluice
    spark = sluice.session()
    ch = {"url": "http://127.0.0.1:8123", "table": "events", "user": "default"}   # password: option or
                                                                                  # CLICKHOUSE_PASSWORD
    events = spark.createDataFrame([(1, "eu", 9.5), (2, "us", 3.0)], "id long, region string, amount double")
    sluice.write(events, "clickhouse", ch)                      # ArrowStream INSERTs, at-least-once
    df = spark.read.format("clickhouse").options(**ch).load()   # splits by sorting-key ranges

Written only on the public connector SDK (`sluice.connector`). Guide: docs/clickhouse.md.
"""

from sluice.connectors.clickhouse._client import ClickHouseError
from sluice.connectors.clickhouse._datasource import ClickHouseDataSource

__all__ = ["ClickHouseDataSource", "ClickHouseError"]
