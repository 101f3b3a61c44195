"""The soak's design-store branch (python -m bench.soak --stores): the bank's balances, read from the S2
stream `bank`, written into Cassandra (three nodes, replication factor 3, QUORUM), OpenSearch (one node) and HBase
(standalone, through its Thrift2 gateway), each with its ordered upserts; the faults that strike those servers; the
checks of their copies; and their sizes.

Each copy is written by a streaming query of its own (bench/soak/driver.py) with the sink's micro-batch versions
(Cassandra `write.timestamp=micro-batch`, OpenSearch `write.version=micro-batch`, HBase
`write.timestamp=micro-batch`) and its replay guard (the default): a replayed micro-batch never overwrites a later
one's rows. What that promises is per account: a copy shows an account at a state the source had, never ahead of
the source and never going back. None of the three writes a micro-batch in one transaction (Cassandra's UNLOGGED
batches span one partition, OpenSearch's bulk requests and HBase's puts are atomic per document or row), so none
promises the bank's total while changes flow: a reader may see one side of a transfer before the other. The checks
(`watch_store`) hold each copy to what it promises, and count the samples whose total differs, to show why the
total is not promised; at the end each copy must equal the source row for row.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from bench.soak.bank import STORE_BRANCH_FAULTS, Run, read_rows, recovered
from bench.soak.sizes import disk_bytes, rss_bytes

CASSANDRA_NODES = 3
KEYSPACE, CASSANDRA_TABLE, SEARCH_INDEX, HBASE_TABLE = "bank", "balances", "balances", "default:balances"


def initial_tokens(node: int, nodes: int, per_node: int = 16) -> str:
    """Node `node`'s (0-based) tokens: the ring cut into nodes * per_node equal ranges, dealt round
    (bench/stores/cassandra_write.py does the same), so three nodes own a third each."""
    step = 2 ** 64 // (nodes * per_node)
    return ",".join(str(-2 ** 63 + (j * nodes + node) * step) for j in range(per_node))


class Stores:
    """The three stores' servers, started together (`started`), their copies read back and their faults."""

    def __init__(self) -> None:
        from sluice.testing import LocalHBase, LocalOpenSearch
        from sluice.testing._postgres import free_port

        # One CQL port on every node's loopback address: the sink's `port` option is one port for all contact points.
        self.cql_port = free_port()
        self.cassandra: list[Any] = []
        self.search = LocalOpenSearch(heap="512m", start_timeout=300)
        self.hbase = LocalHBase(heap="256m", gateway_heap="128m", start_timeout=300)
        self._cql: Any = None  # a driver session of the checks, QUORUM reads
        self._hbase_conn: Any = None

    def _start_cassandra(self) -> None:
        from sluice.testing import LocalCassandra

        for i in range(CASSANDRA_NODES):
            node = LocalCassandra(host=f"127.0.0.{i + 1}", cluster_name="sluice-soak", heap="320m", port=self.cql_port,
                                  seeds=[self.cassandra[0].storage_endpoint] if self.cassandra else None,
                                  start_timeout=300,
                                  jvm_options=[f"-Dcassandra.initial_token={initial_tokens(i, CASSANDRA_NODES)}",
                                               # Servers, Spark and its workers on two cores: a node starved of CPU
                                               # for seconds is slow, not dead (default 8).
                                               "-Dcassandra.config.allow_system_properties=true",
                                               "-Dcassandra.settings.phi_convict_threshold=16"])
            self.cassandra.append(node)
            node.start()
            for started in self.cassandra:  # one joins at a time: each sees every other in the ring
                started.wait_for_peers(len(self.cassandra) - 1)

    @contextlib.contextmanager
    def started(self) -> Iterator[concurrent.futures.Future]:
        """The servers starting in threads (Cassandra's nodes one after the other), beside the soak's others; the
        future is done when all are up and the keyspace, table and index exist. Every server stops at the end."""
        pool = concurrent.futures.ThreadPoolExecutor(3)
        try:
            parts = [pool.submit(self._start_cassandra), pool.submit(self.search.start), pool.submit(self.hbase.start)]

            def prepare() -> None:
                for part in parts:
                    part.result()
                self._prepare()

            yield pool.submit(prepare)
        finally:
            pool.shutdown(wait=True)
            with contextlib.suppress(Exception):
                if self._cql is not None:
                    self._cql.cluster.shutdown()
            for server in [*self.cassandra, self.search, self.hbase]:
                with contextlib.suppress(Exception):
                    server.stop()

    def _prepare(self) -> None:
        from cassandra.cluster import Cluster

        from sluice.connectors.hbase._client import thrift

        cluster: Cluster = self.cassandra[0].cluster()
        session = cluster.connect()
        session.execute(f"CREATE KEYSPACE {KEYSPACE} WITH replication = "
                        f"{{'class': 'SimpleStrategy', 'replication_factor': {CASSANDRA_NODES}}}")
        session.execute(f"CREATE TABLE {KEYSPACE}.{CASSANDRA_TABLE} (id int PRIMARY KEY, balance bigint, v bigint)")
        self._cql = session
        status, answer = self.search.request("PUT", f"/{SEARCH_INDEX}", {
            "settings": {"number_of_shards": 1, "number_of_replicas": 0},
            "mappings": {"properties": {"id": {"type": "integer"}, "balance": {"type": "long"},
                                        "v": {"type": "long"}}}})
        if status != 200:
            raise RuntimeError(f"the index {SEARCH_INDEX} was not created: {status} {answer}")
        t = thrift()
        namespace, name = HBASE_TABLE.split(":")
        self._hbase().call("createTable", t.TTableDescriptor(
            tableName=t.TTableName(ns=namespace.encode(), qualifier=name.encode()),
            columns=[t.TColumnFamilyDescriptor(name=b"d")]), None)

    def driver_config(self) -> dict[str, tuple[str, dict[str, str]]]:
        """The driver's queries: copy name -> (format, options)."""
        hosts = ",".join(node.host for node in self.cassandra)
        return {
            "cassandra": ("cassandra", {"host": hosts, "port": str(self.cql_port), "keyspace": KEYSPACE,
                                        "table": CASSANDRA_TABLE, "consistency": "QUORUM",
                                        "write.timestamp": "micro-batch", "request.timeout-ms": "5000"}),
            "opensearch": ("elasticsearch", {"nodes": self.search.url, "index": SEARCH_INDEX, "mapping.id": "id",
                                             "write.version": "micro-batch", "http.timeout-ms": "10000"}),
            "hbase": ("hbase", {"host": self.hbase.host, "port": str(self.hbase.port), "table": HBASE_TABLE,
                                "rowkey": "id", "family": "d", "write.timestamp": "micro-batch",
                                "request.timeout-ms": "10000"}),
        }

    # ------------------------------------------------------------------------------------------------ reading
    def _hbase(self) -> Any:
        from sluice.connectors.hbase._client import Connection

        if self._hbase_conn is None:
            self._hbase_conn = Connection((self.hbase.host,), self.hbase.port, 10.0)
        return self._hbase_conn

    def rows(self, copy: str) -> list[tuple[int, int, int]]:
        """Copy `copy`'s rows (id, balance, v), sorted by id (raises while its server is down)."""
        if copy == "cassandra":
            from cassandra import ConsistencyLevel
            from cassandra.query import SimpleStatement

            query = SimpleStatement(f"SELECT id, balance, v FROM {KEYSPACE}.{CASSANDRA_TABLE}",
                                    consistency_level=ConsistencyLevel.QUORUM)
            return sorted((r.id, r.balance, r.v) for r in self._cql.execute(query, timeout=10))
        if copy == "opensearch":
            status, answer = self.search.request("GET", f"/{SEARCH_INDEX}/_search", {
                "size": 10_000, "query": {"match_all": {}}}, timeout=10)
            if status != 200:
                raise RuntimeError(f"search: {status}")
            return sorted((h["_source"]["id"], h["_source"]["balance"], h["_source"]["v"])
                          for h in answer["hits"]["hits"])
        if copy == "hbase":
            return self._hbase_rows()
        raise ValueError(copy)

    def _hbase_rows(self) -> list[tuple[int, int, int]]:
        from sluice.connectors.hbase._client import thrift

        conn = self._hbase()
        try:
            scanner = conn.call("openScanner", HBASE_TABLE.encode(), thrift().TScan(caching=1000))
            out = []
            try:
                while results := conn.call("getScannerRows", scanner, 1000):
                    for r in results:
                        cells = {bytes(c.qualifier): int.from_bytes(bytes(c.value), "big", signed=True)
                                 for c in r.columnValues}
                        # The row key: the int id's 4 bytes, big-endian with the sign bit flipped (docs/hbase.md).
                        out.append((int.from_bytes(bytes(r.row), "big") - 2 ** 31, cells[b"balance"], cells[b"v"]))
            finally:
                conn.call("closeScanner", scanner)
            return sorted(out)
        except Exception:
            self._hbase_conn = None  # a gateway restarted: connect again next time
            raise

    def refresh(self) -> None:
        """OpenSearch's searches see every write acknowledged so far (for the end's comparison)."""
        self.search.request("POST", f"/{SEARCH_INDEX}/_refresh", timeout=30)

    # ------------------------------------------------------------------------------------------------ faults
    def strike(self, kind: str, rnd: Any) -> str:
        """Kill a server's process (SIGKILL, as a crash would) and start it again 1-3 s later on its data."""
        pause = rnd.uniform(1, 3)
        if kind == "cassandra-node":
            i = rnd.randrange(CASSANDRA_NODES)
            node = self.cassandra[i]
            node.kill()
            time.sleep(pause)
            node.start()
            # Back in the ring as every other node sees it before the next node may be struck: one node down at a
            # time, which QUORUM (two of three) rides out.
            for other in self.cassandra:
                other.wait_for_peers(CASSANDRA_NODES - 1, timeout=300)
            return f"node {node.host}, back in {node.start_seconds:.1f} s"
        if kind == "search-node":
            self.search.kill()
            time.sleep(pause)
            self.search.start()
            return f"back in {self.search.start_seconds:.1f} s"
        if kind == "hbase-gateway":
            self.hbase.kill_gateway()
            time.sleep(pause)
            self.hbase.start_gateway()
            return f"back in {self.hbase.gateway.start_seconds:.1f} s"
        if kind == "hbase-server":  # the master and region server (standalone: one JVM) with the gateway
            self.hbase.kill()
            time.sleep(pause)
            self.hbase.start()
            return f"back in {self.hbase.start_seconds:.1f} s"
        raise ValueError(kind)

    # ------------------------------------------------------------------------------------------------ sizes
    def growth(self) -> dict[str, float]:
        def folder(server: Any) -> int:
            return disk_bytes(server.folder) if server.folder else 0

        return {"cassandra_rss_bytes": rss_bytes([n.pid for n in self.cassandra if n.pid]),
                "cassandra_disk_bytes": sum(folder(n) for n in self.cassandra),
                "opensearch_rss_bytes": rss_bytes([self.search.pid] if self.search.pid else []),
                "opensearch_disk_bytes": folder(self.search),
                "hbase_rss_bytes": rss_bytes([p for p in (self.hbase.pid, self.hbase.gateway.pid) if p]),
                "hbase_disk_bytes": folder(self.hbase)}


