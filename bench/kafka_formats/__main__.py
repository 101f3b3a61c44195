"""Typed Kafka payloads side by side: 1M Avro records in Confluent's wire format (15 fields: a decimal, a timestamp, a
date, a nested record, an array, an optional string; data.py), one broker (LocalKafka), one schema registry
(LocalSchemaRegistry, Apicurio's Confluent-compatible API), local[2], on the 4.2 line:

- source: the sluice source (value.format=avro-confluent) against Spark's own path, Spark's Kafka source then
  `from_avro(expr("substring(value, 6)"), schema)` (spark-avro), and against confluent-kafka's DeserializingConsumer
  with its AvroDeserializer in one process. Both Spark readers compute the same aggregate, the count and the
  bit_xor of xxhash64 over every decoded field, so nothing is pruned and equal figures mean equal values;
- sink: the sluice sink (value.format=avro-confluent, unordered) against Spark's `to_avro` with Confluent's header
  prepended (`concat(lit(header), to_avro(struct(...), schema))`) into Spark's Kafka sink, from the same cached
  DataFrame, both producers with the same settings (contenders.PRODUCER). Each topic written is read back by a
  read_committed consumer: the count, and every 1000th record decoded with fastavro and compared with what was made.

Protobuf beside Avro, sluice's only: the sluice sink (value.format=protobuf-confluent, the schema derived from the
DataFrame: decimals as strings, dates as days) and the sluice source reading back what it wrote, its checksum taken
over the fields converted back to decimal and date (so equal to the Avro readers' when every value survived).
Spark's from_protobuf is not in it: spark-protobuf_2.13 (4.2.0 or any other) is not served by the Maven Central
this project reaches.

The source topic is produced once, untimed (fastavro per record). Rounds rotate the contenders; each figure is the
best of --rounds, after one untimed run of each (Python workers, JVM classes, the registry's caches).

    make .venv-spark-4.2/.installed
    PIP_CONSTRAINT=$PWD/.venv-spark-4.2/constraints.txt .venv-spark-4.2/bin/pip install -q \
      'confluent-kafka[avro,schemaregistry]'
    .venv-spark-4.2/bin/pip wheel . --no-deps --no-build-isolation -q -w build/bench-wheel
    .venv-spark-4.2/bin/pip install -q --no-deps --force-reinstall build/bench-wheel/sluice-*.whl
    .venv-spark-4.2/bin/python -m bench.kafka_formats [--rows 1000000] [--rounds 3] [--only NAME,...]

Spark's Kafka and Avro connectors come by their coordinates from Maven Central (spark.jars.packages).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

from bench.contenders import rotate
from bench.latency.kafka_hop import SPARK_KAFKA, spark_kafka_conf
from bench.stores.kafka_sink_source import check_installed_sluice

SOURCES = ("spark from_avro", "confluent-kafka DeserializingConsumer", "sluice source")
SINKS = ("spark to_avro + kafka sink", "sluice sink")
PROTOBUF = ("sluice sink (protobuf)", "sluice source (protobuf)")  # spark-protobuf: not served (docstring)


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def spark_conf(pyspark_version: str) -> dict[str, str]:
    """Spark's Kafka connector (kafka_hop's Ivy settings: Maven Central alone) and spark-avro of the same line."""
    if ".".join(pyspark_version.split(".")[:2]) not in SPARK_KAFKA:
        raise SystemExit(f"bench.kafka_formats needs Spark's Kafka and Avro connectors, which Maven Central serves for "
                         f"Spark lines {', '.join(SPARK_KAFKA)}, not for pyspark {pyspark_version}: run it with "
                         ".venv-spark-4.2/bin/python (this file's docstring says how to make it).")
    conf = spark_kafka_conf(pyspark_version)
    kafka = conf["spark.jars.packages"]
    conf["spark.jars.packages"] = f"{kafka},{kafka.replace('spark-sql-kafka-0-10', 'spark-avro')}"
    return conf


def local_registry() -> Any:
    from sluice.testing import LocalSchemaRegistry

    return LocalSchemaRegistry(heap_mb=512)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--registry-url", default="",
                        help="Confluent's API of a running schema registry (default: a LocalSchemaRegistry of its own)")
    parser.add_argument("--only", default="", help=f"comma-separated contenders of {(*SOURCES, *SINKS, *PROTOBUF)}")
    args = parser.parse_args()
    only = [name for name in args.only.split(",") if name] or [*SINKS, *SOURCES, *PROTOBUF]
    unknown = set(only) - {*SOURCES, *SINKS, *PROTOBUF}
    if unknown:
        raise SystemExit(f"--only: unknown contender(s) {sorted(unknown)}; known: {(*SOURCES, *SINKS, *PROTOBUF)}")
    check_installed_sluice()

    import pyspark

    import sluice
    from bench.kafka_formats.contenders import AvroBench
    from bench.kafka_formats.data import orders
    from sluice.testing import LocalKafka

    conf = spark_conf(pyspark.__version__)
    spark = sluice.session("bench-kafka-formats", master="local[2]", **conf)
    started_load = load()
    times: dict[str, list[float]] = {name: [] for name in only}
    try:
        with LocalKafka(heap_mb=1024) as kafka, ExitStack() as stack:
            url = args.registry_url or stack.enter_context(local_registry()).ccompat_url
            bench = AvroBench(spark, kafka, url, orders(spark, args.rows), args.rows)
            if set(only) & set(SOURCES):  # the Avro readers' topic
                bench.produce_source()
            runs: dict[str, Callable[[], float]] = {
                "spark from_avro": bench.spark_from_avro,
                "confluent-kafka DeserializingConsumer": bench.deserializing_consumer,
                "sluice source": bench.sluice_source,
                "spark to_avro + kafka sink": bench.spark_to_avro,
                "sluice sink": bench.sluice_sink,
                "sluice sink (protobuf)": bench.sluice_sink_protobuf,
                "sluice source (protobuf)": bench.sluice_source_protobuf,
            }
            if "sluice source (protobuf)" in only:  # its topic: the Protobuf sink's first, untimed
                bench.sluice_sink_protobuf()
            for name in only:  # untimed
                print(f"  {name:40s} {runs[name]():7.2f} s (warm-up)", file=sys.stderr, flush=True)

            def timed(name: str) -> Callable[[], None]:
                def run() -> None:
                    times[name].append(runs[name]())
                    print(f"  {name:40s} {times[name][-1]:7.2f} s", file=sys.stderr, flush=True)
                return run

            rotate({name: timed(name) for name in only}, args.rounds)
    finally:
        spark.stop()
    print_table({name: min(seconds) for name, seconds in times.items()}, bench.checksums, args,
                pyspark.__version__, conf["spark.jars.packages"], started_load)
    return 0


def print_table(figures: dict[str, float], checksums: dict[str, int], args: argparse.Namespace, spark_version: str,
                packages: str, started_load: str) -> None:
    n = args.rows
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"kafka formats benchmark, {now}, {n:,} Avro records (15 fields) in Confluent's wire format, pyspark "
          f"{spark_version} with {packages}, {os.cpu_count()} cores, local[2], best of {args.rounds}; load average "
          f"(1/5/15 min) {started_load} at the start, {load()} at the end")
    print(f"| {'contender':40s} | seconds | records/s | ratio |")
    print(f"| {'-' * 40} | ---: | ---: | --- |")
    goals: dict[str, bool] = {}
    notes = dict.fromkeys(figures, "")
    if "sluice source" in figures:
        ours = figures["sluice source"]
        if "spark from_avro" in figures:
            ratio = figures["spark from_avro"] / ours
            notes["sluice source"] += f"{ratio:.2f}x Spark from_avro's rate (goal >= 1.0); "
            goals["source vs Spark from_avro >= 1.0x"] = ratio >= 1.0
        if "confluent-kafka DeserializingConsumer" in figures:
            ratio = figures["confluent-kafka DeserializingConsumer"] / ours
            notes["sluice source"] += f"{ratio:.2f}x the DeserializingConsumer's (goal >= 3.0)"
            goals["source vs DeserializingConsumer >= 3x"] = ratio >= 3.0
    if "sluice sink" in figures and "spark to_avro + kafka sink" in figures:
        ratio = figures["spark to_avro + kafka sink"] / figures["sluice sink"]
        notes["sluice sink"] = f"{ratio:.2f}x Spark to_avro + kafka sink's rate (goal >= 1.0)"
        goals["sink vs Spark to_avro + kafka sink >= 1.0x"] = ratio >= 1.0
    for kind in ("sink", "source"):
        avro, protobuf = figures.get(f"sluice {kind}"), figures.get(f"sluice {kind} (protobuf)")
        if avro and protobuf:
            notes[f"sluice {kind} (protobuf)"] = f"{avro / protobuf:.2f}x the sluice {kind}'s rate with Avro"
    for name, seconds in figures.items():
        print(f"| {name:40s} | {seconds:.2f} | {n / seconds:,.0f} | {notes[name].rstrip('; ')} |")
    if len(set(checksums.values())) > 1:
        print(f"checksums DIFFER (the readers decode different values or types): {checksums}")
    elif checksums:
        print(f"checksums equal: {', '.join(checksums)} decode the same values")
    print("goals: " + "; ".join(f"{goal}: {'met' if ok else 'NOT met'}" for goal, ok in goals.items()))


if __name__ == "__main__":
    raise SystemExit(main())
