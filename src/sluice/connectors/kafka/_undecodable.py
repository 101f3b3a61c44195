"""Records a read cannot decode (a key or value not in the schema registry's wire format, of a schema id the registry
does not have, or whose body does not decode), sent to the dead-letter target with errors.tolerance=all instead of
failing the read; the read yields the others.

The driver plans the target once (`SourceDataSource.dead_letters`) and each split read runs inside the SDK's
`read_with_letters`, which opens the task's dead-letter writer, checks errors.max-records / errors.max-ratio per read
task and commits the dead letters when the split is read. A dead letter is the Kafka record (topic, partition,
offset, timestamp, key and value, as text or base64) as JSON, its reason naming the offset. A read task retried, or
a micro-batch replayed, sends its dead letters again: at least once (docs/reliability.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sluice.connector import DeadLetterWriter
from sluice.connectors.kafka._decode import BadPayloadError


def set_aside(letters: DeadLetterWriter, error: BadPayloadError, records: list[Any],
              offsets: np.ndarray) -> tuple[list[Any], np.ndarray]:
    """Send `error.positions`'s records of a fetch aside; the fetch's other records and their offsets."""
    reasons: list[BaseException] = list(error.errors) if len(error.errors) == len(error.positions) else \
        [error] * len(error.positions)
    found = dict(sorted(zip(error.positions, reasons, strict=True)))
    bad = list(found)
    rows = [{"topic": records[i].topic(), "partition": records[i].partition(), "offset": int(offsets[i]),
             "timestamp": records[i].timestamp()[1], "key": records[i].key(), "value": records[i].value()}
            for i in bad]
    letters.add(rows, list(found.values()))
    keep = np.ones(len(records), bool)
    keep[bad] = False
    return [r for r, k in zip(records, keep, strict=True) if k], offsets[keep]
