"""Congestion control on in-flight records (Flink's CongestionControlRateLimitingStrategy + AIMD)."""

from __future__ import annotations


class AIMDRateLimiter:
    """At most `max_inflight_requests` requests, and an AIMD window of in-flight records.

    The window starts at one batch (`batch_max_size`, SinkConfig's, from sink.batch.max-size), grows by
    `increase` per successful request, halves on any failure (floor 1), and is capped at batch_max_size *
    max_inflight_requests. A batch holds at most the smaller of batch_max_size and the window (`batch_size_limit`,
    which the writer hands creators as RequestInfo.batch_size).
    """

    def __init__(self, batch_max_size: int, max_inflight_requests: int, increase: int = 10,
                 decrease_factor: float = 0.5) -> None:
        self.max_inflight_requests = max_inflight_requests
        self.cap = batch_max_size * max_inflight_requests
        self.window = batch_max_size
        self.increase = increase
        self.decrease_factor = decrease_factor
        self.inflight_requests = 0
        self.inflight_records = 0

    def batch_size_limit(self, batch_max_size: int) -> int:
        return max(1, min(batch_max_size, self.window))

    def should_block(self, next_batch_records: int) -> bool:
        if self.inflight_requests >= self.max_inflight_requests:
            return True
        # Like Flink: one request may always go when nothing is in flight, however small the window.
        return self.inflight_requests > 0 and self.inflight_records + next_batch_records > self.window

    def on_submit(self, records: int) -> None:
        self.inflight_requests += 1
        self.inflight_records += records

    def on_complete(self, records: int, success: bool) -> None:
        self.inflight_requests -= 1
        self.inflight_records -= records
        if success:
            self.window = min(self.cap, self.window + self.increase)
        else:
            self.window = max(1, int(self.window * self.decrease_factor))
