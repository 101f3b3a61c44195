"""`sluice ui`: watch a pipeline run (the page of docs/metrics.md): jobs and their last commit, tables with versions,
barriers and lag, the lineage graph, a consistent-read point for any set of tables, and every write's live metrics,
refreshing every second. Read-only; loopback unless a token is given.

    sluice ui --meta postgresql://... --port 8765       # prints the page's address
    from sluice.ui import serve_ui                       # the same from Python: serve_ui(meta=...).url
"""

from sluice.ui._app import serve_ui
from sluice.ui._state import PipelineState, consistent_point, read_state

__all__ = ["PipelineState", "consistent_point", "read_state", "serve_ui"]
