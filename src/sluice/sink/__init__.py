"""The sink framework on Spark: a format's `SinkDataSource` plans a write once on the driver into a frozen
`WritePlan`; each task's Arrow writer runs the engine (`sluice.engine`) on it; the driver commits what the tasks
sent back. Also the vectorized Arrow-to-entries helpers, the replay guard of streaming sinks, and the one-call
writes behind `sluice.write` and `sluice.partitioned`."""

from sluice.sink._arrow_writers import EngineArrowWriter, EngineStreamArrowWriter, SluiceCommitMessage
from sluice.sink._dataframe_write import partitioned, write
from sluice.sink._datasource import SinkDataSource
from sluice.sink._plan import Encoded, Encoder, TaskWriter, WritePlan
from sluice.sink._replay import ReplayGuard

__all__ = [
    "Encoded",
    "Encoder",
    "EngineArrowWriter",
    "EngineStreamArrowWriter",
    "ReplayGuard",
    "SinkDataSource",
    "SluiceCommitMessage",
    "TaskWriter",
    "WritePlan",
    "partitioned",
    "write",
]
