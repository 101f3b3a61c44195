"""The soak's Spark driver: the bank pipeline's five streaming queries, eight with --stores (bench/soak/ starts this
process, kills it and starts it again on the same checkpoints). A query that fails is started again from its
checkpoint a second later, as the supervisor of a production job would (later when it keeps failing within a minute
of its start: 2, 4, 8, 10 s; at most two starts a second); every start and failure is a line on stdout.

Hops, each in the mode a careful user picks:
1. `postgres_changes` -> S2 stream `bank` with `s2_upsert`, exactly-once (sink.mode=global-ordered,
   sink.transactional=true: fencing tokens and match_seq_num), one record per change (upsert.reduce=false), one
   writer (coalesce(1): an exactly-once stream has one writer per micro-batch). S2 has no transactions (an append
   is atomic up to 1,000 records): a micro-batch of more changes goes out in several appends, and the next hop's
   reader, read-committed by default, stops at the last micro-batch committed, so a transaction reaches it whole.
2. S2 `bank` -> the table store's `balances` (upsert by id, one barrier per micro-batch).
3. `balances`' change feed -> PostgreSQL `balances_copy` and ClickHouse `balances_copy` in foreachBatch: each
   micro-batch reduced to the newest image per account (max_by over the Delta commit version), written as upserts
   of absolute values: PostgreSQL in one transaction (global-ordered, transactional) whose write id holds the
   micro-batch's id, so a replayed micro-batch commits nothing; ClickHouse into a ReplacingMergeTree(v), where a
   replayed micro-batch's rows (the same images) collapse.
4. S2 `bank` -> the Kafka topic `bank` with `sluice_kafka`, exactly-once (global-ordered, transactional: one Kafka
   transaction per micro-batch, its commit marker a consumer group's offset), one record per change keyed by the
   account, one writer (coalesce(1)) into a topic of one partition: a transaction's records become visible
   together only within a partition (each partition's last stable offset moves when its own commit marker is
   written), so the next hop never reads part of a micro-batch.
5. Kafka `bank` (read_committed) -> the table store's `balances_kafka` (upsert by id, one barrier per micro-batch):
   the Kafka branch, whose copy is held to the same invariant.
6. With --stores (bench/soak/stores.py), S2 `bank` -> Cassandra, OpenSearch and HBase, a query each: every change
   in stream order (the stream is one partition, so one task), written as an ordered upsert by id with the sink's
   micro-batch versions (Cassandra's and HBase's `write.timestamp=micro-batch`, OpenSearch's
   `write.version=micro-batch`) and its replay guard, so a replayed micro-batch never overwrites a later one's rows.
   A trigger every 5 s: fewer, larger micro-batches for three more queries on a small machine; they start once the
   other five run and each is through a micro-batch. In this process, not a second driver: one JVM less, and the
   driver's and workers' faults strike this branch too.

    python -m bench.soak.driver CONFIG.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    import pyspark.sql.functions as F

    import sluice

    spark = sluice.session("sluice-soak", **{"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    checkpoints = Path(config["checkpoints"])
    s2 = config["s2"]
    store = {"table": "balances", "warehouse": config["warehouse"], "meta": config["meta"]}

    def pg_to_s2():
        changes = spark.readStream.format("postgres_changes").option("url", config["pg_url"]) \
            .option("table", "accounts").option("slot", "soak_to_s2") \
            .load().select("id", "balance", "v", "_op")
        return changes.coalesce(1).writeStream.format("s2_upsert").options(**s2).options(**{
            "s2.stream": "bank", "s2.create-basin": "true", "s2.create-streams": "true", "primary-key": "id",
            "upsert.op-column": "_op", "upsert.reduce": "false", "sink.mode": "global-ordered",
            "sink.transactional": "true"}) \
            .option("checkpointLocation", str(checkpoints / "pg-to-s2")).start()

    def s2_to_store():
        rows = spark.readStream.format("s2_upsert").options(**s2).option("s2.streams", "bank") \
            .option("primary-key", "id").schema("id int, balance long, v long, _op string").load()
        return rows.writeStream.format("tablestore").options(**store) \
            .options(**{"primary-key": "id", "upsert.op-column": "_op"}) \
            .option("checkpointLocation", str(checkpoints / "s2-to-store")).start()

    def copy(batch, epoch_id: int) -> None:
        latest = batch.where("_change_type IN ('insert', 'update_postimage')").groupBy("id") \
            .agg(F.max_by(F.struct("balance", "v"), "_commit_version").alias("last")) \
            .select("id", "last.balance", "last.v").cache()
        try:
            # The micro-batch's id in the write id: a replayed micro-batch finds its commit and writes nothing.
            sluice.write(latest, "postgres", {"url": config["pg_url"], "table": "balances_copy",
                                              "primary-key": "id", "sink.mode": "global-ordered",
                                              "sink.transactional": "true", "sink.write-id": f"copy-{epoch_id}"})
            sluice.write(latest, "clickhouse", {"url": config["ch_url"], "password": config["ch_password"],
                                                "table": "balances_copy"})
        finally:
            latest.unpersist()

    def store_to_targets():
        feed = spark.readStream.format("tablestore").options(**store).option("changes", "true").load()
        return feed.writeStream.foreachBatch(copy).option("checkpointLocation", str(checkpoints / "to-targets")) \
            .start()

    kafka = {"kafka.bootstrap.servers": config["kafka"]["bootstrap"]}

    def s2_to_kafka():
        rows = spark.readStream.format("s2_upsert").options(**s2).option("s2.streams", "bank") \
            .option("primary-key", "id").schema("id int, balance long, v long, _op string").load()
        records = rows.coalesce(1).selectExpr("CAST(id AS STRING) AS key",
                                              "to_json(struct(id, balance, v, _op)) AS value")
        return records.writeStream.format("sluice_kafka").options(**kafka).options(**{
                "topic": config["kafka"]["topic"], "sink.mode": "global-ordered", "sink.transactional": "true"}) \
            .option("checkpointLocation", str(checkpoints / "s2-to-kafka")).start()

    def kafka_to_store():
        rows = spark.readStream.format("sluice_kafka").options(**kafka).option("subscribe", config["kafka"]["topic"]) \
            .load().selectExpr("from_json(CAST(value AS STRING), 'id int, balance long, v long, _op string') AS r") \
            .select("r.*")
        return rows.writeStream.format("tablestore").options(**{**store, "table": "balances_kafka"}) \
            .options(**{"primary-key": "id", "upsert.op-column": "_op"}) \
            .option("checkpointLocation", str(checkpoints / "kafka-to-store")).start()

    def s2_to_design_store(name: str, fmt: str, options: dict[str, str]):
        def start():
            rows = spark.readStream.format("s2_upsert").options(**s2).option("s2.streams", "bank") \
                .option("primary-key", "id").schema("id int, balance long, v long, _op string").load() \
                .select("id", "balance", "v")
            return rows.writeStream.format(fmt).options(**options).trigger(processingTime="5 seconds") \
                .option("checkpointLocation", str(checkpoints / f"s2-to-{name}")).start()
        return start

    design = {f"s2-to-{name}": s2_to_design_store(name, fmt, options)
              for name, (fmt, options) in config.get("stores", {}).items()}
    starts = {"pg-to-s2": pg_to_s2, "s2-to-store": s2_to_store, "to-targets": store_to_targets,
              "s2-to-kafka": s2_to_kafka, "kafka-to-store": kafka_to_store, **design}
    running: dict[str, object] = {}
    started_at: dict[str, float] = {}
    failures: dict[str, int] = {}  # a query's failures in a row, each within a minute of its start
    not_before: dict[str, float] = {}

    def main_through() -> bool:
        """Every query of the main pipeline running and through a micro-batch: the design stores' queries start
        then, not with the others (a start spawns Python workers, and eight at once starve a small machine)."""
        return all((q := running.get(name)) is not None and q.isActive and q.lastProgress is not None
                   for name in starts if name not in design)

    def backoff(name: str, now: float) -> None:
        """After a failure: the next start in 1 s, or 2, 4, 8, 10 s when the query failed again within a minute."""
        failures[name] = failures.get(name, 0) + 1 if now - started_at.get(name, 0.0) < 60 else 1
        not_before[name] = now + min(2 ** (failures[name] - 1), 10) - 1  # the loop's second: the first retry as before

    while True:
        starting = 0
        for name, start in starts.items():
            query = running.get(name)
            if query is not None and query.isActive:
                continue
            now = time.monotonic()
            if query is not None:
                error = query.exception()
                print(f"query {name} failed: {str(error).splitlines()[0][:300] if error else 'stopped'}", flush=True)
                running.pop(name)
                backoff(name, now)
            # At most two starts a second, and a query that keeps failing soon after its start waits longer each
            # time (up to 10 s): on a loaded machine, eight queries started again at once spawn Python workers
            # faster than they connect back to the JVM (Spark gives them 10 s), which fails the queries again.
            if now < not_before.get(name, 0.0) or starting >= 2 or (name in design and not main_through()):
                continue
            starting += 1
            started_at[name] = now
            try:
                running[name] = start()
                print(f"query {name} started", flush=True)
            except Exception as error:  # a store is down: try again on a later round
                print(f"query {name} did not start: {str(error).splitlines()[0][:300]}", flush=True)
                backoff(name, now)
        time.sleep(1.0)


if __name__ == "__main__":
    raise SystemExit(main())
