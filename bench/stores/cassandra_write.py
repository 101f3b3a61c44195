"""Cassandra benchmark: FLIP-509's claim (batches of one partition beat batches that mix partitions and single
statements), and sluice against the Python driver's own fastest path, one run, the same server(s).

Run: `.venv/bin/python -m bench.stores.cassandra_write [--rows 200000] [--partition-rows 10] [--rounds 2] [--nodes 1]`.
`--nodes 3` starts a three-node cluster on 127.0.0.1-127.0.0.3 (replication factor 1, so each partition lives on
one node and the coordinator of a mixed batch must forward most of it): each node on its own storage and CQL ports
(Cassandra 4.0+ allows per-node ports; the seeds name the first node as "host:storage_port"), started one after
the other, each waited for until every node started so far sees it NORMAL in gossip and in system.peers_v2; the
harness's heap (512 MiB) each, and evenly spaced tokens (16 a node, interleaved), so each node owns a third of the
ring; phi_convict_threshold 16 (not 8), as a node starved of CPU here for seconds is slow, not dead (a peer marked
DOWN fails queries with Unavailable: the JSON lists any such event per node). The driver and the connectors are
given the first node only and find the others. Data: rows (pk int, ck int, v text of ~20 bytes, amount double),
`--partition-rows` rows per partition, in a DataFrame cached in 2 partitions, into `PRIMARY KEY ((pk), ck)`.
Contenders, each into a fresh table:
- sluice_partition: `sluice.write(df, "cassandra", ...)` with its defaults (UNLOGGED batches of one partition,
  token-aware);
- sluice_mixed / sluice_none: the same write with batch.grouping=mixed (batches across partitions, the same size
  limits) and none (every row its own statement, concurrently);
- driver_concurrent: the driver alone in this process, `execute_concurrent_with_args` of the prepared INSERT over
  every row (concurrency 100): what a single-process Python job does;
- driver_partition_batches: the driver alone, one UNLOGGED batch per partition through
  `execute_concurrent_with_args` (concurrency 100): the design's batching without Spark;
- scc: the Spark Cassandra Connector (SCC_PACKAGE, Maven Central), `df.write.format("org.apache.spark.sql.cassandra")`
  with its defaults (batch.grouping.key=partition, batch.size.bytes=1024, concurrent.writes=5 a task, consistency
  LOCAL_QUORUM). Its newest release, 3.5.1, is built for Spark 3.5; no release targets Spark 4, but its DataFrame
  write into an existing table runs on pyspark 4.3 (its error for a table it does not find does not: it throws
  NoClassDefFoundError org/apache/spark/sql/catalyst/analysis/NoSuchTableException$, a Scala companion object
  Spark 4 no longer has). Its jars are resolved by Spark's Ivy from Maven Central only (a settings file of ours,
  into ~/.cache/sluice/spark-cassandra-connector) when the bench's session starts; `--no-scc` leaves it out;
- floor: the same DataFrame into `sluice_null` (Spark's hand-over of rows to Python workers, no store).
Each figure is rows per second, the best of --rounds, with latencies of the last round (sluice's: the engine's
per-request p50/p99, submit to acknowledgement; every contender's: the coordinators' p50/p99 for its table from
Cassandra's system_views.coordinator_write_latency, the worst node's, and the requests they counted) and the CPU
seconds of each component of this process's own tree only ("cassandra": the server JVMs, counted apart from
spark_jvm, which _cpu.py would lump them in with, both being `java`). Before the rounds, one untimed write of
1,000 rows each through sluice and the connector starts Spark's Python workers and loads the connector, which the
first contender would otherwise pay for.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
import uuid
from contextlib import ExitStack
from datetime import date
from pathlib import Path

from bench.cpu import clocked_tree, rss_mib, stdout_to_stderr

TABLE = "pk int, ck int, v text, amount double, PRIMARY KEY ((pk), ck)"

# The Spark Cassandra Connector's newest release on Maven Central (com.datastax.spark, Scala 2.13): built for Spark 3.5.
SCC_PACKAGE = "com.datastax.spark:spark-cassandra-connector_2.13:3.5.1"
SCC_HOME = Path.home() / ".cache" / "sluice" / "spark-cassandra-connector"
# Maven Central alone: Spark's default Ivy chain looks in ~/.m2 first (where a half-fetched artifact, a pom without
# its jar, fails the resolution) and at repos.spark-packages.org.
IVY_SETTINGS = """\
<ivysettings>
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" root="https://repo1.maven.org/maven2/"/>
  </resolvers>
