"""Helpers of the tracking-column stream tests of every store: one micro-batch driven the way Spark's loop drives a
stream reader, waiting for a stream's progress, and the Spark scenario of a query stopped and restarted."""

import time

import pyarrow as pa

from sluice.spark._compat import to_arrow_schema
from tests.faults import poll_until


def batch(reader, start, schema, limit=None):
    """One micro-batch as Spark runs it: (end offset, rows as a pyarrow Table)."""
    end = reader.latestOffset(start, limit or reader.getDefaultReadLimit())
    batches = [b for p in reader.partitions(start, end) for b in reader.read(p)]
    arrow = to_arrow_schema(schema)
    return end, pa.Table.from_batches(batches, schema=arrow) if batches else arrow.empty_table()


def drain(reader, start, schema, until, timeout=30.0, limit=None):
    """Micro-batches from `start` until `until(rows read so far)` holds: (end offset, every row read, in order,
    the sizes of the micro-batches that read any). The window holds rows back for a while: polled, with a
    deadline."""
    deadline = time.monotonic() + timeout
    tables, sizes = [], []
    while True:
        start, table = batch(reader, start, schema, limit)
        if table.num_rows:
            tables.append(table)
            sizes.append(table.num_rows)
        read = pa.concat_tables(tables) if tables else to_arrow_schema(schema).empty_table()
        if until(read):
            return start, read, sizes
        if time.monotonic() > deadline:
            raise AssertionError(f"the stream did not get there within {timeout} s; read {read.num_rows} rows")
        time.sleep(0.05)  # polled: the lag window settles by the clock


def committed_rows(out):
    """How many rows a file sink has committed, from its commit log (_spark_metadata: a JSON line per file) and
    the files' footers, without a Spark job (the waits poll it while the query has the cores)."""
    import json
    from urllib.parse import unquote, urlparse

    import pyarrow.parquet as pq

    log = out / "_spark_metadata"
    if not log.is_dir():
        return 0
    paths = set()
    for entry in log.iterdir():
        if entry.name.isdigit():
            for line in entry.read_text().splitlines()[1:]:  # the first line is the log's version
                paths.add(unquote(urlparse(json.loads(line)["path"]).path))
    return sum(pq.read_metadata(path).num_rows for path in paths)


def parquet_rows(spark, out):
    """The rows a file sink committed (its commit log, _spark_metadata, says which files count)."""
    log = out / "_spark_metadata"
    if not log.is_dir() or not any(p.name.isdigit() for p in log.iterdir()):
        return []
    return spark.read.parquet(str(out)).collect()


def run_stop_and_restart(spark, frame, tmp_path, while_running, while_stopped, what="rows"):
    """The Spark scenario of every store's stream test: `frame()` (the streaming DataFrame; 20 rows already in the
    store) runs into Parquet until 20 rows are committed, `while_running()` writes 10 more and they arrive, the query
    stops, `while_stopped()` writes 10 more, and an AvailableNow restart on the checkpoint reads them. Returns the
    sizes of the first run's micro-batches and every id committed, sorted."""
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    def start(trigger):
        return (frame().writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())

    query = start({"processingTime": "100 milliseconds"})
    try:
        poll_until(lambda: committed_rows(out) >= 20, 90, f"the first 20 {what}", 0.2)
        while_running()
        poll_until(lambda: committed_rows(out) >= 30, 90, f"the {what} written while the query ran", 0.2)
        # The sink commits a micro-batch before Spark's own commit log does: stopped in between, the restart would
        # replay it, and that replay is all of AvailableNow's single micro-batch on Spark 4.0/4.1 (docs/tracking.md).
        query.processAllAvailable()
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert query.exception() is None
    finally:
        query.stop()
    while_stopped()
    again = start({"availableNow": True})
    assert again.awaitTermination(120)
    assert again.exception() is None
    return sizes, sorted(r.id for r in parquet_rows(spark, out))
