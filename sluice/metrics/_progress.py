"""Progress of a long batch write in the console of the process that started it (`sluice.write`), read from the
metrics collector its tasks report to: a line every few seconds once the write has run for a few."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from types import TracebackType

from sluice.metrics._push import auth_headers
from sluice.metrics._report import MetricsTarget

log = logging.getLogger("sluice.progress")

AFTER_S = 5.0  # a write that ends sooner prints nothing
EVERY_S = 5.0


class WriteProgress:
    """`with WriteProgress("postgres", target): ...write...` logs `postgres: 1,234,567 records written so far (...)`.
    Counts what the collector's counter for the format gained since the write began (writes of the same format that
    run at the same time count together). A collector that cannot be reached ends the progress, never the write."""

    def __init__(self, format_name: str, target: MetricsTarget) -> None:
        self.format_name = format_name
        self.target = target
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-progress", daemon=True)

    def _records(self) -> int:
        request = urllib.request.Request(self.target.url.rstrip("/") + "/metrics.json",
                                         headers=auth_headers(self.target))
        with urllib.request.urlopen(request, timeout=2) as answer:
            sinks = json.loads(answer.read())["sinks"]
        return int(sinks.get(self.format_name, {}).get("records", 0))

    def _run(self) -> None:
        try:
            start, began = self._records(), time.monotonic()
            if self._done.wait(AFTER_S):
                return
            while True:
                written, took = self._records() - start, time.monotonic() - began
                if written:  # nothing counted: the tasks report elsewhere (a Spark Connect driver), or none ran yet
                    say(f"{self.format_name}: {written:,} records written so far ({written / took:,.0f}/s, "
                        f"{took:.0f} s)")
                if self._done.wait(EVERY_S):
                    return
        except Exception as e:
            log.debug("no progress from the metrics collector at %s: %s", self.target.url, e)

    def __enter__(self) -> WriteProgress:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()


def say(line: str) -> None:
    """An INFO line users see without configuring logging (as the write summary's)."""
    from sluice.spark._summary import console_handler

    console_handler(log)
    log.info(line)
