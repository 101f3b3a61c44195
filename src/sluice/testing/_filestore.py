"""`format("sluice_test")`: a file-backed fake store for Spark-level tests of the engine.

Every task appends its batches to its own file under `<test.dir>/out/`. With sink.transactional=true a
task writes to a staging file, and the driver's commit publishes one file per (write id, epoch) under
`<test.dir>/committed/` with an atomic rename, skipping an epoch that is already there (idempotent replay).
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from sluice.connector import (
    SINK_SPEC,
    Batch,
    BlockingStore,
    Committer,
    Encoded,
    Option,
    Options,
    RetryableError,
    SinkConfig,
    SinkDataSource,
    TaskWriter,
    WriteContext,
    WritePlan,
    binary_column,
)
from sluice.sink._encoding import body_column_name


class InjectedCrash(Exception):
    """Not retryable: fails the Spark task."""


class FileStore(BlockingStore):
    name = "sluice_test"
    supports_transactions = True
    io_threads = 4

    def __init__(self, folder: Path, context: WriteContext, transactional: bool, fail_every: int,
                 crash_after: int) -> None:
        super().__init__()
        self.folder = folder
        self.transactional = transactional
        self.fail_every = fail_every
        # Simulates an executor dying mid-task: the first attempt of each task fails for good after
        # writing `crash_after` entries, so Spark retries the task.
        self.crash_after = crash_after if context.attempt == 0 else 0
        self._submits = 0
        self._written = 0
        epoch = context.epoch if context.epoch is not None else 0
        stem = f"{context.write_id}-e{epoch}-p{context.partition_id}-t{context.task_attempt_id}"
        sub = "staging" if transactional else "out"
        (folder / sub).mkdir(parents=True, exist_ok=True)
        self.path = folder / sub / f"{stem}.txt"
        self.path.touch()

    @property
    def target(self) -> str:
        return str(self.folder)

    def write_batch(self, batch: Batch) -> None:
        self._submits += 1
        if self.fail_every and self._submits % self.fail_every == 0:
            raise RetryableError(f"injected failure on submit {self._submits}")
        if self.crash_after and self._written >= self.crash_after:
            raise InjectedCrash(f"injected task crash after {self._written} entries")
        data = b"".join(e + b"\n" for e in batch.entries)
        with open(self.path, "ab") as f:
            f.write(data)
        self._written += batch.record_count

    def pre_commit(self) -> Any:
        return {"file": str(self.path)} if self.transactional else None


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class FileCommitter(Committer):
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def commit(self, messages: list[Any], context: WriteContext) -> None:
        committed = self.folder / "committed"
        committed.mkdir(parents=True, exist_ok=True)
        epoch = context.epoch if context.epoch is not None else 0
        with _locked(self.folder):
            if list(committed.glob(f"*-{context.write_id}-e{epoch}.txt")):
                return  # this epoch was committed before: replay is a no-op
            seq = len(list(committed.glob("*.txt")))
            tmp = committed / f".{context.write_id}-e{epoch}.tmp"
            with open(tmp, "wb") as out:
                for message in messages:
                    out.write(Path(message["file"]).read_bytes())
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, committed / f"{seq:06d}-{context.write_id}-e{epoch}.txt")

    def abort(self, messages: list[Any], context: WriteContext) -> None:
        for message in messages:
            Path(message["file"]).unlink(missing_ok=True)


TEST_OPTIONS = (
    Option("test.dir", "str", None, "Folder the fake store writes to.", required=True),
    Option("test.fail-every", "int", 0, "Every n-th submit of a task fails (retryable); 0 = never.", minimum=0),
    Option("test.crash-after", "int", 0, "First task attempts crash after this many entries; 0 = never.",
           minimum=0),
)


class FileStoreDataSource(SinkDataSource):
    format_name = "sluice_test"
    write_spec = SINK_SPEC.extend(TEST_OPTIONS).renamed(format_name)

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig, overwrite: bool) -> WritePlan:
        self.refuse_overwrite(overwrite)
        column = body_column_name(schema.fieldNames(), [f.dataType.typeName() for f in schema.fields])
        return FileWritePlan(self.format_name, opts, schema, config, column)


@dataclass(frozen=True)
class FileWritePlan(WritePlan):
    body_column: str

    def open_task(self, context: WriteContext) -> TaskWriter:
        opts = self.options
        return TaskWriter(lambda batch: Encoded(*binary_column(batch, self.body_column)),
                          FileStore(Path(opts["test.dir"]), context, opts["sink.transactional"],
                                    opts["test.fail-every"], opts["test.crash-after"]))

    def committer(self) -> Committer:
        return FileCommitter(Path(self.options["test.dir"]))


def read_file_store(folder: str | os.PathLike[str]) -> dict[str, list[str]]:
    """{'out': lines written without transactions, 'committed': lines of committed epochs, in commit order}."""
    root = Path(folder)

    def lines(files: list[Path]) -> list[str]:
        return [line for f in files for line in f.read_text().splitlines()]

    def seq(p: Path) -> int:
        return int(re.match(r"(\d+)-", p.name).group(1))  # type: ignore[union-attr]

    return {
        "out": lines(sorted((root / "out").glob("*.txt"))),
        "committed": lines(sorted((root / "committed").glob("*.txt"), key=seq)),
    }


def register(spark: SparkSession) -> None:
    """Register the test format with `spark` and with sluice.write()."""
    from sluice.spark._registry import add_format

    add_format(FileStoreDataSource.format_name, f"{__name__}:FileStoreDataSource")
    spark.dataSource.register(FileStoreDataSource)
