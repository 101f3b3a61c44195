"""The table store of FLIP-276: Delta tables by name, committed per barrier, read at consistent versions.

See `_source.py` for `format("tablestore")` reads and `read_consistent`, `_sink.py` for writes, `_table.py` for
commits, `_maintenance.py` for compact and vacuum as commands, `_barriers.py` for how a micro-batch's barrier passes
from a table-store source to a table-store sink, and `sluice.meta` for the MetaService that records each table's
completed barriers.
"""

from sluice.tablestore._datasource import TableStoreDataSource
from sluice.tablestore._jobs import JobHandle, register_job
from sluice.tablestore._maintenance import compact, vacuum
from sluice.tablestore._source import read_consistent, signed_change
from sluice.tablestore._storage import Warehouse
from sluice.tablestore._table import Commit, StoreTable, TableStoreError

__all__ = ["Commit", "JobHandle", "StoreTable", "TableStoreDataSource", "TableStoreError", "Warehouse", "compact",
           "read_consistent", "register_job", "signed_change", "vacuum"]
