"""Streaming reads by a tracking field (docs/tracking.md), OpenSearch: throughput against the batch read of the same
documents, and freshness from the writer's clock to arrival at a writer-controlled rate. One run, one throwaway node
(LocalOpenSearch, 1 GiB heap). Run through bench/tracking/: `flock /tmp/sluice-bench.lock .venv/bin/python -m
bench.tracking --store opensearch [--rows 200000] [--rate 1000] [--seconds 20]`.

- throughput (best of --rounds, alternating): N documents of (id long, at date, payload keyword) in an index of one
  shard, bulk-indexed by this process and refreshed; the batch read (format("elasticsearch"), one slice per shard)
  and the stream (tracking.column=at, tracking.tie-breaker=id, window 0, Trigger.AvailableNow: one micro-batch,
  tasks of tracking.rows-per-task documents) both into Spark's noop sink; documents/s of each;
- freshness: one writer bulk-indexes `--rate` documents/s (a bulk of rate/20 every 50 ms, `at` = the writer's clock
  in milliseconds) into an index with the default refresh_interval (1 s) for `--seconds`; the stream (default
  trigger) hands each micro-batch to foreachBatch, which notes now - at of every document: p50/p99 per lag window.
"""

from __future__ import annotations

import json
import time

import urllib3

from bench.tracking.measures import alternating, arrivals, paced


def bulk(http: urllib3.PoolManager, url: str, index: str, first: int, count: int, now_ms: int | None = None,
         refresh: bool = False) -> None:
    lines = []
    for i in range(first, first + count):
        at = now_ms if now_ms is not None else 1_767_225_600_000 + i  # one document per millisecond
        lines.append(f'{{"index":{{"_id":"{i}"}}}}\n{json.dumps({"id": i, "at": at, "payload": "x" * 40})}\n')
    response = http.request("POST", f"{url}/{index}/_bulk" + ("?refresh=true" if refresh else ""),
                            body="".join(lines).encode(), headers={"Content-Type": "application/x-ndjson"})
    if response.status != 200 or b'"errors":false' not in response.data[:200]:
        raise SystemExit(f"bulk into {index} failed: {response.status} {response.data[:300]!r}")


def create(http: urllib3.PoolManager, url: str, index: str, refresh_interval: str) -> None:
    body = {"settings": {"number_of_shards": 1, "number_of_replicas": 0, "refresh_interval": refresh_interval},
            "mappings": {"properties": {"id": {"type": "long"}, "at": {"type": "date"},
                                        "payload": {"type": "keyword"}}}}
    response = http.request("PUT", f"{url}/{index}", body=json.dumps(body).encode(),
                            headers={"Content-Type": "application/json"})
    if response.status != 200:
        raise SystemExit(f"could not create {index}: {response.data[:300]!r}")


def run(args) -> None:
    import sluice
    from sluice.testing import LocalOpenSearch

    http = urllib3.PoolManager()
    with LocalOpenSearch(heap="1g") as server:
        url = server.url
        spark = sluice.session("bench-tracking-opensearch", master="local[2]")
        create(http, url, "bulk", "-1")
        for first in range(0, args.rows, 5000):
            bulk(http, url, "bulk", first, min(5000, args.rows - first))
        http.request("POST", f"{url}/bulk/_refresh")
        opts = {"nodes": url, "index": "bulk"}

        def batch() -> float:
            started = time.perf_counter()
            spark.read.format("elasticsearch").options(**opts).load().write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        def stream() -> float:
            started = time.perf_counter()
            query = (spark.readStream.format("elasticsearch").options(**opts).option("tracking.column", "at")
                     .option("tracking.tie-breaker", "id").option("tracking.lag-window-ms", "0").load()
                     .writeStream.format("noop").trigger(availableNow=True).start())
            query.awaitTermination()
            assert sum(p["numInputRows"] for p in query.recentProgress) == args.rows
            return time.perf_counter() - started

        batch_s, stream_s, runs = alternating(args.rounds, batch, stream)
        print(f"throughput, {args.rows:,} documents, best of {args.rounds} (all: {runs}): batch read "
              f"{args.rows / batch_s:,.0f} docs/s ({batch_s:.1f} s), stream (AvailableNow) "
              f"{args.rows / stream_s:,.0f} docs/s ({stream_s:.1f} s, the first planning included)")
        for window in (int(w) for w in args.windows.split(",")):
            p50, p99, count = freshness(spark, http, url, window, args.rate, args.seconds)
            print(f"freshness at {args.rate:,} docs/s for {args.seconds} s, refresh_interval 1 s, lag window "
                  f"{window} ms: p50 {p50:,.0f} ms, p99 {p99:,.0f} ms ({count:,} documents)")
        spark.stop()


def freshness(spark, http: urllib3.PoolManager, url: str, window_ms: int, rate: int,
              seconds: int) -> tuple[float, float, int]:
    index = f"fresh-{window_ms}"
    create(http, url, index, "1s")
    lags, arrived = arrivals()
    query = (spark.readStream.format("elasticsearch").options(nodes=url, index=index).option("tracking.column", "at")
             .option("tracking.tie-breaker", "id").option("tracking.lag-window-ms", str(window_ms)).load()
             .writeStream.foreachBatch(arrived).start())
    written = 0

    def insert(n: int) -> None:
        nonlocal written
        bulk(http, url, index, written, n, now_ms=int(time.time() * 1000))
        written += n

    return paced(query, lags, insert, rate, seconds, window_ms, what="documents")
