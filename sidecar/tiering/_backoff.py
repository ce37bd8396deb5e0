"""How long a partition waits after a failed upload before it is planned again.

Exponential from ``initial_s``, doubled per consecutive failure and capped at ``max_s``, with
"equal jitter": the wait is a uniform draw in the upper half of that cap, so partitions that
failed together (one disk, one S3 outage) do not retry in lockstep, and none retries sooner than
half its step. An error that is not retriable waits the cap at once.

Pure: the caller passes the random draw.
"""

from __future__ import annotations

__all__ = ["partition_backoff"]


def partition_backoff(
    failures: int, *, initial_s: float, max_s: float, retriable: bool, draw: float
) -> float:
    """The wait after ``failures`` consecutive failures (1 = the first), for a ``draw`` in
    [0, 1): in ``[cap / 2, cap)`` with ``cap = min(max_s, initial_s * 2 ** (failures - 1))``, or
    ``max_s`` as the cap when the error is not ``retriable``."""
    if failures < 1:
        raise ValueError(f"failures must be at least 1, got {failures}")
    cap = max_s if not retriable else min(max_s, initial_s * 2 ** min(failures - 1, 62))
    return cap * (0.5 + 0.5 * draw)
