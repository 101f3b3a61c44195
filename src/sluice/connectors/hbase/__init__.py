"""Apache HBase from PySpark: `format("hbase")` puts and deletes by row key, every cell with its timestamp, in
batches of one region each (the sink-modes design's second mode), through HBase's Thrift2 gateway; reads one split
per region.

    import sluice
    spark = sluice.session()
    hbase = {"host": "hbase-thrift.internal", "table": "shop:orders", "rowkey": "region,id", "family": "d"}
    orders = spark.createDataFrame([("eu", 1, 9.5)], "region string, id long, amount double")
    sluice.write(orders, "hbase", hbase)          # row key: region then id, order-preserving bytes; cell d:amount
    df = spark.read.format("hbase").options(**hbase).schema("region string, id long, amount double").load()

Written only on the public connector SDK (`sluice.connector`). Guide: docs/hbase.md.
"""

from sluice.connectors.hbase._client import HBaseError
from sluice.connectors.hbase._datasource import HBaseDataSource

__all__ = ["HBaseDataSource", "HBaseError"]
