"""Test helpers: fake stores for the engine's own tests. Never a stand-in for a real store in a product test.

- `FlakyStore`: in-process, fails/throttles/delays at random, and checks ordering rules as it goes.
- `format("sluice_test")` (`FileStoreDataSource`): a file-backed store usable from Spark's worker
  processes, with transactions (staging files + an atomic commit log), for Spark-level engine tests.
"""

from sluice.testing._filestore import FileStoreDataSource, read_file_store, register
from sluice.testing._flaky import FlakyStore

__all__ = ["FileStoreDataSource", "FlakyStore", "read_file_store", "register"]
