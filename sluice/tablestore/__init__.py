"""The table store of seed 001: Delta tables by name, committed per barrier, read at consistent versions.

See `_source.py` for `format("tablestore")` and `read_consistent`, `_table.py` for commits, and `sluice.meta`
for the MetaService that records each table's completed barriers.
"""

from sluice.tablestore._jobs import JobHandle, register_job
from sluice.tablestore._source import TableStoreDataSource, read_consistent, signed_change
from sluice.tablestore._table import Commit, StoreTable, TableStoreError, vacuum

__all__ = ["Commit", "JobHandle", "StoreTable", "TableStoreDataSource", "TableStoreError", "read_consistent",
           "register_job", "signed_change", "vacuum"]