def watch_store(stores: Stores, copy: str, source_url: str, run: Run, marker_id: int,
                stop: threading.Event) -> None:
    """Read copy `copy` every second, then the source: every account at a state the source had (its balance at that
    v, when the writer knows the commit's outcome), never ahead of the source's v read after it, never going back
    from an earlier read nor vanishing; the marker's changes arriving tell when this store's faults recovered.
    Samples whose total differs from the bank's are counted, not violations: the copy does not promise it."""
    highest: dict[int, int] = {}
    mark = 0
    conn = None
    kinds = STORE_BRANCH_FAULTS[copy]
    while not stop.wait(1.0):
        try:
            rows = stores.rows(copy)
        except Exception:
            continue  # its server is down (a fault): read again later
        now = time.monotonic()
        conn, found = read_rows(conn, source_url, "SELECT id, v FROM accounts")
        if found is None:
            continue
        source = dict(found)
        problems = [f"account {account} vanished (last seen at v={highest[account]})"
                    for account in sorted(set(highest) - {account for account, _, _ in rows})]
        for account, balance, v in rows:
            if v > source.get(account, -1):
                problems.append(f"account {account} at v={v}, ahead of the source's v={source.get(account)}")
            elif v < highest.get(account, 0):
                problems.append(f"account {account} went back from v={highest[account]} to v={v}")
            elif (known := run.history.get((account, v))) is not None and known != balance:
                problems.append(f"account {account} at v={v} holds {balance}, the source had {known}")
            highest[account] = max(v, highest.get(account, v))
        with run.lock:
            reads = run.store_reads.setdefault(copy, {"reads": 0, "total_off": 0, "before_complete": 0})
            reads["reads"] += 1
            if len(rows) < run.accounts:  # before its query's first micro-batches held every account
                reads["before_complete"] += 1
            elif sum(balance for _, balance, _ in rows) != run.total:
                reads["total_off"] += 1
            marks = [v for account, _, v in rows if account == marker_id]
            for v in range(mark + 1, max(marks, default=0) + 1):
                if (committed := run.marker_commits.get(v)) is not None:
                    run.store_latencies.setdefault(copy, []).append(now - committed)
                    recovered(run, committed, now, lambda kind: kind in kinds)
            mark = max([mark, *marks])
        for problem in problems[:5]:
            run.violate(f"the {copy} copy: {problem}")
    if conn is not None:
        conn.close()


def store_copies(stores: Stores | None) -> dict[str, list[tuple[int, int, int]]]:
    """Every design-store copy's rows, for the end's comparison with the source (none without --stores)."""
    if stores is None:
        return {}
    stores.refresh()
    return {f"the {copy} copy": stores.rows(copy) for copy in STORE_BRANCH_FAULTS}


def stores_growth(stores: Stores | None) -> dict[str, float]:
    return stores.growth() if stores is not None else {}

