"""Writes and reads back every sluice format from a SparkSession made as a user makes one; prints a RESULT line.

Run as a separate process by tests/deploy (never imported by pytest): from a fresh virtualenv holding the
wheel, on a standalone cluster, and as a Spark Connect client. Its argument is a JSON object:
  session   "plain" (SparkSession.builder, sluice never imported), "sluice" (sluice.session(master=...))
            or "connect" (SparkSession.builder.remote(...), sluice imported only for last_write_summary)
  master / remote, conf      where the session goes
  s2, pg, ch, warehouse, meta    the stores (ch: ClickHouse's url and password)
  cassandra, search, hbase       the design's stores: each format's options naming a table (index) made before
                                 the run; every run rewrites the same keys with names of its own tag
  kafka     a Kafka broker's bootstrap servers: each run makes a topic of its own
  sql       also write and read through CREATE TEMPORARY VIEW ... USING (plain sessions)
"""

from __future__ import annotations

import json
import sys
import time
import uuid


def make_session(cfg: dict):
    if cfg["session"] == "sluice":
        import sluice

        return sluice.session("deploy-test", master=cfg["master"], **cfg.get("conf", {}))
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("deploy-test")
    builder = builder.remote(cfg["remote"]) if cfg["session"] == "connect" else builder.master(cfg["master"])
    for key, value in cfg.get("conf", {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def summary(spark, cfg: dict, format_name: str) -> dict:
    if cfg["session"] == "connect":  # the public call; the driver is another machine
        import sluice

        found = sluice.last_write_summary(format_name)
    else:  # no sluice import: ask the driver through the registered-by-discovery format
        row = spark.read.format("sluice_summary").option("format", format_name).load().collect()[0]
        found = json.loads(row["summary"]) if row["summary"] else None
    assert found is not None, f"no summary for {format_name}"
    return found


def clickhouse_sql(ch: dict, sql: str) -> None:
    """One statement over ClickHouse's HTTP interface with the standard library (a plain session imports no sluice)."""
    import base64
    import urllib.request

    auth = "Basic " + base64.b64encode(f"default:{ch['password']}".encode()).decode()
    urllib.request.urlopen(urllib.request.Request(ch["url"], data=sql.encode(), headers={"Authorization": auth}))


def ids(df, column: str = "id") -> list[int]:
    return sorted(int(r[0]) for r in df.select(column).collect())


class Steps:
    """Prints each step's seconds as it ends (`STEP name seconds`): a run cut off by a timeout shows how far it got,
    and a slow run shows where its time went."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def done(self, name: str) -> None:
        now = time.monotonic()
        print(f"STEP {name} {now - self.last:.1f}", flush=True)
        self.last = now


def run(spark, cfg: dict) -> dict:
    step = Steps()
    tag = uuid.uuid4().hex[:8]
    expected = list(range(100))
    rows = spark.range(0, 100, 1, 4).selectExpr("id", "concat('n', id) AS name")
    out: dict = {}

    rows.write.format("sluice_null").mode("append").save()
    out["sluice_null"] = summary(spark, cfg, "sluice_null")["records"]
    step.done("sluice_null")
    if cfg["session"] != "plain":  # the one-call path; it must not fan out to spark.sql.shuffle.partitions (200)
        import sluice

        sluice.write(rows, "sluice_null", {"sink.mode": "partition-ordered", "sink.partition-key": "id"})
        out["one_call_tasks"] = summary(spark, cfg, "sluice_null")["tasks"]
        step.done("one_call")

    s2 = {"s2.basin": f"deploy-{tag}", "s2.endpoints.account": cfg["s2"], "s2.endpoints.basin": cfg["s2"],
          "s2.auth-token": "local"}
    created = {"s2.create-basin": "true", "s2.create-streams": "true"}
    rows.write.format("s2").options(**s2, **created).option("s2.stream", "rows").mode("append").save()
    read = spark.read.format("s2").options(**s2).option("s2.streams", "rows").option("format", "json") \
        .schema("id long, name string").load()
    out["s2"] = ids(read) == expected
    out["s2_summary"] = summary(spark, cfg, "s2")["records"]
    step.done("s2")

    rows.write.format("s2_upsert").options(**s2, **created).option("s2.stream", "changes") \
        .option("primary-key", "id").mode("append").save()
    state = spark.read.format("s2_upsert").options(**s2).option("s2.streams", "changes") \
        .option("primary-key", "id").schema("id long, name string").load()
    out["s2_upsert"] = ids(state) == expected
    step.done("s2_upsert")

    pg = {"url": cfg["pg"], "table": f"deploy_{tag}", "create-table": "true"}
    rows.write.format("postgres").options(**pg).mode("append").save()
    out["postgres"] = ids(spark.read.format("postgres").option("url", cfg["pg"]).option("table", pg["table"]).load()) \
        == expected
    step.done("postgres")

    # Change capture: the table's snapshot (micro-batch 0), then one transaction after it, streamed into an upsert
    # table by two AvailableNow runs of one query (the second resumes from the checkpoint, on the driver's machine).
    source, target = f"deploy_cdc_{tag}", f"deploy_cdc_out_{tag}"
    rows.write.format("postgres").options(url=cfg["pg"], table=source, **{"create-table": "true",
                                                                          "primary-key": "id"}).mode("append").save()

    def stream_changes() -> None:
        changes = spark.readStream.format("postgres_changes").option("url", cfg["pg"]).option("table", source).load()
        changes.select("id", "name", "_op").writeStream.format("postgres").options(
            url=cfg["pg"], table=target, **{"create-table": "true", "primary-key": "id", "upsert.op-column": "_op"}) \
            .option("checkpointLocation", f"{cfg['warehouse']}/checkpoint-{target}").trigger(availableNow=True) \
            .start().awaitTermination()

    stream_changes()
    step.done("postgres_changes run 1")
    spark.range(100, 110, 1, 1).selectExpr("id", "concat('n', id) AS name").write.format("postgres") \
        .option("url", cfg["pg"]).option("table", source).mode("append").save()
    stream_changes()
    step.done("postgres_changes run 2")
    out["postgres_changes"] = ids(spark.read.format("postgres").option("url", cfg["pg"]).option("table", target)
                                  .load()) == list(range(110))
    step.done("postgres_changes read back")

    ch = {"url": cfg["ch"]["url"], "password": cfg["ch"]["password"], "table": f"deploy_{tag}"}
    clickhouse_sql(cfg["ch"], f"CREATE TABLE {ch['table']} (id Int64, name String) ENGINE = MergeTree() ORDER BY id")
    rows.write.format("clickhouse").options(**ch).mode("append").save()
    out["clickhouse"] = ids(spark.read.format("clickhouse").options(**ch).load()) == expected
    step.done("clickhouse")

    # Upserts by key into tables shared by every run: the names carry this run's tag, so what is read back was
    # written by this run.
    tagged = spark.range(0, 100, 1, 4).selectExpr("id", f"concat('{tag}-', id) AS name")
    writing = {"elasticsearch": {"mapping.id": "id", "write.refresh": "true"}}
    for format_name, key in (("cassandra", "cassandra"), ("elasticsearch", "search"), ("hbase", "hbase")):
        tagged.write.format(format_name).options(**cfg[key], **writing.get(format_name, {})).mode("append").save()
        reading = spark.read.format(format_name).options(**cfg[key])
        back = (reading.schema("id long, name string") if format_name == "hbase" else reading).load()
        out[format_name] = sorted((int(r["id"]), r["name"]) for r in back.select("id", "name").collect()) \
            == [(i, f"{tag}-{i}") for i in expected]
        step.done(format_name)

    # Exactly-once into a topic of this run's own (the sink never creates topics), read back by a batch read
    # (read_committed by default).
    from confluent_kafka.admin import AdminClient, NewTopic

    kafka = {"kafka.bootstrap.servers": cfg["kafka"]}
    topic = f"deploy-{tag}"
    admin = AdminClient({"bootstrap.servers": cfg["kafka"]})  # kept while its request runs
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(60)
    rows.selectExpr("CAST(id AS STRING) AS key", "name AS value").write.format("sluice_kafka").options(**kafka) \
        .option("topic", topic).option("sink.mode", "global-ordered").option("sink.transactional", "true") \
        .mode("append").save()
    back = spark.read.format("sluice_kafka").options(**kafka).option("subscribe", topic).load() \
        .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value").collect()
    out["sluice_kafka"] = sorted((int(r["key"]), r["value"]) for r in back) == [(i, f"n{i}") for i in expected]
    step.done("sluice_kafka")

    store = {"table": f"deploy_{tag}", "warehouse": cfg["warehouse"], "meta": cfg["meta"]}
    rows.write.format("tablestore").options(**store).mode("append").save()
    out["tablestore"] = ids(spark.read.format("tablestore").options(**store).load()) == expected
    step.done("tablestore")

    if cfg.get("sql"):
        quoted = ", ".join(f"`{k}` '{v}'" for k, v in {**s2, **created, "s2.stream": "sql"}.items())
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW s2_out (id BIGINT, name STRING) USING s2 OPTIONS ({quoted})")
        spark.sql("INSERT INTO s2_out SELECT id, concat('n', id) AS name FROM range(100)")
        quoted = ", ".join(f"`{k}` '{v}'" for k, v in {**s2, "s2.streams": "sql", "format": "json"}.items())
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW s2_in (id BIGINT, name STRING) USING s2 OPTIONS ({quoted})")
        out["sql"] = ids(spark.sql("SELECT id FROM s2_in")) == expected
        step.done("sql")

    from pyspark.sql.functions import udf

    # Which interpreter ran the Python workers (a cluster picks its own; see the cluster test).
    probe = udf(lambda _: __import__("os").environ.get("SLUICE_TEST_PYTHON_LABEL", "unlabelled"), "string")
    out["tasks_python"] = spark.range(1).select(probe("id")).collect()[0][0]
    where = udf(lambda _: __import__("importlib.util").util.find_spec("sluice").origin, "string")
    out["tasks_sluice"] = spark.range(1).select(where("id")).collect()[0][0]
    step.done("probes")
    out["sluice_imported"] = "sluice" in sys.modules
    out["pyspark"] = __import__("pyspark").__version__
    return out


def main() -> None:
    cfg = json.loads(sys.argv[1])
    started = time.monotonic()
    spark = make_session(cfg)
    print(f"STEP session {time.monotonic() - started:.1f}", flush=True)
    try:
        print("RESULT " + json.dumps(run(spark, cfg)), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
