"""The store-independent sink engine (the sink-modes design and FLIP-509). Pure Python: importing it never imports
pyspark.

A store plugs in by implementing `Store.submit(batch) -> Future` and `Store.classify(error)` (and, where its client
takes many batches at once, `Store.submit_run(run)`);
`AsyncSinkWriter` does the buffering, batching, ordering, back-pressure, rate limiting and retries.
"""

from sluice.engine._batch import (
    AlignedBatchCreator,
    Batch,
    BatchCreator,
    BatchRun,
    PartitionKeyBatchCreator,
    RequestInfo,
    SimpleBatchCreator,
)
from sluice.engine._buffer import Chunk, DequeRequestBuffer, KeyedRequestBuffer, RequestBuffer
from sluice.engine._config import (
    GLOBAL_ORDERED,
    MODES,
    PARTITION_ORDERED,
    SINK_OPTIONS,
    SINK_SPEC,
    UNORDERED,
    SinkConfig,
)
from sluice.engine._ratelimit import AIMDRateLimiter
from sluice.engine._stats import LiveStats, WriteStats
from sluice.engine._store import BlockingStore, Committer, ErrorKind, Store, WriteContext, completed_future
from sluice.engine._writer import AsyncSinkWriter

__all__ = [
    "GLOBAL_ORDERED",
    "MODES",
    "PARTITION_ORDERED",
    "SINK_OPTIONS",
    "SINK_SPEC",
    "UNORDERED",
    "AIMDRateLimiter",
    "AlignedBatchCreator",
    "AsyncSinkWriter",
    "Batch",
    "BatchCreator",
    "BatchRun",
    "BlockingStore",
    "Chunk",
    "Committer",
    "DequeRequestBuffer",
    "ErrorKind",
    "KeyedRequestBuffer",
    "LiveStats",
    "PartitionKeyBatchCreator",
    "RequestBuffer",
    "RequestInfo",
    "SimpleBatchCreator",
    "SinkConfig",
    "Store",
    "WriteContext",
    "WriteStats",
    "completed_future",
]
