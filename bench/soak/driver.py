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


class Hops:
    """The bank pipeline's streaming queries, each started by a method of its own (on its checkpoint)."""

    SCHEMA = "id int, balance long, v long, _op string"

    def __init__(self, spark, config: dict) -> None:
        self.spark, self.config = spark, config
        self.checkpoints = Path(config["checkpoints"])
        self.s2 = config["s2"]
        self.store = {"table": "balances", "warehouse": config["warehouse"], "meta": config["meta"]}
        self.kafka = {"kafka.bootstrap.servers": config["kafka"]["bootstrap"]}

    def bank_stream(self):
        return self.spark.readStream.format("s2_upsert").options(**self.s2).option("s2.streams", "bank") \
            .option("primary-key", "id").schema(self.SCHEMA).load()

    def pg_to_s2(self):
        changes = self.spark.readStream.format("postgres_changes").option("url", self.config["pg_url"]) \
            .option("table", "accounts").option("slot", "soak_to_s2") \
            .load().select("id", "balance", "v", "_op")
        return changes.coalesce(1).writeStream.format("s2_upsert").options(**self.s2).options(**{
            "s2.stream": "bank", "s2.create-basin": "true", "s2.create-streams": "true", "primary-key": "id",
            "upsert.op-column": "_op", "upsert.reduce": "false", "sink.mode": "global-ordered",
            "sink.transactional": "true"}) \
            .option("checkpointLocation", str(self.checkpoints / "pg-to-s2")).start()

    def s2_to_store(self):
        return self.bank_stream().writeStream.format("tablestore").options(**self.store) \
            .options(**{"primary-key": "id", "upsert.op-column": "_op"}) \
            .option("checkpointLocation", str(self.checkpoints / "s2-to-store")).start()

    def copy(self, batch, epoch_id: int) -> None:
        import pyspark.sql.functions as F

        import sluice

        latest = batch.where("_change_type IN ('insert', 'update_postimage')").groupBy("id") \
            .agg(F.max_by(F.struct("balance", "v"), "_commit_version").alias("last")) \
            .select("id", "last.balance", "last.v").cache()
        try:
            # The micro-batch's id in the write id: a replayed micro-batch finds its commit and writes nothing.
            sluice.write(latest, "postgres", {"url": self.config["pg_url"], "table": "balances_copy",
                                              "primary-key": "id", "sink.mode": "global-ordered",
                                              "sink.transactional": "true", "sink.write-id": f"copy-{epoch_id}"})
            sluice.write(latest, "clickhouse", {"url": self.config["ch_url"], "password": self.config["ch_password"],
                                                "table": "balances_copy"})
        finally:
            latest.unpersist()

    def store_to_targets(self):
        feed = self.spark.readStream.format("tablestore").options(**self.store).option("changes", "true").load()
        return feed.writeStream.foreachBatch(self.copy) \
            .option("checkpointLocation", str(self.checkpoints / "to-targets")).start()

    def s2_to_kafka(self):
        records = self.bank_stream().coalesce(1).selectExpr("CAST(id AS STRING) AS key",
                                                            "to_json(struct(id, balance, v, _op)) AS value")
        return records.writeStream.format("sluice_kafka").options(**self.kafka).options(**{
                "topic": self.config["kafka"]["topic"], "sink.mode": "global-ordered", "sink.transactional": "true"}) \
            .option("checkpointLocation", str(self.checkpoints / "s2-to-kafka")).start()

    def kafka_to_store(self):
        rows = self.spark.readStream.format("sluice_kafka").options(**self.kafka) \
            .option("subscribe", self.config["kafka"]["topic"]).load() \
            .selectExpr(f"from_json(CAST(value AS STRING), '{self.SCHEMA}') AS r").select("r.*")
        return rows.writeStream.format("tablestore").options(**{**self.store, "table": "balances_kafka"}) \
            .options(**{"primary-key": "id", "upsert.op-column": "_op"}) \
            .option("checkpointLocation", str(self.checkpoints / "kafka-to-store")).start()

    def s2_to_design_store(self, name: str, fmt: str, options: dict[str, str]):
        def start():
            rows = self.bank_stream().select("id", "balance", "v")
            return rows.writeStream.format(fmt).options(**options).trigger(processingTime="5 seconds") \
                .option("checkpointLocation", str(self.checkpoints / f"s2-to-{name}")).start()
        return start


class Supervisor:
    """Starts every query, and again from its checkpoint once it failed, as a production job's supervisor would."""

    def __init__(self, starts: dict, design: set[str]) -> None:
        self.starts, self.design = starts, design
        self.running: dict[str, object] = {}
        self.started_at: dict[str, float] = {}
        self.failures: dict[str, int] = {}  # a query's failures in a row, each within a minute of its start
        self.not_before: dict[str, float] = {}

    def main_through(self) -> bool:
        """Every query of the main pipeline running and through a micro-batch: the design stores' queries start
        then, not with the others (a start spawns Python workers, and eight at once starve a small machine)."""
        return all((q := self.running.get(name)) is not None and q.isActive and q.lastProgress is not None
                   for name in self.starts if name not in self.design)

    def backoff(self, name: str, now: float) -> None:
        """After a failure: the next start in 1 s, or 2, 4, 8, 10 s when the query failed again within a minute."""
        self.failures[name] = self.failures.get(name, 0) + 1 if now - self.started_at.get(name, 0.0) < 60 else 1
        # the loop's second: the first retry as before
        self.not_before[name] = now + min(2 ** (self.failures[name] - 1), 10) - 1

    def one_round(self) -> None:
        """Each query not running: its failure said, and started again when its time has come."""
        starting = 0
        for name, start in self.starts.items():
            query = self.running.get(name)
            if query is not None and query.isActive:
                continue
            now = time.monotonic()
            if query is not None:
                error = query.exception()
                print(f"query {name} failed: {str(error).splitlines()[0][:300] if error else 'stopped'}", flush=True)
                self.running.pop(name)
                self.backoff(name, now)
            # At most two starts a second, and a query that keeps failing soon after its start waits longer each
            # time (up to 10 s): on a loaded machine, eight queries started again at once spawn Python workers
            # faster than they connect back to the JVM (Spark gives them 10 s), which fails the queries again.
            if (now < self.not_before.get(name, 0.0) or starting >= 2
                    or (name in self.design and not self.main_through())):
                continue
            starting += 1
            self.started_at[name] = now
            try:
                self.running[name] = start()
                print(f"query {name} started", flush=True)
            except Exception as error:  # a store is down: try again on a later round
                print(f"query {name} did not start: {str(error).splitlines()[0][:300]}", flush=True)
                self.backoff(name, now)


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    import sluice

    spark = sluice.session("sluice-soak", **{"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    hops = Hops(spark, config)
    design = {f"s2-to-{name}": hops.s2_to_design_store(name, fmt, options)
              for name, (fmt, options) in config.get("stores", {}).items()}
    starts = {"pg-to-s2": hops.pg_to_s2, "s2-to-store": hops.s2_to_store, "to-targets": hops.store_to_targets,
              "s2-to-kafka": hops.s2_to_kafka, "kafka-to-store": hops.kafka_to_store, **design}
    supervisor = Supervisor(starts, set(design))
    while True:
        supervisor.one_round()
        time.sleep(1.0)


if __name__ == "__main__":
    raise SystemExit(main())
