"""A store killed under a streaming lookup (docs/lookup.md, Faults), as a user meets it: `sluice.lookup` over a
streaming DataFrame, two queries on the suite's Spark session (memory sinks), each micro-batch one JSON file of keys.
Both queries answer a first micro-batch from the live server; the server is SIGKILLed; the next micro-batch of the
query with lookup.max-retries=1 fails the query, naming the table and the server, with nothing written. The negative
control, the query with lookup.max-retries=10: its next micro-batch meets the same outage (the event: a client of a
Spark worker reaching the killed server's port, `wait_for_a_client`), the server is started again, and the
micro-batch is answered with the right rows."""

import json
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from threading import Thread
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

import sluice
from tests.faults import Striker, wait_for_a_client

Keys = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class Outage:
    """How a test kills its store and starts it again; `host:port` is where the lookups' clients connect."""

    kill: Callable[[], None]
    start: Callable[[], None]
    host: str
    port: int


@dataclass(frozen=True)
class Lookup:
    """A lookup of `column` by `on` over a stream of key rows typed by `schema` (a DDL string, keys first)."""

    format: str
    options: dict[str, str]
    on: Sequence[str]
    column: str
    schema: str


class _Stream:
    """One streaming query: `lookup` over JSON files of key rows (one file a micro-batch) into a memory sink."""

    def __init__(self, spark, workdir: Path, lookup: Lookup, retries: int) -> None:
        self.spark = spark
        self.src, self.staging = workdir / "in", workdir / "staging"
        self.src.mkdir(parents=True)
        self.staging.mkdir()
        self.name = f"lookup_kill_{uuid.uuid4().hex[:10]}"
        self.column = lookup.column
        stream = (spark.readStream.schema(f"{lookup.schema}, seq int").option("maxFilesPerTrigger", 1)
                  .json(str(self.src)))
        enriched = sluice.lookup(stream, lookup.format, {**lookup.options, "lookup.max-retries": str(retries)},
                                 on=list(lookup.on), columns=[lookup.column])
        self.query = (enriched.writeStream.format("memory").queryName(self.name)
                      .option("checkpointLocation", str(workdir / "checkpoint")).start())
        self.files = 0
        self.seq = 0

    def add(self, keys: Keys) -> None:
        """The next micro-batch's file, renamed into the source folder whole."""
        lines = []
        for key in keys:
            lines.append(json.dumps({**key, "seq": self.seq}))
            self.seq += 1
        staged = self.staging / f"{self.files}.json"
        staged.write_text("\n".join(lines) + "\n")
        os.replace(staged, self.src / staged.name)
        self.files += 1

    def written(self) -> list[Any]:
        """The looked-up column of every row the sink holds, in the input's order."""
        return [row[self.column] for row in sorted(self.spark.table(self.name).collect(), key=lambda r: r.seq)]


def a_store_killed_mid_stream(spark, workdir: Path, outage: Outage, lookup: Lookup, first: Keys, second: Keys,
                              answers: Sequence[Any]) -> str:
    """The killed-mid-stream test for one store. `first` and `second` are the key rows of the two micro-batches,
    `answers` the looked-up column's values for `first + second` (None for a missing key). Returns the failed
    query's error text, for the store's own checks (its table, its server, no password)."""
    few = many = healer = None
    struck = False
    try:
        few = _Stream(spark, workdir / "few", lookup, retries=1)
        many = _Stream(spark, workdir / "many", lookup, retries=10)
        for stream in (few, many):
            stream.add(first)
        for stream in (few, many):
            stream.query.processAllAvailable()  # the event: the first micro-batch answered and in the sink
            assert stream.written() == list(answers[:len(first)])
        outage.kill()
        struck = True
        few.add(second)
        with pytest.raises(StreamingQueryException) as failed:
            few.query.processAllAvailable()  # returns if the micro-batch was answered (with nulls): no failure
        assert few.written() == list(answers[:len(first)]), "the failed micro-batch wrote rows"

        def heal() -> None:
            try:
                wait_for_a_client(outage.host, outage.port)  # a lookup of the query met the outage
            finally:
                outage.start()

        healer = Striker(heal)
        healer.start()
        many.add(second)
        many.query.processAllAvailable()
        healer.join(300)
        assert many.written() == list(answers)
        return str(failed.value)
    finally:
        if healer is not None:  # ended (joined above) unless the test failed first: the test's failure is raised
            Thread.join(healer, 300)
        elif struck:
            outage.start()  # the store's fixture serves the module's later tests
        for stream in (few, many):
            if stream is not None:
                stream.query.stop()