</ivysettings>
"""


def rows_of(n: int, per_partition: int) -> list[tuple[int, int, str, float]]:
    return [(i // per_partition, i % per_partition, f"value-{i:014d}", i * 0.25) for i in range(n)]


def tokens(node: int, nodes: int, per_node: int = 16) -> str:
    """Node `node`'s (0-based) initial tokens: the ring cut into nodes * per_node equal ranges, dealt round."""
    step = 2 ** 64 // (nodes * per_node)
    return ",".join(str(-2 ** 63 + (j * nodes + node) * step) for j in range(per_node))


def start_nodes(stack: ExitStack, nodes: int) -> tuple[list, dict]:
    """The cluster, and what its start took: seconds, and each node's resident memory once all have joined."""
    from sluice.testing._cassandra import LocalCassandra

    began = time.monotonic()
    if nodes == 1:
        servers = [stack.enter_context(LocalCassandra(heap="768m", cluster_name="sluice-bench"))]
    else:
        servers = []
        for i in range(nodes):
            server = LocalCassandra(host=f"127.0.0.{i + 1}", cluster_name="sluice-bench",
                                    seeds=[servers[0].storage_endpoint] if servers else None,
                                    jvm_options=[f"-Dcassandra.initial_token={tokens(i, nodes)}",
                                                 # Three servers, Spark and its workers on a few cores: a node
                                                 # starved of CPU for seconds is slow, not dead (default 8).
                                                 "-Dcassandra.config.allow_system_properties=true",
                                                 "-Dcassandra.settings.phi_convict_threshold=16"])
            servers.append(stack.enter_context(server))
            # One joins at a time: each node started so far must see this one (and the others) in the ring.
            for started in servers:
                started.wait_for_peers(len(servers) - 1)
    info = {"start_seconds": round(time.monotonic() - began, 1),
            "nodes": [{"storage": s.storage_endpoint, "cql_port": s.port, "heap": s.heap,
                       "node_start_seconds": round(s.start_seconds, 1), "rss_mib_started": rss_mib(s.pid)}
                      for s in servers]}
    return servers, info


def peers_marked_down(server) -> list[str]:
    """The lines of a node's log (gossip logs at INFO) where it marked a peer DOWN."""
    log = server.folder / "system.log" if server.folder else None
    if log is None or not log.is_file():
        return []
    return [line[:200] for line in log.read_text(errors="replace").splitlines() if "is now DOWN" in line]


def scc_conf(servers: list) -> dict[str, str]:
    """The Spark settings that put the Spark Cassandra Connector on the session's classpath and point it at the
    first node (it finds the others)."""
    SCC_HOME.mkdir(parents=True, exist_ok=True)
    settings = SCC_HOME / "ivysettings.xml"
    settings.write_text(IVY_SETTINGS)
    return {"spark.jars.packages": SCC_PACKAGE, "spark.jars.ivySettings": str(settings),
            "spark.jars.ivy": str(SCC_HOME / "ivy"),
            "spark.cassandra.connection.host": servers[0].host,
            "spark.cassandra.connection.port": str(servers[0].port)}


class Keyspace:
    """Keyspace `bench` on the cluster: fresh tables, a table's rows counted, its coordinators' write latency, and
    a write timed with the nodes' CPU."""

    def __init__(self, servers: list, cluster, rows: int) -> None:
        self.cluster, self.session, self.rows = cluster, cluster.connect(), rows
        self.server_pids = {s.pid for s in servers}
        self.session.execute("CREATE KEYSPACE IF NOT EXISTS bench WITH replication = "
                             "{'class': 'SimpleStrategy', 'replication_factor': 1}")

    def timed(self, action) -> tuple[float, dict[str, float]]:
        return clocked_tree(action, dict.fromkeys(self.server_pids, "cassandra"))

    def fresh(self) -> str:
        name = f"b_{uuid.uuid4().hex[:8]}"
        self.session.execute(f"CREATE TABLE bench.{name} ({TABLE})")
        return name

    def count(self, table: str) -> None:
        from cassandra import Unavailable

        for attempt in range(30):
            try:
                got = self.session.execute(f"SELECT COUNT(*) FROM bench.{table}", timeout=120).one()[0]
                break
            except Unavailable:  # a node its coordinator has marked down for a moment (see the logs at exit)
                if attempt == 29:
                    raise
                time.sleep(2)
        assert got == self.rows, (table, got)

    def server_latency(self, table: str) -> dict[str, float]:
        """Coordinator-side write latency of `table` (Cassandra's system_views.coordinator_write_latency, each
        node's own: its recent requests), the worst node's p50/p99 and the requests of all."""
        query = ("SELECT count, p50th_ms, p99th_ms FROM system_views.coordinator_write_latency "
                 f"WHERE keyspace_name = 'bench' AND table_name = '{table}'")
        rows = [row for host in self.cluster.metadata.all_hosts() for row in self.session.execute(query, host=host)]
        return {"server_requests": sum(r.count for r in rows),
                "server_p50_ms": round(max((r.p50th_ms for r in rows), default=0.0), 2),
                "server_p99_ms": round(max((r.p99th_ms for r in rows), default=0.0), 2)}


