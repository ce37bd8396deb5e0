"""The storage retry policy, in one place: a few attempts with exponential backoff and full
jitter, for errors a classifier calls transient.

Backends wrap each request attempt (with its own timeout) in :func:`retrying`. The sleep and the
random source are injectable, so tests run on fake time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from sidecar.observability.logging import get_logger

__all__ = ["RetryPolicy", "retrying"]

T = TypeVar("T")

log = get_logger(__name__)

_jitter = random.Random()  # noqa: S311 - backoff jitter, not a secret


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a failed request is repeated.

    ``RetryPolicy(attempts=4, base_delay_s=0.1, max_delay_s=5.0)`` waits up to 0.1, 0.2 and
    0.4 s before the 2nd, 3rd and 4th attempt (full jitter: a uniform draw below the cap).
    """

    #: total attempts, the first included (1 = no retries)
    attempts: int = 4
    #: the cap on the first delay; doubled for every further retry
    base_delay_s: float = 0.1
    #: no single delay is longer than this
    max_delay_s: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("retry delays must not be negative")

    def delay(self, retry: int, draw: float) -> float:
        """The wait before retry number ``retry`` (1-based), for a uniform ``draw`` in [0, 1)."""
        cap = min(self.max_delay_s, self.base_delay_s * (1 << min(retry - 1, 62)))
        return cap * draw


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    is_transient: Callable[[BaseException], bool],
    what: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    draw: Callable[[], float] = _jitter.random,
) -> T:
    """Await ``attempt()`` until it succeeds, raises an error that is not transient, or the
    policy's attempts are spent; then the last error propagates unchanged.

    ``what`` names the operation in the retry log line. Cancellation is never retried.
    """
    retry = 0
    while True:
        try:
            return await attempt()
        except Exception as exc:
            retry += 1
            if retry >= policy.attempts or not is_transient(exc):
                raise
            delay = policy.delay(retry, draw())
            log.info(
                "storage_retry",
                op=what,
                attempt=retry + 1,
                of=policy.attempts,
                delay_s=round(delay, 3),
                error=f"{type(exc).__name__}: {exc}",
            )
            await sleep(delay)
