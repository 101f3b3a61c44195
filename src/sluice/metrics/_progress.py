"""Progress of a long batch write in the console of the process that started it (`sluice.write`), read from the
metrics collector its tasks report to: a line every few seconds once the write has run for a few."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from types import TracebackType

from sluice._driver import console_handler
from sluice.metrics._push import auth_headers
from sluice.metrics._report import MetricsTarget

log = logging.getLogger("sluice.progress")

AFTER_S = 5.0  # a write that ends sooner prints nothing
EVERY_S = 5.0


class ProgressLines:
    """A line every `every_s` once some work has run `after_s` (logger sluice.progress), from a thread of its own:
    `with progress: ...work...`. Subclasses say what the line is; showing progress never fails the work."""

    def __init__(self, after_s: float, every_s: float) -> None:
        self.after_s, self.every_s = after_s, every_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-progress", daemon=True)

    def _begin(self) -> None:
        """What the lines count from, learned on the progress thread as the work starts."""

    def _line(self, took: float) -> str | None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            self._begin()
            began = time.monotonic()
            if self._done.wait(self.after_s):
                return
            while True:
                line = self._line(time.monotonic() - began)
                if line:
                    say(line)
                if self._done.wait(self.every_s):
                    return
        except Exception as e:
            log.debug("no progress shown (%s: %s)", type(e).__name__, e)

    def __enter__(self) -> ProgressLines:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()


class WriteProgress(ProgressLines):
    """`with WriteProgress("postgres", target): ...write...` logs `postgres: 1,234,567 records written so far (...)`.
    Counts what the collector's counter for the format gained since the write began (writes of the same format that
    run at the same time count together). A collector that cannot be reached ends the progress, never the write."""

    def __init__(self, format_name: str, target: MetricsTarget) -> None:
        super().__init__(AFTER_S, EVERY_S)
        self.format_name = format_name
        self.target = target
        self._start = 0

    def _records(self) -> int:
        request = urllib.request.Request(self.target.url.rstrip("/") + "/metrics.json",
                                         headers=auth_headers(self.target))
        with urllib.request.urlopen(request, timeout=2) as answer:
            sinks = json.loads(answer.read())["sinks"]
        return int(sinks.get(self.format_name, {}).get("records", 0))

    def _begin(self) -> None:
        self._start = self._records()

    def _line(self, took: float) -> str | None:
        written = self._records() - self._start
        if not written:  # nothing counted: the tasks report elsewhere (a Spark Connect driver), or none ran yet
            return None
        return f"{self.format_name}: {written:,} records written so far ({written / took:,.0f}/s, {took:.0f} s)"


def say(line: str) -> None:
    """An INFO line users see without configuring logging (as the write summary's)."""
    console_handler(log)
    log.info(line)