class Rounds:
    """Every contender's runs (seconds, CPU), and of each one's last round its latency (the engine's for sluice,
    the server's) and sluice's rows per engine batch."""

    def __init__(self, keyspace: Keyspace, df, data: list, base: dict[str, str]) -> None:
        self.keyspace, self.df, self.data, self.base = keyspace, df, data, base
        self.runs: dict[str, list] = {}
        self.latency: dict[str, dict] = {}
        self.per_batch: dict[str, float] = {}  # rows per engine batch (none: sent row by row)

    def sluice(self, grouping: str) -> None:
        import sluice

        ks = self.keyspace
        table = ks.fresh()
        opts = {**self.base, "table": table, "batch.grouping": grouping}
        timed = ks.timed(lambda: sluice.write(self.df, "cassandra", opts))
        self.runs.setdefault(f"sluice_{grouping}", []).append(timed)
        summary = sluice.last_write_summary("cassandra")
        self.per_batch[f"sluice_{grouping}"] = round(summary["records"] / summary["batches"], 1)
        self.latency[f"sluice_{grouping}"] = {"client_p50_ms": summary["submit_latency_p50_ms"],
                                              "client_p99_ms": summary["submit_latency_p99_ms"],
                                              **ks.server_latency(table)}
        ks.count(table)

    def floor(self) -> None:
        import sluice

        self.runs.setdefault("floor", []).append(self.keyspace.timed(lambda: sluice.write(self.df, "sluice_null", {})))

    def scc(self, table: str) -> None:
        ks = self.keyspace
        writer = self.df.write.format("org.apache.spark.sql.cassandra").options(keyspace="bench", table=table)
        self.runs.setdefault("scc", []).append(ks.timed(writer.mode("append").save))
        self.latency["scc"] = ks.server_latency(table)
        ks.count(table)

    def driver(self, name: str, write) -> None:
        """The Python driver alone: `write(session, insert)` with a prepared INSERT into a fresh table."""
        ks = self.keyspace
        table = ks.fresh()
        insert = ks.session.prepare(f"INSERT INTO bench.{table} (pk, ck, v, amount) VALUES (?, ?, ?, ?)")
        self.runs.setdefault(name, []).append(ks.timed(lambda: write(ks.session, insert)))
        self.latency[name] = ks.server_latency(table)
        ks.count(table)

    def one_round(self, with_scc: bool) -> None:
        from cassandra.concurrent import execute_concurrent, execute_concurrent_with_args
        from cassandra.query import BatchStatement, BatchType

        data = self.data

        def partition_batches(session, statement) -> None:
            batches, key = [], None
            for row in data:  # rows_of() yields each partition's rows together
                if row[0] != key:
                    batches.append(BatchStatement(BatchType.UNLOGGED))
                    key = row[0]
                batches[-1].add(statement, row)
            execute_concurrent(session, [(b, None) for b in batches], concurrency=100, raise_on_first_error=True)

        # The connector's table made first: its driver session, cached from the last write, learns of tables
        # made by others from schema events (after a 1 s debounce), and a write into a table it has not seen
        # yet fails as "table not found" (on Spark 4: NoClassDefFoundError NoSuchTableException$, see below).
        scc_table = self.keyspace.fresh() if with_scc else None
        for grouping in ("partition", "mixed", "none"):
            self.sluice(grouping)
        self.floor()
        if scc_table is not None:
            self.scc(scc_table)
        self.driver("driver_concurrent", lambda session, insert: execute_concurrent_with_args(
            session, insert, data, concurrency=100, raise_on_first_error=True))
        self.driver("driver_partition_batches", partition_batches)

    def results(self, rows: int) -> dict[str, dict]:
        """Each contender's fastest round."""
        out = {}
        for name, measured in self.runs.items():
            seconds, cpu = min(measured, key=lambda r: r[0])
            out[name] = {"seconds": round(seconds, 3), "rows_per_s": round(rows / seconds), "cpu_s": cpu,
                         **({"rows_per_batch": self.per_batch[name]} if name in self.per_batch else {}),
                         **self.latency.get(name, {})}
        return out


