"""Apache Cassandra from PySpark: `format("cassandra")` upserts and deletes by primary key in UNLOGGED batches of
one partition each (FLIP-509's case), routed token-aware; reads in token-range splits.

    import sluice
    spark = sluice.session()
    cass = {"host": "10.0.0.1,10.0.0.2", "keyspace": "shop", "table": "orders", "username": "etl"}
                                                       # password: option or CASSANDRA_PASSWORD
    orders = spark.createDataFrame([(1, "eu", 9.5)], "id int, region string, amount double")
    sluice.write(orders, "cassandra", cass)           # rows of one partition in one task, one batch per partition
    df = spark.read.format("cassandra").options(**cass).load()

Written only on the public connector SDK (`sluice.connector`). Guide: docs/cassandra.md.
"""

from sluice.connectors.cassandra._client import CassandraError
from sluice.connectors.cassandra._datasource import CassandraDataSource

__all__ = ["CassandraDataSource", "CassandraError"]
