"""Elasticsearch and OpenSearch from PySpark: `format("elasticsearch")` indexes, updates and deletes documents
through the bulk API; one id's changes in order, different ids concurrently; external versions make replays
harmless.

    import sluice
    spark = sluice.session()
    es = {"nodes": "http://es1:9200", "index": "orders", "mapping.id": "order_id", "username": "etl"}
                                                       # password: option or ELASTICSEARCH_PASSWORD
    orders = spark.createDataFrame([(1, "eu", 9.5)], "order_id int, region string, amount double")
    sluice.write(orders, "elasticsearch", es)

Written only on the public connector SDK (`sluice.connector`). Guide: docs/elasticsearch.md.
"""

from sluice.connectors.elasticsearch._client import ElasticsearchError
from sluice.connectors.elasticsearch._datasource import ElasticsearchDataSource

__all__ = ["ElasticsearchDataSource", "ElasticsearchError"]
