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
  only      the steps to run, of STEPS (default: all of them)
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


class Run:
    """One run's shared values; each method below is a step, named as `STEPS` lists it."""

    def __init__(self, spark, cfg: dict) -> None:
        self.spark, self.cfg = spark, cfg
        self.tag = uuid.uuid4().hex[:8]
        self.expected = list(range(100))
        self.rows = spark.range(0, 100, 1, 4).selectExpr("id", "concat('n', id) AS name")
        self.s2 = {"s2.basin": f"deploy-{self.tag}", "s2.endpoints.account": cfg["s2"],
                   "s2.endpoints.basin": cfg["s2"], "s2.auth-token": "local"}
        self.created = {"s2.create-basin": "true", "s2.create-streams": "true"}
        self.out: dict = {}

    def sluice_null(self) -> None:
        self.rows.write.format("sluice_null").mode("append").save()
        self.out["sluice_null"] = summary(self.spark, self.cfg, "sluice_null")["records"]

    def one_call(self) -> None:
        """The one-call path; it must not fan out to spark.sql.shuffle.partitions (200)."""
        if self.cfg["session"] == "plain":  # a plain session never imports sluice
            return
        import sluice

        sluice.write(self.rows, "sluice_null", {"sink.mode": "partition-ordered", "sink.partition-key": "id"})
        self.out["one_call_tasks"] = summary(self.spark, self.cfg, "sluice_null")["tasks"]

    def s2_stream(self) -> None:
        spark, s2 = self.spark, self.s2
        self.rows.write.format("s2").options(**s2, **self.created).option("s2.stream", "rows").mode("append").save()
        read = spark.read.format("s2").options(**s2).option("s2.streams", "rows").option("format", "json") \
            .schema("id long, name string").load()
        self.out["s2"] = ids(read) == self.expected
        self.out["s2_summary"] = summary(spark, self.cfg, "s2")["records"]

    def s2_upsert(self) -> None:
        self.rows.write.format("s2_upsert").options(**self.s2, **self.created).option("s2.stream", "changes") \
            .option("primary-key", "id").mode("append").save()
        state = self.spark.read.format("s2_upsert").options(**self.s2).option("s2.streams", "changes") \
            .option("primary-key", "id").schema("id long, name string").load()
        self.out["s2_upsert"] = ids(state) == self.expected

    def postgres(self) -> None:
        url = self.cfg["pg"]
        table = f"deploy_{self.tag}"
        self.rows.write.format("postgres").options(url=url, table=table, **{"create-table": "true"}) \
            .mode("append").save()
        self.out["postgres"] = ids(self.spark.read.format("postgres").option("url", url).option("table", table)
                                   .load()) == self.expected

    def postgres_changes(self) -> None:
        """The table's snapshot (micro-batch 0), then one transaction after it, streamed into an upsert table by two
        AvailableNow runs of one query (the second resumes from the checkpoint, on the driver's machine)."""
        spark, url = self.spark, self.cfg["pg"]
        source, target = f"deploy_cdc_{self.tag}", f"deploy_cdc_out_{self.tag}"
        self.rows.write.format("postgres").options(url=url, table=source, **{"create-table": "true",
                                                                             "primary-key": "id"}) \
            .mode("append").save()

        def stream_changes() -> None:
            changes = spark.readStream.format("postgres_changes").option("url", url).option("table", source).load()
            changes.select("id", "name", "_op").writeStream.format("postgres").options(
                url=url, table=target, **{"create-table": "true", "primary-key": "id", "upsert.op-column": "_op"}) \
                .option("checkpointLocation", f"{self.cfg['warehouse']}/checkpoint-{target}") \
                .trigger(availableNow=True).start().awaitTermination()

        stream_changes()
        spark.range(100, 110, 1, 1).selectExpr("id", "concat('n', id) AS name").write.format("postgres") \
            .option("url", url).option("table", source).mode("append").save()
        stream_changes()
        self.out["postgres_changes"] = ids(spark.read.format("postgres").option("url", url).option("table", target)
                                           .load()) == list(range(110))

    def clickhouse(self) -> None:
        ch = {"url": self.cfg["ch"]["url"], "password": self.cfg["ch"]["password"], "table": f"deploy_{self.tag}"}
        clickhouse_sql(self.cfg["ch"],
                       f"CREATE TABLE {ch['table']} (id Int64, name String) ENGINE = MergeTree() ORDER BY id")
        self.rows.write.format("clickhouse").options(**ch).mode("append").save()
        self.out["clickhouse"] = ids(self.spark.read.format("clickhouse").options(**ch).load()) == self.expected

    def _upsert_by_key(self, format_name: str, key: str, writing: dict[str, str]) -> None:
        """Upserts into a table shared by every run: the names carry this run's tag, so what is read back was
        written by this run."""
        tagged = self.spark.range(0, 100, 1, 4).selectExpr("id", f"concat('{self.tag}-', id) AS name")
        tagged.write.format(format_name).options(**self.cfg[key], **writing).mode("append").save()
        reading = self.spark.read.format(format_name).options(**self.cfg[key])
        back = (reading.schema("id long, name string") if format_name == "hbase" else reading).load()
        self.out[format_name] = sorted((int(r["id"]), r["name"]) for r in back.select("id", "name").collect()) \
            == [(i, f"{self.tag}-{i}") for i in self.expected]

    def cassandra(self) -> None:
        self._upsert_by_key("cassandra", "cassandra", {})

    def elasticsearch(self) -> None:
        self._upsert_by_key("elasticsearch", "search", {"mapping.id": "id", "write.refresh": "true"})

    def hbase(self) -> None:
        self._upsert_by_key("hbase", "hbase", {})

    def sluice_kafka(self) -> None:
        """Exactly-once into a topic of this run's own (the sink never creates topics), read back by a batch read
        (read_committed by default)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        kafka = {"kafka.bootstrap.servers": self.cfg["kafka"]}
        topic = f"deploy-{self.tag}"
        admin = AdminClient({"bootstrap.servers": self.cfg["kafka"]})  # kept while its request runs
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(60)
        self.rows.selectExpr("CAST(id AS STRING) AS key", "name AS value").write.format("sluice_kafka") \
            .options(**kafka).option("topic", topic).option("sink.mode", "global-ordered") \
            .option("sink.transactional", "true").mode("append").save()
        back = self.spark.read.format("sluice_kafka").options(**kafka).option("subscribe", topic).load() \
            .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value").collect()
        self.out["sluice_kafka"] = sorted((int(r["key"]), r["value"]) for r in back) \
            == [(i, f"n{i}") for i in self.expected]

    def tablestore(self) -> None:
        store = {"table": f"deploy_{self.tag}", "warehouse": self.cfg["warehouse"], "meta": self.cfg["meta"]}
        self.rows.write.format("tablestore").options(**store).mode("append").save()
        self.out["tablestore"] = ids(self.spark.read.format("tablestore").options(**store).load()) == self.expected

    def sql(self) -> None:
        if not self.cfg.get("sql"):
            return
        spark = self.spark
        quoted = ", ".join(f"`{k}` '{v}'" for k, v in {**self.s2, **self.created, "s2.stream": "sql"}.items())
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW s2_out (id BIGINT, name STRING) USING s2 OPTIONS ({quoted})")
        spark.sql("INSERT INTO s2_out SELECT id, concat('n', id) AS name FROM range(100)")
        quoted = ", ".join(f"`{k}` '{v}'" for k, v in {**self.s2, "s2.streams": "sql", "format": "json"}.items())
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW s2_in (id BIGINT, name STRING) USING s2 OPTIONS ({quoted})")
        self.out["sql"] = ids(spark.sql("SELECT id FROM s2_in")) == self.expected

    def probes(self) -> None:
        """Which interpreter ran the Python workers, and which sluice (a cluster picks its own; see its test)."""
        from pyspark.sql.functions import udf

        probe = udf(lambda _: __import__("os").environ.get("SLUICE_TEST_PYTHON_LABEL", "unlabelled") + "\n"
                    + __import__("importlib.util").util.find_spec("sluice").origin, "string")
        label, origin = self.spark.range(1).select(probe("id")).collect()[0][0].split("\n")
        self.out["tasks_python"], self.out["tasks_sluice"] = label, origin


STEPS = ("sluice_null", "one_call", "s2_stream", "s2_upsert", "postgres", "postgres_changes", "clickhouse",
         "cassandra", "elasticsearch", "hbase", "sluice_kafka", "tablestore", "sql", "probes")
# What a Spark Connect client changes: the write summaries read on another machine, the one-call path, a batch
# write and read, a streaming query and its checkpoint. Each format's own code runs on the server as it runs in a
# plain session of the same line, which tests/deploy/test_installed.py drives through every step.
CONNECT_STEPS = ("sluice_null", "one_call", "s2_stream", "postgres_changes")


def run(spark, cfg: dict) -> dict:
    step = Steps()
    steps = Run(spark, cfg)
    for name in cfg.get("only") or STEPS:
        getattr(steps, name)()
        step.done(name)
    steps.out["sluice_imported"] = "sluice" in sys.modules
    steps.out["pyspark"] = __import__("pyspark").__version__
    return steps.out


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
