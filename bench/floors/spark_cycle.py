"""Spark's own floor for bench/latency/: the shortest micro-batch cycle of a query with nothing to do."""

from __future__ import annotations

import os
import statistics

import pyarrow as pa


def spark_floor(spark, workdir: str, batches: int = 20) -> dict[str, float]:
    """Median micro-batch cycle with nothing to do, and the medians of its phases (Spark's durationMs): a minimal
    Python source into a Python sink, and the JVM's rate source into noop, both with the default trigger."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        InputPartition,
        WriterCommitMessage,
    )

    class TickReader(DataSourceStreamReader):
        def __init__(self) -> None:
            self.tick = 0

        def initialOffset(self) -> dict:
            return {"tick": 0}

        def latestOffset(self) -> dict:
            self.tick += 1  # one new row per batch: every batch has input
            return {"tick": self.tick}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            return [InputPartition(end["tick"])]

        def read(self, partition):
            yield pa.RecordBatch.from_pydict({"tick": [partition.value]})

    class TickWriter(DataSourceStreamWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batch_id) -> None:
            pass

        def abort(self, messages, batch_id) -> None:
            pass

    class Tick(DataSource):
        @classmethod
        def name(cls) -> str:
            return "latency_tick"

        def schema(self) -> str:
            return "tick long"

        def streamReader(self, schema):
            return TickReader()

        def streamWriter(self, schema, overwrite):
            return TickWriter()

    spark.dataSource.register(Tick)
    out = {}
    for label, reader, sink in (("python_source_into_python_sink", spark.readStream.format("latency_tick"),
                                 "latency_tick"),
                                ("jvm_rate_into_noop", spark.readStream.format("rate").option("rowsPerSecond", 1000),
                                 "noop")):
        query = (reader.load().writeStream.format(sink)
                 .option("checkpointLocation", os.path.join(workdir, f"floor-{label}")).start())
        try:
            while len([p for p in query.recentProgress if p.numInputRows]) < batches + 5:
                query.awaitTermination(0.5)
            busy = [p.durationMs for p in query.recentProgress if p.numInputRows][5:]
        finally:
            query.stop()
        out[f"{label}_cycle_p50_ms"] = statistics.median(d["triggerExecution"] for d in busy)
        out[f"{label}_phases_median_ms"] = {phase: statistics.median(d.get(phase, 0) for d in busy)
                                            for phase in sorted(busy[0])}
    return out
