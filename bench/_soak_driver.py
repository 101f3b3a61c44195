"""The soak's Spark driver: the bank pipeline's five streaming queries (bench/soak.py starts this process, kills it
and starts it again on the same checkpoints). A query that fails is started again from its checkpoint a second
later, as the supervisor of a production job would; every start and failure is a line on stdout.

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

    python bench/_soak_driver.py CONFIG.json
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

    starts = {"pg-to-s2": pg_to_s2, "s2-to-store": s2_to_store, "to-targets": store_to_targets,
              "s2-to-kafka": s2_to_kafka, "kafka-to-store": kafka_to_store}
    running: dict[str, object] = {}
    while True:
        for name, start in starts.items():
            query = running.get(name)
            if query is not None and query.isActive:
                continue
            if query is not None:
                error = query.exception()
                print(f"query {name} failed: {str(error).splitlines()[0][:300] if error else 'stopped'}", flush=True)
            try:
                running[name] = start()
                print(f"query {name} started", flush=True)
            except Exception as error:  # a store is down: try again on the next round
                running.pop(name, None)
                print(f"query {name} did not start: {str(error).splitlines()[0][:300]}", flush=True)
        time.sleep(1.0)


if __name__ == "__main__":
    raise SystemExit(main())