def ratios(results: dict[str, dict], with_scc: bool) -> dict[str, float]:
    rate = {name: r["rows_per_s"] for name, r in results.items()}
    return {"partition_vs_mixed": round(rate["sluice_partition"] / rate["sluice_mixed"], 2),
            "partition_vs_none": round(rate["sluice_partition"] / rate["sluice_none"], 2),
            "sluice_vs_driver_concurrent": round(rate["sluice_partition"] / rate["driver_concurrent"], 2),
            "sluice_vs_driver_partition_batches": round(rate["sluice_partition"] / rate["driver_partition_batches"], 2),
            "sluice_vs_floor": round(rate["sluice_partition"] / rate["floor"], 2),
            **({"sluice_vs_scc": round(rate["sluice_partition"] / rate["scc"], 2)} if with_scc else {})}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partition-rows", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 3))
    parser.add_argument("--no-scc", action="store_true", help="leave the Spark Cassandra Connector out")
    return parser.parse_args()


def main() -> int:
    args = arguments()
    # SIGTERM unwinds like an exception, so that the servers are stopped and their folders deleted (they run in
    # sessions of their own and would outlive this process).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    import sluice

    data = rows_of(args.rows, args.partition_rows)
    with ExitStack() as stack:
        servers, cluster_info = start_nodes(stack, args.nodes)

        def on_failure(kind, error, traceback) -> bool:
            if kind is not None and issubclass(kind, Exception):  # before the servers and their logs go
                for server in servers:
                    alive = "running" if server.pid else "NOT RUNNING"
                    print(f"--- node {server.storage_endpoint} ({alive}):\n{server._log_tail()}", file=sys.stderr)
            return False

        stack.push(on_failure)
        cluster = stack.enter_context(servers[0].cluster())
        keyspace = Keyspace(servers, cluster, args.rows)
        hosts = sorted(f"{h.endpoint.address}:{h.endpoint.port}" for h in cluster.metadata.all_hosts() if h.is_up)
        assert len(hosts) == args.nodes, hosts  # the driver found every node from the first one
        cluster_info["driver_hosts_up"] = hosts

        with stdout_to_stderr():
            spark = sluice.session("sluice-bench-cassandra", **({} if args.no_scc else scc_conf(servers)))
        df = spark.createDataFrame(data, "pk int, ck int, v string, amount double").repartition(2).cache()
        df.count()
        spark_version = spark.version
        base = {"host": servers[0].host, "port": str(servers[0].port), "keyspace": "bench"}
        # Warm-up, untimed: Spark's Python workers started and the driver imported in them, the connector's classes
        # loaded, so that the first contender of the first round does not pay for it.
        warm = df.limit(1000)
        sluice.write(warm, "cassandra", {**base, "table": keyspace.fresh()})
        if not args.no_scc:
            warm.write.format("org.apache.spark.sql.cassandra").options(keyspace="bench", table=keyspace.fresh()).mode(
                "append").save()
        rounds = Rounds(keyspace, df, data, base)
        for _ in range(args.rounds):
            rounds.one_round(with_scc=not args.no_scc)
        if not args.no_scc:
            # Its cached driver sessions outlive spark.stop() (the JVM stays up until this process ends) and would
            # log reconnection errors once the servers stop.
            spark._jvm.com.datastax.spark.connector.cql.CassandraConnector.evictCache()
        spark.stop()
        version = keyspace.session.execute("SELECT release_version FROM system.local").one()[0]
        for node, server in zip(cluster_info["nodes"], servers, strict=True):
            node["rss_mib_end"] = rss_mib(server.pid)
            node["peers_marked_down"] = peers_marked_down(server)

    results = rounds.results(args.rows)
    print(json.dumps({
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "cassandra": f"{version}, {args.nodes} node(s)", "cluster": cluster_info,
        "spark": spark_version, "scc": None if args.no_scc else SCC_PACKAGE,
        "rows": args.rows, "partition_rows": args.partition_rows, "results": results,
        "ratios": ratios(results, not args.no_scc),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
