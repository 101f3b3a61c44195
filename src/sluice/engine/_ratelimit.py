"""Congestion control on in-flight records (Flink's CongestionControlRateLimitingStrategy + AIMD), and a user's rate cap
(token buckets) in front of it: a request goes when both allow it."""

from __future__ import annotations


class AIMDRateLimiter:
    """At most `max_inflight_requests` requests, and an AIMD window of in-flight records.

    The window starts at `start_batches` batches (`batch_max_size`, SinkConfig's, from sink.batch.max-size; one
    unless the store says otherwise, Store.window_start_batches), grows by `increase` per successful request, halves
    on any failure (floor 1), and is capped at batch_max_size * max_inflight_requests. A batch holds at most the
    smaller of batch_max_size and the window (`batch_size_limit`, which the writer hands creators as
    RequestInfo.batch_size).
    """

    def __init__(self, batch_max_size: int, max_inflight_requests: int, increase: int = 10,
                 decrease_factor: float = 0.5, start_batches: int = 1) -> None:
        self.max_inflight_requests = max_inflight_requests
        self.cap = batch_max_size * max_inflight_requests
        self.window = min(self.cap, batch_max_size * max(1, start_batches))
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

    def requests_allowed(self, records_each: int) -> int:
        """How many requests of `records_each` records may go now, together: each as `should_block` allows it after
        the ones before it (0 when the first may not)."""
        free = self.max_inflight_requests - self.inflight_requests
        if free <= 0:
            return 0
        fits = (self.window - self.inflight_records) // max(1, records_each)
        if not self.inflight_requests:
            fits = max(1, fits)
        return max(0, min(free, fits))

    def on_submit(self, records: int) -> None:
        self.inflight_requests += 1
        self.inflight_records += records

    def on_complete(self, records: int, success: bool, shrink: bool = True) -> None:
        """`shrink` False: a failure already counted (the batches of one failed run share its failure)."""
        self.inflight_requests -= 1
        self.inflight_records -= records
        if success:
            self.window = min(self.cap, self.window + self.increase)
        elif shrink:
            self.window = max(1, int(self.window * self.decrease_factor))


class TokenBucket:
    """Admits costs at `rate` per second with at most `burst` saved up (a token bucket; Guava's RateLimiter without
    its warm-up). A cost larger than the burst is admitted once the bucket is full and leaves it in debt, so an
    oversized batch waits, then goes, and the next one waits for the debt to be paid: never a deadlock, and by any
    time t at most rate * t + max(burst, largest cost) admitted.

    Pure arithmetic on the times it is given (the writer's clock): it never sleeps; the caller waits until
    `ready_at`."""

    __slots__ = ("at", "burst", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError(f"a token bucket needs a positive rate and burst, got rate={rate}, burst={burst}")
        self.rate = rate
        self.burst = burst
        self.tokens = burst  # starts full: a write's first second goes at once
        self.at = now

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now

    def ready_at(self, cost: float, now: float) -> float:
        """When `cost` may be taken: `now` if it may be now, else the time the bucket will hold enough."""
        self._refill(now)
        need = min(cost, self.burst)
        short = need - self.tokens
        # A float's rounding must not leave a cost waiting for a millionth of a token.
        return now if short <= 1e-6 * max(1.0, need) else now + short / self.rate

    def take(self, cost: float, now: float) -> None:
        self._refill(now)
        self.tokens -= cost


class RateCap:
    """A task's share of a write's rate cap, in records and/or bytes per second: a request goes when both buckets
    allow it. Each bucket's burst is one second of its rate (at least one record or byte)."""

    __slots__ = ("_bytes", "_records")

    def __init__(self, records_per_s: float | None, bytes_per_s: float | None, now: float) -> None:
        self._records = None if records_per_s is None else TokenBucket(records_per_s, max(1.0, records_per_s), now)
        self._bytes = None if bytes_per_s is None else TokenBucket(bytes_per_s, max(1.0, bytes_per_s), now)

    def ready_at(self, records: int, size_bytes: int, now: float) -> float:
        ready = now
        if self._records is not None:
            ready = max(ready, self._records.ready_at(records, now))
        if self._bytes is not None:
            ready = max(ready, self._bytes.ready_at(size_bytes, now))
        return ready

    def take(self, records: int, size_bytes: int, now: float) -> None:
        if self._records is not None:
            self._records.take(records, now)
        if self._bytes is not None:
            self._bytes.take(size_bytes, now)
