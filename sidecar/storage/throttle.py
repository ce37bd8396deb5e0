"""The upload bandwidth cap: one token bucket for the whole daemon, shared by every upload.

Kafka caps a broker's copies to remote storage with ``remote.log.manager.copy.max.bytes.per.second``
(KIP-956); ``tiering.max_upload_bytes_per_second`` is the sidecar's counterpart. The daemon builds
one :class:`TokenBucket` and gives it to its object store, which charges every upload body to it
(each part of a multipart upload, each single PUT) *before* reading the body from disk: a
throttled upload holds no buffer while it waits, so the cap is backpressure, never buffering.
Standalone copies, broker-driven copies and eager staging all upload through that one store, so
they share the cap.

The bucket holds up to ``burst`` bytes and refills at ``rate`` bytes per second. ``acquire(n)``
reserves its ``n`` bytes at once, in call order, then sleeps until the bucket has paid for them:

* First come, first served: no request overtakes an earlier one, so concurrent uploads share the
  rate by the bytes they ask for, and a large part is never starved by a stream of small ones.
* A request larger than the bucket waits until the bucket is full, then goes and leaves the
  bucket in debt; the requests after it wait for that debt too, so the average rate holds.
* A request cancelled while it waits gives its bytes back. It spawned nothing, so nothing else is
  left to clean up, and the requests reserved after it keep their times.

Over any T seconds, at most ``burst + rate * T`` bytes are granted (plus the excess of one
request larger than the bucket). This module does no I/O and knows nothing of S3; the clock and
the sleep are injectable, so tests run on fake time.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

__all__ = ["TokenBucket"]

#: a shorter delay is a rounding error of the float arithmetic on clock values, not a wait
_NO_WAIT_S = 1e-6


class TokenBucket:
    """``TokenBucket(8 * 2**20, burst=2**20)``: 8 MiB/s on average, at most 1 MiB at once
    from a bucket that was idle.

    ``clock`` defaults to the running event loop's time, the clock ``asyncio.sleep`` keeps;
    ``on_wait`` is called with the seconds each throttled ``acquire`` waited (a metric).
    """

    def __init__(
        self,
        rate: float,
        *,
        burst: float | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_wait: Callable[[float], object] | None = None,
    ) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a positive number of bytes per second, got {rate}")
        burst = rate if burst is None else burst
        if not (math.isfinite(burst) and burst > 0):
            raise ValueError(f"burst must be a positive number of bytes, got {burst}")
        self._rate = float(rate)
        self._burst = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._on_wait = on_wait
        #: when the bucket is empty once every reservation so far is paid; later than now while
        #: it is in debt; None until the first reservation (a new bucket is full)
        self._empty_at: float | None = None

    @property
    def rate(self) -> float:
        """Bytes per second, on average."""
        return self._rate

    @property
    def burst(self) -> float:
        """The most bytes the bucket holds: what goes at once after an idle second."""
        return self._burst

    def reserve(self, amount: int, now: float) -> float:
        """Reserve ``amount`` bytes at time ``now``; returns when they may be sent (``now`` or
        later). Reservations are served in the order they are made."""
        full_since = now - self._burst / self._rate  # the bucket holds at most burst
        empty_at = full_since if self._empty_at is None else max(self._empty_at, full_since)
        # a request larger than the bucket needs a full bucket, not more
        grant = max(now, empty_at + min(amount, self._burst) / self._rate)
        self._empty_at = empty_at + amount / self._rate
        return grant

    def refund(self, amount: int) -> None:
        """Give back ``amount`` reserved bytes that were never sent."""
        if self._empty_at is not None:
            self._empty_at -= amount / self._rate

    async def acquire(self, amount: int) -> float:
        """Wait until ``amount`` bytes may be sent; returns the seconds waited. Cancellable: a
        cancelled wait gives its bytes back."""
        if amount < 0:
            raise ValueError(f"amount must not be negative, got {amount}")
        if amount == 0:
            return 0.0
        started = self._now()
        delay = self.reserve(amount, started) - started
        if delay < _NO_WAIT_S:
            return 0.0
        try:
            await self._sleep(delay)
        except BaseException:
            self.refund(amount)  # cancelled (a stop, a failed sibling part): nothing was sent
            raise
        finally:
            waited = max(0.0, self._now() - started)
            if self._on_wait is not None:
                self._on_wait(waited)
        return waited

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()
