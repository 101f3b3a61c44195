"""The cost of planning a micro-batch of a Cassandra tracking-column stream as the token ring's slices grow.

    flock /tmp/sluice-cpu.lock .venv/bin/python -m bench.tracking.splits_scale [--tokens 16,64,256] [--batches 5]

For each `num_tokens` per node: a cluster of 3 nodes (127.0.0.1-3, 3 x num_tokens ranges of the ring), a small
table (1,000 rows, an SAI index on the tracking column), and `batches` micro-batches of 100 new rows each, planned
on the driver as Spark's micro-batch loop does: `latestOffset` then `partitions`, each timed with
time.perf_counter. Two shapes of read: `partitions` 1 (the default) and one slice per range of the ring (3 x
num_tokens). Counted per planning, from the driver's session: the statements executed (a request init listener)
and the PREPARE requests sent (the driver sends one to every node). The figure the tests can check is the count;
the time is the server's too (an SAI query without a partition key is a range read over the ring's ranges).
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from contextlib import ExitStack
from typing import Any

NODES = 3
ROWS = 1000
PER_BATCH = 100


class Requests:
    """Counts what the driver's session sends: statements executed, and PREPARE requests (one per node each time
    `prepare` is called, the driver's prepare_on_all_hosts)."""

    def __init__(self, session: Any) -> None:
        self.executed = 0
        self.prepares = 0
        session.add_request_init_listener(self._executed)
        nodes = len(session.cluster.metadata.all_hosts()) if session.cluster.prepare_on_all_hosts else 1
        prepare = session.prepare

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.prepares += nodes
            return prepare(*args, **kwargs)

        session.prepare = counted

    def _executed(self, _future: Any) -> None:
        self.executed += 1

    def read(self) -> tuple[int, int]:
        return self.executed, self.prepares


def start_cluster(stack: ExitStack, num_tokens: int) -> list[Any]:
    from sluice.testing import LocalCassandra

    servers: list[Any] = []
    for i in range(NODES):
        server = LocalCassandra(host=f"127.0.0.{i + 1}", cluster_name="sluice-splits", num_tokens=num_tokens,
                                seeds=[servers[0].storage_endpoint] if servers else None,
                                jvm_options=["-Dcassandra.config.allow_system_properties=true",
                                             "-Dcassandra.settings.phi_convict_threshold=16"])
        servers.append(stack.enter_context(server))
        for started in servers:  # one joins at a time: every node so far sees every other in the ring
            started.wait_for_peers(len(servers) - 1, timeout=300)
    return servers


def measure(servers: list[Any], num_tokens: int, batches: int) -> dict[str, Any]:
    from sluice.connectors.cassandra import CassandraDataSource
    from sluice.connectors.cassandra._client import session_for
    from sluice.spark._compat import ReadAllAvailable

    first = servers[0]
    with first.cluster() as cluster:
        session = cluster.connect()
        ranges = len(cluster.metadata.token_map.ring)
        session.execute("CREATE KEYSPACE IF NOT EXISTS sluice WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("CREATE TABLE IF NOT EXISTS sluice.events (id int PRIMARY KEY, seq bigint, v text)")
        session.execute("CREATE INDEX IF NOT EXISTS ON sluice.events (seq) USING 'sai'")
        insert = session.prepare("INSERT INTO sluice.events (id, seq, v) VALUES (?, ?, 'x')")
        written = 0

        def write(n: int) -> None:
            nonlocal written
            for i in range(written, written + n):
                session.execute(insert, (i, i))
            written += n

        write(ROWS)
        shapes: dict[str, Any] = {}
        counter: Requests | None = None  # one per session: the readers share the driver's session
        for partitions in (1, ranges):
            opts = {"host": first.host, "port": str(first.port), "keyspace": "sluice", "table": "events",
                    "tracking.column": "seq", "tracking.lag-window-ms": "0", "partitions": str(partitions)}
            source = CassandraDataSource(opts)
            reader = source.streamReader(source.schema())
            counter = counter or Requests(session_for(reader.enumerator.cql.conn))
            start = reader.initialOffset()
            plannings = []
            for _ in range(batches + 1):  # the first plans the backlog of ROWS (and waits its window of 0)
                before = counter.read()
                began = time.perf_counter()
                end = reader.latestOffset(start, ReadAllAvailable())
                offset_s = time.perf_counter() - began
                parts = reader.partitions(start, end)
                total_s = time.perf_counter() - began
                after = counter.read()
                plannings.append({"latest_offset_ms": round(offset_s * 1000, 1),
                                  "planning_ms": round(total_s * 1000, 1), "tasks": len(parts),
                                  "statements": after[0] - before[0], "prepares": after[1] - before[1]})
                start = end
                write(PER_BATCH)
            steady = plannings[1:]
            shapes[f"partitions={partitions}"] = {
                "plannings": plannings,
                "median_planning_ms": round(statistics.median(p["planning_ms"] for p in steady), 1),
                "statements_per_planning": sorted({p["statements"] for p in steady}),
                "prepares_per_planning": sorted({p["prepares"] for p in steady})}
            reader.stop()
    return {"num_tokens": num_tokens, "ring_ranges": ranges, **shapes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="16,64,256", help="num_tokens per node, comma-separated")
    parser.add_argument("--batches", type=int, default=5, help="micro-batches planned after the first")
    args = parser.parse_args()
    began = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    runs = []
    for num_tokens in (int(t) for t in args.tokens.split(",")):
        with ExitStack() as stack:
            servers = start_cluster(stack, num_tokens)
            runs.append(measure(servers, num_tokens, args.batches))
            from sluice.connectors.cassandra._client import close_sessions
            close_sessions()
        print(json.dumps(runs[-1]), flush=True)
    print(json.dumps({"began": began, "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                      "load_average_end": os.getloadavg(), "cores": os.cpu_count(), "nodes": NODES,
                      "rows": ROWS, "rows_per_batch": PER_BATCH, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
