"""Live metrics of sluice writes while they run, exposed to Prometheus.

Reads report too: every read task what it fetched (records, bytes) and, where records carry their commit time, how
old the newest one was when fetched (sluice.metrics._reads); split sources (Kafka, S2) per split as well. Lookup
joins report their rows, the store's loads and their cache's hits, misses and evictions (sluice.metrics._lookups).

Executors are other machines: each task's engine reports its write every second (`sluice.engine.LiveStats`) to a
pusher thread, which POSTs the latest report to a collector on the driver; the collector folds the tasks' reports
into one set of metrics per format and serves them at /metrics (Prometheus' text format, prometheus_client).
A write learns the collector when it is planned, on the driver: `$SLUICE_METRICS_URL`, or the collector `serve()`
runs there. Without one, nothing is sent. A collector that cannot be reached never slows or fails a write.

    import sluice, sluice.metrics
    with sluice.metrics.serve(port=9464) as server:
        sluice.write(df, "postgres", {...})       # curl http://127.0.0.1:9464/metrics while it runs
"""

from sluice.metrics._progress import ProgressLines
from sluice.metrics._report import (
    LookupReport,
    LookupStats,
    MetricsTarget,
    ReadReport,
    ReadStats,
    SourceReport,
    SplitLag,
    TaskIdentity,
    TaskReport,
)
from sluice.metrics._server import MetricsServer, find_target, serve

__all__ = ["LookupReport", "LookupStats", "MetricsServer", "MetricsTarget", "ProgressLines", "ReadReport", "ReadStats",
           "SourceReport", "SplitLag", "TaskIdentity", "TaskReport", "find_target", "serve"]
