"""A tiny asyncio kit for the daemon's lifecycle, with no domain imports.

* :func:`guard` wraps a root task: it logs the task's start and end, and turns an early return
  (before shutdown was requested) into :class:`RootTaskExitedError`, so the TaskGroup stops
  everything and the process exits non-zero for Kubernetes or systemd to restart it. So does a
  ``CancelledError`` the task was not sent (from a future it awaited), which a TaskGroup would
  otherwise drop silently.
* :func:`capture_signals`: the first SIGTERM/SIGINT only sets the ``stopping`` event (phased,
  graceful shutdown); a second one cancels the main task at once.
* :func:`acquire_in_thread`: open a resource (a file, a descriptor) in a worker thread without
  leaking it when the caller is cancelled while the thread runs.
* :data:`SEGMENT_READ_THREADS` and :func:`in_segment_thread`: the threads that read the
  broker's segment files for uploads. Those reads take seconds per segment (a whole-file check,
  a part of 16 MiB), longer on a slow disk or network storage; in the default executor
  (``asyncio.to_thread``, a few threads) a handful of them held every thread, and the metadata
  store's queries, the metadata tailer's batches, the log-dir scans and ``/metrics`` waited
  behind them. In a pool of their own they only wait for each other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import gc
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeVar

from sidecar.errors import SidecarError
from sidecar.observability.logging import get_logger

__all__ = [
    "SEGMENT_READ_THREADS",
    "RootTaskExitedError",
    "acquire_in_thread",
    "capture_signals",
    "failures",
    "freeze_startup_heap",
    "guard",
    "in_segment_thread",
    "wait_any",
]

_T = TypeVar("_T")

log = get_logger(__name__)

#: the threads that read the broker's segment files for uploads (as many as the sendfile
#: threads: more reads at once than that only queue in the disk)
SEGMENT_READ_THREADS: Final = concurrent.futures.ThreadPoolExecutor(
    max_workers=8, thread_name_prefix="segment-read"
)


def in_segment_thread(func: Callable[..., _T], /, *args: Any) -> asyncio.Future[_T]:
    """``func(*args)`` in :data:`SEGMENT_READ_THREADS`, with the caller's contextvars (as
    ``asyncio.to_thread``); a future of its result."""
    call = functools.partial(contextvars.copy_context().run, func, *args)
    return asyncio.get_running_loop().run_in_executor(SEGMENT_READ_THREADS, call)


async def acquire_in_thread(
    acquire: Callable[[], _T],
    release: Callable[[_T], None],
    *,
    executor: concurrent.futures.Executor | None = None,
) -> _T:
    """``acquire()`` in a worker thread (of ``executor``, else the default one), handing its
    result to the caller.

    A cancellation cannot stop the thread, and the event loop may be gone by the time it is
    done: whichever of the thread and the cancelled caller comes second calls ``release`` on the
    result, so nothing acquired for a caller that went away is leaked.
    """
    lock = threading.Lock()
    abandoned = False
    handed: list[_T] = []

    def hand_over() -> _T:
        result = acquire()
        with lock:
            if abandoned:
                release(result)
            else:
                handed.append(result)
        return result

    try:
        if executor is None:
            return await asyncio.to_thread(hand_over)
        call = functools.partial(contextvars.copy_context().run, hand_over)
        return await asyncio.get_running_loop().run_in_executor(executor, call)
    except asyncio.CancelledError:
        with lock:
            abandoned = True
            for result in handed:
                release(result)
        raise


class RootTaskExitedError(SidecarError):
    """A root task returned while the daemon was not stopping."""


async def guard(coro: Coroutine[Any, Any, None], *, name: str, stopping: asyncio.Event) -> None:
    """Run a root task; an early exit is an error that ends the daemon."""
    log.debug("task_started", task=name)
    try:
        await coro
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if (task is not None and task.cancelling()) or stopping.is_set():
            log.debug("task_cancelled", task=name)
            raise
        # a CancelledError from something it awaited, not a cancel of this task: a task
        # group drops a task that ends so without a word, and the component would be gone
        log.exception("task_failed", task=name, error="ended by a cancellation it was not sent")
        stopping.set()
        raise RootTaskExitedError(
            f"root task {name!r} ended by a cancellation it was not sent"
        ) from exc
    except Exception:
        log.exception("task_failed", task=name)
        stopping.set()
        raise
    if not stopping.is_set():
        stopping.set()
        raise RootTaskExitedError(f"root task {name!r} exited before shutdown was requested")
    log.debug("task_stopped", task=name)


@contextmanager
def capture_signals(stopping: asyncio.Event) -> Iterator[None]:
    """First SIGTERM/SIGINT sets ``stopping``; a second one cancels the calling task."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    signals = (signal.SIGTERM, signal.SIGINT)

    def handle(signum: signal.Signals) -> None:
        if stopping.is_set():
            log.warning("shutdown_forced", signal=signum.name)
            if main is not None:
                main.cancel(f"second {signum.name}")
            return
        log.info("shutdown_requested", signal=signum.name)
        stopping.set()

    for sig in signals:
        loop.add_signal_handler(sig, handle, sig)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def failures(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions a task group ended with, nested groups flattened, cancellations left
    out: what a supervisor reports when its root tasks fail."""
    found: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found.extend(failures(exc))
        elif not isinstance(exc, asyncio.CancelledError):
            found.append(exc)
    return found


async def wait_any(*events: asyncio.Event, within: float) -> None:
    """Return when any of the events is set, or after ``within`` seconds."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=max(0.0, within), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


_heap_frozen = False


def freeze_startup_heap() -> None:
    """Move every object alive now out of the cyclic GC's walks (``gc.freeze``), once.

    The daemon calls it when it first turns ready (the read server alone, once it serves): by
    then the imports, botocore's S3 service model (tens of thousands of dicts and lists), the
    Kafka clients and the first scan are in memory for good. Every full collection walked them
    again while each request's garbage triggered collections: the collector was about a quarter
    of the daemon's CPU while tiering, and about a tenth after this. Frozen objects are still
    freed by reference counting; only garbage cycles among objects alive at this moment are
    never collected, which bounds what this can keep to the startup heap. Objects created later
    are collected as before.
    """
    global _heap_frozen
    if _heap_frozen:
        return
    _heap_frozen = True
    gc.collect()
    gc.freeze()
