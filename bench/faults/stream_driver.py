"""A streaming driver for bench/faults/: reads a parquet directory one file per micro-batch into a format.

Run as `python -m bench.faults.stream_driver FORMAT OPTIONS_JSON INPUT_DIR CHECKPOINT_DIR`; bench/faults/ SIGKILLs
its whole process group mid-stream and runs it again on the same checkpoint, as a crashed job is restarted.
"""

from __future__ import annotations

import json
import sys

import sluice
from bench.faults.injected import paced


def main(fmt: str, options: str, input_dir: str, checkpoint: str) -> None:
    opts = json.loads(options)
    spark = sluice.session("sluice-faults-stream", **{"spark.sql.execution.arrow.maxRecordsPerBatch": "500"})
    schema = spark.read.parquet(input_dir).schema
    rows = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(input_dir) \
        .mapInArrow(paced(0.05), schema)  # ~1 s per micro-batch of 2,000 rows: long enough to be killed mid-write
    laid_out = rows if fmt == "tablestore" else sluice.partitioned(rows, fmt, opts)
    query = (laid_out.writeStream.format(fmt).options(**opts).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
