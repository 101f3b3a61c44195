"""Filter pushdown into a split source's batch read, as an option a user turns on.

Off by default, for two reasons a source cannot see from where it runs: a session without
`spark.sql.python.filterPushdown.enabled=true` (Spark's default; `sluice.session()` sets it) refuses to read at all
from a reader that takes filters (DATA_SOURCE_PUSHDOWN_DISABLED), and Spark 4.3 reuses a DataFrame's pushed-down read
for later queries on the same DataFrame. A source offers a reader without `pushFilters` and, for `pushdown=true`, a
subclass with it (`PostgresPushdownReader`, `CassandraPushdownReader`, ...).
"""

from __future__ import annotations

from sluice._options import Option
from sluice.spark._compat import require


def pushdown_option(into: str) -> Option:
    """The read option `pushdown` of a source whose filters go `into` the store's query (e.g. 'the WHERE clause')."""
    return Option(
        "pushdown", "bool", False,
        f"Turn Spark's filters into {into} (Spark 4.1+; needs spark.sql.python.filterPushdown.enabled=true, which "
        "sluice.session() sets: without it Spark refuses the read). Off by default: Spark 4.3 reuses a DataFrame's "
        "pushed-down read for later queries on it (wrong rows); when on, load a new DataFrame per query.")


def check_pushdown(pushdown: bool) -> None:
    """On the driver, before the store is asked anything: pushdown=true on a Spark line without it is refused."""
    if pushdown:
        require("filter pushdown", "pushdown", "Remove it (Spark then filters the rows after reading them),")
