"""S2 (s2.dev) streams from PySpark: `format("s2")` appends rows, `format("s2_upsert")` writes an upsert changelog.

    import sluice
    spark = sluice.session()
    opts = {"s2.basin": "my-basin-1", "s2.stream": "orders/{region}", "s2.create-streams": "true",
            "s2.endpoints.account": "http://127.0.0.1:4243", "s2.endpoints.basin": "http://127.0.0.1:4243",
            "s2.auth-token": "local"}                       # or S2_ACCESS_TOKEN / S2_*_ENDPOINT in the environment
    orders = spark.createDataFrame([(1, "eu", 9.5), (2, "us", 3.0)], "id long, region string, amount double")

    orders.write.format("s2").options(**opts).mode("append").save()            # one JSON record per row
    sluice.write(orders, "s2_upsert", {**opts, "primary-key": "id"})           # @key/@action changelog
    sluice.write(orders, "s2", {**opts, "sink.mode": "global-ordered",          # exactly-once, in order
                                "sink.transactional": "true"})
    (spark.readStream.format("rate").load()
        .selectExpr("value AS id", "'eu' AS region", "rand() AS amount")
        .writeStream.format("s2").options(**opts).option("checkpointLocation", "/tmp/ck").start())

    # SQL: Spark 4.3 drops a catalog table's OPTIONS for Python data sources; a temporary view keeps them.
    spark.sql("CREATE TEMPORARY VIEW orders_s2 (id BIGINT, region STRING, amount DOUBLE) "
              "USING s2 OPTIONS (`s2.basin` 'my-basin-1', `s2.stream` 'orders/{region}', ...)")
    spark.sql("INSERT INTO orders_s2 SELECT 3 AS id, 'eu' AS region, 1.0 AS amount")

Record formats: append records carry the row as compact JSON (`format=json`, default) or a string/binary
column's bytes (`format=raw`); an optional `headers` column (map or array of name/value) becomes record
headers and an optional `timestamp` column the record timestamp. Upsert records carry headers `@key`
(JSON object of the primary-key columns) then `@action` (`u` or `d`) and, for `u`, the non-key columns as
a JSON object: the byte format of flink-connector-s2's `s2-upsert` sink.
"""

from sluice.connectors.s2._client import Connection, S2AccessError
from sluice.connectors.s2._commits import commit_token, uncommitted
from sluice.connectors.s2._datasource import S2DataSource, S2UpsertDataSource
from sluice.connectors.s2._options import READ_SPEC

__all__ = ["READ_SPEC", "Connection", "S2AccessError", "S2DataSource", "S2UpsertDataSource", "commit_token",
           "uncommitted"]
