"""Test helpers: fake stores for the engine's own tests, and real servers started on demand.

- `FlakyStore`: in-process, fails/throttles/delays at random, and checks ordering rules as it goes.
- `format("sluice_test")` (`FileStoreDataSource`): a file-backed store usable from Spark's worker
  processes, with transactions (staging files + an atomic commit log), for Spark-level engine tests.
- `LocalPostgres`: a real, throwaway PostgreSQL server (Debian's binaries) for tests, benchmarks and the demo.
- `LocalClickHouse`: a real, throwaway ClickHouse server (Debian's clickhouse-server) for tests and benchmarks.
- `LocalCassandra`: a real, throwaway Apache Cassandra 5.0 node (the server jars from Maven Central, fetched by
  `make check-cassandra`) on loopback, for tests and benchmarks; it can be killed and restarted on the same data.
- `LocalOpenSearch`: a real, throwaway OpenSearch 2.19 node (the server jars from Maven Central, fetched by
  `make check-opensearch`) on loopback, optionally with the security plugin's password authentication.
- `LocalElasticsearch`: a real, throwaway Elasticsearch 7.17 node (the server jars from Maven Central, fetched by
  `make check-elasticsearch`) on loopback, without authentication.
- `LocalHBase`: a real, throwaway Apache HBase 2.6 server in standalone mode with its Thrift2 gateway (the jars from
  Maven Central, fetched by `make check-hbase`) on loopback; the gateway can be killed and restarted mid-write.
- `LocalKdc`: a real, throwaway MIT Kerberos KDC (Debian's krb5-kdc) on loopback: a realm, principals and keytabs in a
  private folder; `LocalHBase(kdc=...)` secures HBase and its Thrift2 gateway (SPNEGO) by it.
- `LocalKafka`: a real, throwaway Apache Kafka 4.1 node (or 3.9: `version=`; broker and controller, KRaft; the jars
  from Maven Central, fetched by `make check-kafka`) on loopback, optionally with SASL (PLAIN, SCRAM-SHA-512) and
  TLS; restartable on its data. `LocalKafkaCluster`: three of them in one quorum (replication factor 3,
  `min.insync.replicas=2`). `read_committed`/`count_committed`: what a `read_committed` consumer reads of a topic;
  `count_written`: the offsets its logs hold, committed or not.
- `LocalSchemaRegistry`: a real, throwaway Apicurio Registry 3.3 (its prebuilt bundle from Maven Central, fetched by
  `make check-registry`; Java 21+) on loopback, serving Confluent's Schema Registry API at `<url>/apis/ccompat/v7`,
  optionally with HTTP basic authentication and TLS; `restart()` keeps its schemas and their ids.
- `LocalS3`: a real, throwaway S3-compatible server process (moto's standalone server) for object-storage tests.
- `TcpProxy`: a loopback TCP proxy that stalls or cuts the connections through it (the network between Spark and a
  store, for fault tests and the soak).

`LocalPostgres.restart(crash=)`, `LocalS2.restart()` (after `kill()`) and the servers' fixed ports keep a store's
address and data across a restart, as the soak's faults need.
"""

from sluice.testing._cassandra import LocalCassandra
from sluice.testing._clickhouse import LocalClickHouse
from sluice.testing._elasticsearch import LocalElasticsearch
from sluice.testing._filestore import FileStoreDataSource, read_file_store, register
from sluice.testing._flaky import FlakyStore
from sluice.testing._hbase import LocalHBase
from sluice.testing._kafka import LocalKafka
from sluice.testing._kafka_cluster import LocalKafkaCluster
from sluice.testing._kafka_reads import KafkaRecord, count_committed, count_written, read_committed
from sluice.testing._kdc import LocalKdc
from sluice.testing._opensearch import LocalOpenSearch
from sluice.testing._postgres import LocalPostgres
from sluice.testing._proxy import TcpProxy
from sluice.testing._registry import LocalSchemaRegistry
from sluice.testing._s3 import LocalS3

__all__ = ["FileStoreDataSource", "FlakyStore", "KafkaRecord", "LocalCassandra", "LocalClickHouse",
           "LocalElasticsearch", "LocalHBase", "LocalKafka", "LocalKafkaCluster", "LocalKdc", "LocalOpenSearch",
           "LocalPostgres", "LocalS3", "LocalSchemaRegistry", "TcpProxy", "count_committed", "count_written",
           "read_committed", "read_file_store", "register"]
