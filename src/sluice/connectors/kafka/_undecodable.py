"""Records a read cannot decode (a key or value not in the schema registry's wire format, of a schema id the registry
does not have, or whose body does not decode), sent to the dead-letter target with errors.tolerance=all instead of
failing the read; the read yields the others.

The driver plans the target once (`plan_dead_letters`) and the split reader carries it (`ReadRefusals`, pickled to
the executors). Each split read opens the target's writer: a dead letter is the Kafka record (topic, partition,
offset, timestamp, key and value, as text or base64) as JSON with the reason naming its offset, written as it is
found; the split's read ends by committing them (DeadLetterWriter.commit). A read task retried, or a micro-batch
replayed, sends its dead letters again: at least once, except to a transactional sluice_kafka target, whose commit
per (read, micro-batch, task) is made once (its marker, as the sink's exactly-once writes: the same records in the
same order are found again). errors.max-records and errors.max-ratio bound each split read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sluice.connector import (
    DeadLetterRoute,
    DeadLetterWriter,
    ErrorPolicy,
    SluiceError,
    task_context,
)
from sluice.connectors.kafka._decode import BadPayloadError


@dataclass(frozen=True)
class ReadRefusals:
    """A read's dead-letter route and bounds, planned on the driver. `read_id`: the read's own id (a batch read's; a
    stream's tasks take their query id and micro-batch from Spark)."""

    route: DeadLetterRoute
    policy: ErrorPolicy
    read_id: str
    streaming: bool

    def open(self, split_id: str, topic: str, partition: int) -> SplitRefusals:
        context = task_context(self.read_id, self.streaming)
        # The dead letters' own write: one per (read or micro-batch, task). Not the query's id itself: a sink of the
        # same query (a transactional sluice_kafka one) has transactional ids and markers by it.
        base = context.write_id if context.epoch is None else f"{context.write_id}-{context.epoch}"
        context = replace(context, write_id=f"{base}-source", epoch=None)
        return SplitRefusals(self.route.open(context, f"topic {topic} partition {partition}"), self.policy, split_id)


class SplitRefusals:
    """One split read's dead letters: `add` sends a fetch's undecodable records aside and gives the others back."""

    def __init__(self, letters: DeadLetterWriter, policy: ErrorPolicy, split_id: str) -> None:
        self.letters = letters
        self.policy = policy
        self.split_id = split_id
        self.refused = 0
        self.seen = 0  # records fetched by the split read so far (the reader counts them)

    def add(self, error: BadPayloadError, records: list[Any], offsets: np.ndarray) -> tuple[list[Any], np.ndarray]:
        """Send `error.positions`'s records of a fetch aside; the fetch's other records and offsets."""
        reasons: list[BaseException] = list(error.errors) if len(error.errors) == len(error.positions) else \
            [error] * len(error.positions)
        found = dict(sorted(zip(error.positions, reasons, strict=True)))
        bad = list(found)
        rows = [{"topic": records[i].topic(), "partition": records[i].partition(), "offset": int(offsets[i]),
                 "timestamp": records[i].timestamp()[1], "key": records[i].key(), "value": records[i].value()}
                for i in bad]
        self.letters.add(rows, list(found.values()))
        self.letters.drain()
        self.refused += len(bad)
        bound = self.policy.over_bound(self.refused, self.seen)
        if bound is not None:
            raise SluiceError(f"kafka: reading {self.split_id}: {bound}")
        keep = np.ones(len(records), bool)
        keep[bad] = False
        return [r for r, k in zip(records, keep, strict=True) if k], offsets[keep]

    def commit(self) -> None:
        self.letters.commit()

    def close(self) -> None:
        self.letters.close()
