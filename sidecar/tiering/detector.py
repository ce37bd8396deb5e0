"""Roll detection: inotify events are hints, the periodic full reconcile is the truth.

The detector keeps one view per partition directory. A full scan lists every log dir and scans
each partition directory; between full scans, inotify events (through watchdog) mark single
partition directories dirty and only those are rescanned. Content writes to the active segment
(``modified``) are ignored: a roll shows up as a created ``.log``/``.snapshot`` or a rename.

With the hints on, the safety net between two full scans (spaced out in proportion to their
cost) is a stat of every partition directory every ``rescan_interval_s``: a directory whose
modification time or inode changed since its last scan (a file created, deleted or renamed in
it, an event the hints missed) is scanned again, a new one scanned, a gone one dropped. A
directory modified within the second before its scan is not trusted (the kernel's timestamps
are coarse: a change in the same tick would leave the time as it was) and is scanned again.

When the kernel refuses the inotify watches (``fs.inotify.max_user_watches`` or
``max_user_instances`` is below what the log dirs need: one watch per partition directory), the
detector says so once, with the sysctl to raise, and goes on with full rescans alone: rolls are
then seen within ``rescan_interval_s`` instead of at once.

The hints can also stop covering everything after the start, which watchdog does not report: a
partition dir created once the limit is reached gets no watch, a log dir missing at the start
gets none when it appears, and an error in watchdog's thread ends its events. Before each
stat-only rescan the detector checks for these: the watcher is started again for a log dir that
appeared or a watcher that stopped, and new partition dirs are followed by a probe of the limit
(a warning once). The stat-only rescans see every roll meanwhile, within ``rescan_interval_s``.

A scan that fails with an ``OSError`` (a log dir that cannot be listed: ``EACCES``, the ``EIO`` of
a failing disk) is counted (``log_dir_scans_total{outcome="error"}``) and logged
(``log_dir_scan_failed``); no view is dropped for it, and a full scan tries again after
``rescan_interval_s``. The daemon keeps serving everything else (reads, uploads of the partitions
already seen); the failing scans are what the ``KafkaTieredSidecarLogDirScansFailing`` alert sees.

All file work runs in a worker thread (``asyncio.to_thread``); the event loop only merges
results, yielding to other tasks every ``_MERGE_CHUNK`` changed partitions (a first scan of a
broker with ten thousand partitions reports ten thousand changes). The detector reads the log
dirs and never writes to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from sidecar._aio import wait_any
from sidecar.observability.logging import get_logger
from sidecar.observability.metrics import Metrics

__all__ = ["LogDirDetector", "ViewMap", "start_observer"]

log = get_logger(__name__)

V = TypeVar("V")

# a burst of events (a roll touches several files) is coalesced into one rescan
_DEBOUNCE_S = 0.02
# changed partitions merged (and reported) per event-loop turn
_MERGE_CHUNK = 50
#: partition dirs per step of a full rescan: a roll's partition, marked meanwhile, is scanned
#: between two steps instead of waiting for the whole rescan (seconds at 10,000 partitions)
_FULL_SCAN_STEP = 500
#: with inotify hints on, the periodic full rescan is a safety net: the next one starts at
#: least this many times its own duration later (at 10,000 partitions a rescan is seconds of
#: file work, and a rescan every 30 s was a quarter of a core while the broker was idle)
_RESCAN_SPACING = 20.0
#: ... and between full rescans, the stat-only rescans of the safety net (milliseconds per
#: thousand dirs) catch what the hints missed, so a full rescan is spaced this many times its
#: duration (at 10,000 partitions 2.5 s of CPU: about every 40 minutes, 0.1 % of a core)
_FULL_RESCAN_SPACING = 1000.0
#: a dir modified this recently before its scan may change again within the same timestamp
#: tick: its stamp is not kept, so the next stat-only rescan scans it again
_RACY_NS = 1_000_000_000


def _stamp(st: os.stat_result, now_ns: int) -> int | None:
    """A partition dir's identity and modification time, or None if too recent to trust."""
    if now_ns - st.st_mtime_ns < _RACY_NS:
        return None
    return (st.st_ino << 64) | st.st_mtime_ns


#: the only events the hints act on (a roll creates or renames files; deletion and partition
#: moves remove them). Without a filter watchdog asks the kernel for opens, closes and writes
#: too: the detector's own reads of every partition's files and each append of the broker then
#: fill the inotify queue (16384 events by default), and on overflow watchdog walks the whole
#: tree and reports every file as created, which marks every partition dirty, whose rescan
#: overflows the queue again: at ten thousand partitions a loop that never ends.
_HINT_EVENTS = (
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
)

#: what the kernel answers when inotify watches or instances run out
_WATCH_LIMIT_ERRNOS = frozenset({errno.ENOSPC, errno.EMFILE})


def _check_watches_left(log_dirs: Sequence[Path]) -> None:
    """Raise ENOSPC when the kernel refuses one more inotify watch. watchdog (7) raises only
    when a log dir's own watch is refused and skips, without a word, the partition dirs the
    limit leaves unwatched: a probe watch after its walk tells whether the limit cut it short
    (a limit met exactly counts too: the next partition dir would go unwatched)."""
    probe_dir = next((d for d in log_dirs if d.is_dir()), None)
    if probe_dir is None or not sys.platform.startswith("linux"):
        return
    from watchdog.observers import inotify_c  # Linux only

    fd = inotify_c.inotify_init()
    if fd < 0:
        return  # no inotify instance to spare: that says nothing of the watches
    try:
        mask = inotify_c.InotifyConstants.IN_CREATE
        refused = inotify_c.inotify_add_watch(fd, os.fsencode(probe_dir), mask) < 0
        if refused and ctypes.get_errno() == errno.ENOSPC:
            raise OSError(errno.ENOSPC, "inotify watch limit reached below the log dirs")
    finally:
        os.close(fd)


def start_observer(
    handler: FileSystemEventHandler,
    log_dirs: Sequence[Path],
    observer_factory: Callable[[], BaseObserver] = Observer,
) -> BaseObserver | None:
    """Watch the log dirs (recursively) for hints; None, after one warning, when the kernel's
    inotify limits refuse the watches: the caller then relies on full rescans."""
    observer = observer_factory()
    for log_dir in log_dirs:
        if log_dir.is_dir():
            # events name paths below the watched one as given: the resolved dir, as the
            # views and the hints name partitions (a log dir may be a symlink)
            observer.schedule(
                handler, str(log_dir.resolve()), recursive=True, event_filter=list(_HINT_EVENTS)
            )
        else:
            log.warning("log_dir_missing", log_dir=str(log_dir))
    try:
        observer.start()
        _check_watches_left(log_dirs)
    except OSError as exc:
        if exc.errno not in _WATCH_LIMIT_ERRNOS:
            raise
        with contextlib.suppress(Exception):
            observer.stop()
        log.warning(
            "inotify_watch_limit_reached",
            error=str(exc),
            fallback="full rescans of the log dirs only; rolls are seen within"
            " tiering.rescan_interval_s",
            fix="raise the limits on the host, e.g. sysctl -w fs.inotify.max_user_watches=1048576"
            " and sysctl -w fs.inotify.max_user_instances=1024 (one watch per partition dir)",
        )
        return None
    return observer


class ViewMap(dict[Path, V]):
    """The detector's views (partition dir → view), with a journal per reader of the dirs whose
    view changed: a reader of ten thousand partitions looks at the few that changed instead of
    comparing them all."""

    def __init__(self) -> None:
        super().__init__()
        self._journals: list[set[Path]] = []

    def journal(self) -> set[Path]:
        """A set that from now on collects every dir whose view changes (appeared, changed,
        gone); the reader empties it as it reads."""
        journal: set[Path] = set()
        self._journals.append(journal)
        return journal

    def note(self, partition_dir: Path) -> None:
        for journal in self._journals:
            journal.add(partition_dir)


class _Hints(FileSystemEventHandler):
    """Runs on watchdog's thread: turn events into dirty partition dirs on the loop's thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        log_dirs: Sequence[Path],
        mark: Callable[[Path], None],
    ) -> None:
        self._loop = loop
        self._log_dirs = {d.resolve() for d in log_dirs}
        self._mark = mark

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in {"modified", "opened", "closed_no_write", "closed"}:
            return
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            if not raw:
                continue
            path = Path(raw if isinstance(raw, str) else raw.decode())
            partition_dir = path if event.is_directory and path.parent in self._log_dirs else None
            if partition_dir is None and path.parent.parent in self._log_dirs:
                partition_dir = path.parent
            if partition_dir is None and path.parent in self._log_dirs:
                partition_dir = path
            if partition_dir is not None:
                self._loop.call_soon_threadsafe(self._mark, partition_dir)


class LogDirDetector(Generic[V]):
    """Watch log dirs and keep ``views`` (partition dir → view) current.

    ``scan_partition`` turns one partition directory into a view, or ``None`` when the directory
    is not a partition we track (gone, ``-delete``, garbage). ``on_change(dir, old, new)`` is
    called on the loop for every partition whose view changed (``old``/``new`` ``None`` when it
    appeared or disappeared).
    """

    def __init__(
        self,
        *,
        log_dirs: Sequence[Path],
        scan_partition: Callable[[Path], V | None],
        on_change: Callable[[Path, V | None, V | None], None],
        rescan_interval_s: float,
        metrics: Metrics,
        observer_factory: Callable[[], BaseObserver] = Observer,
    ) -> None:
        self._log_dirs = [Path(d) for d in log_dirs]
        self._observer_factory = observer_factory
        #: inotify hints are on (False after the kernel refused the watches: rescans only)
        self.watching = False
        self._scan_partition = scan_partition
        self._on_change = on_change
        self._interval = rescan_interval_s
        self._metrics = metrics
        self.views: ViewMap[V] = ViewMap()
        self._dirty: set[Path] = set()
        self._wake = asyncio.Event()
        self.scanned = asyncio.Event()  # set after every completed scan (tests and readiness)
        self.full_scans = 0
        self.stat_scans = 0
        #: partition dir (as listed) → its stamp when last scanned (see ``_stamp``)
        self._stamps: dict[str, int] = {}
        #: seconds from the end of the last full rescan to the next one
        self.rescan_spacing_s = rescan_interval_s
        self._observer: BaseObserver | None = None
        #: the log dirs the running watcher was started on (the others did not exist then)
        self._watched: list[Path] = []
        #: partition dirs appeared since the last check of the watch limit
        self._appeared = False
        #: the watch limit's warning was given (once per run)
        self._limit_warned = False

    def _mark(self, partition_dir: Path) -> None:
        self._metrics.log_dir_events.inc()
        self._dirty.add(partition_dir)
        self._wake.set()

    def _list_partition_dirs(self) -> list[Path]:
        dirs: list[Path] = []
        for log_dir in self._log_dirs:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                dirs.extend(p for p in log_dir.iterdir() if p.is_dir())
        return dirs

    def _scan(self, dirs: Iterable[Path] | None) -> dict[Path, V | None]:
        """Thread side: scan the given partition dirs, or all of them (full reconcile)."""
        targets = self._list_partition_dirs() if dirs is None else list(dirs)
        result: dict[Path, V | None] = {}
        stamps = self._stamps
        for d in targets:
            key = str(d)
            try:
                stamp = _stamp(d.stat(), time.time_ns())  # before the scan: a change during
            except OSError:  # it shows as a newer stamp next time
                stamp = None
            if stamp is None:
                stamps.pop(key, None)
            else:
                stamps[key] = stamp
            result[d.resolve()] = self._scan_partition(d)
        return result

    def _stale(self, viewed: list[Path]) -> tuple[list[Path], list[Path]]:
        """Thread side: the partition dirs whose stamp differs from their last scan's (or that
        are new), and the ``viewed`` dirs no longer listed."""
        stale: list[Path] = []
        listed: set[str] = set()
        stamps = self._stamps
        now_ns = time.time_ns()
        for log_dir in self._log_dirs:
            try:
                entries = os.scandir(log_dir)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with entries:
                for entry in entries:
                    try:
                        if not entry.is_dir():
                            continue
                        stamp = _stamp(entry.stat(), now_ns)
                    except OSError:
                        continue  # gone since the listing
                    listed.add(entry.path)
                    if stamp is None or stamps.get(entry.path) != stamp:
                        stale.append(Path(entry.path))
        for key in [k for k in stamps if k not in listed]:
            del stamps[key]
        gone = [d for d in viewed if str(d) not in listed and not d.is_dir()]
        return stale, gone

    async def rescan_stale(self) -> None:
        """The safety net between full rescans: a stat of every partition dir; the dirs that
        changed since their last scan are scanned, the gone ones dropped."""
        started = time.perf_counter()
        try:
            stale, gone = await asyncio.to_thread(self._stale, list(self.views))
            scanned = await asyncio.to_thread(self._scan, stale) if stale else {}
            await self._merge({**scanned, **dict.fromkeys(gone)})
        except Exception:
            self._metrics.log_dir_scans.labels("error").inc()
            log.exception("log_dir_scan_failed", scan="stat")
            raise
        self.stat_scans += 1
        self._metrics.log_dir_scans.labels("ok").inc()
        self._metrics.log_dir_scan_seconds.observe(time.perf_counter() - started)
        self.scanned.set()

    async def _merge(self, scanned: dict[Path, V | None]) -> None:
        """Loop side: apply scan results and report changes, ``_MERGE_CHUNK`` changes per
        event-loop turn. ``views`` changes in place: readers iterate it within one turn."""
        changes = 0
        for d, new in scanned.items():
            old = self.views.get(d)
            if new is None:
                if old is None:
                    continue
                del self.views[d]
            elif old != new:
                self.views[d] = new
                self._appeared = self._appeared or old is None
            else:
                continue
            self.views.note(d)
            self._on_change(d, old, new)
            changes += 1
            if changes % _MERGE_CHUNK == 0:
                await asyncio.sleep(0)

    async def scan_once(self, dirs: set[Path] | None = None) -> None:
        """Scan now: all partition dirs when ``dirs`` is None, else just those.

        Only a full scan counts in ``log_dir_scans``: a scan of the partition dirs a hint
        named lists no log dir, and its success would hide full scans that keep failing."""
        started = time.perf_counter()
        try:
            if dirs is None:
                await self._full_scan()
            else:
                await self._merge(await asyncio.to_thread(self._scan, dirs))
        except Exception:
            if dirs is None:
                self._metrics.log_dir_scans.labels("error").inc()
            log.exception("log_dir_scan_failed", scan="full" if dirs is None else "hinted")
            raise
        if dirs is None:
            self.full_scans += 1
            self._metrics.log_dir_scans.labels("ok").inc()
            self._metrics.log_dir_scan_seconds.observe(time.perf_counter() - started)
        self.scanned.set()

    async def _full_scan(self) -> None:
        """Every partition dir, ``_FULL_SCAN_STEP`` at a time, with the dirs marked meanwhile
        scanned between the steps; then the views of dirs no longer there are dropped."""
        listed = await asyncio.to_thread(self._list_partition_dirs)
        seen: set[Path] = set()
        for first in range(0, len(listed), _FULL_SCAN_STEP):
            if self._dirty:
                dirty, self._dirty = self._dirty, set()
                scanned = await asyncio.to_thread(self._scan, dirty)
                seen.update(scanned)
                await self._merge(scanned)
            scanned = await asyncio.to_thread(self._scan, listed[first : first + _FULL_SCAN_STEP])
            seen.update(scanned)
            await self._merge(scanned)
        await self._merge(dict.fromkeys([d for d in self.views if d not in seen]))
        await asyncio.to_thread(self._forget_stamps, listed)

    def _forget_stamps(self, listed: list[Path]) -> None:
        """Thread side: drop the stamps of dirs gone since (without the hints no stat-only
        rescan, which does it otherwise, runs; every deleted topic's dir would stay)."""
        kept = {str(d) for d in listed}
        for key in [k for k in self._stamps if k not in kept and not Path(k).is_dir()]:
            self._stamps.pop(key, None)

    def _start_hints(self, handler: FileSystemEventHandler) -> None:
        """Thread side: start a watcher on the log dirs that exist now (a walk of every
        partition dir: seconds at ten thousand)."""
        watched = [d for d in self._log_dirs if d.is_dir()]
        try:
            self._observer = start_observer(handler, self._log_dirs, self._observer_factory)
        except OSError as exc:
            if self.full_scans == 0:
                raise  # at the start: as before, the daemon says what is wrong and stops
            # started again later (a log dir gone meanwhile, a failing disk): rescans only
            log.warning("log_dir_watch_failed", error=str(exc), fallback="rescans only")
            self._observer = None
        self._watched = watched if self._observer is not None else []
        # a watcher that started has just probed the limit after its walk (the first one's
        # warning, if any, was given by start_observer)
        self._limit_warned = self._observer is None
        self._appeared = False
        self.watching = self._observer is not None
        self._metrics.log_dir_hints.set(1 if self.watching else 0)

    def _stop_hints(self) -> None:
        """Thread side: stop the watcher, if any."""
        observer, self._observer = self._observer, None
        if observer is not None:
            with contextlib.suppress(Exception):
                observer.stop()
                observer.join(5.0)

    def _hints_need_restart(self) -> str | None:
        """Why the running watcher no longer covers the log dirs, or None."""
        observer = self._observer
        if observer is None:
            return None
        try:
            emitters = list(observer.emitters)  # the set itself, which watchdog's threads change
        except RuntimeError:
            return "watcher_stopped"  # changed under the copy: an emitter went away
        if not observer.is_alive() or not all(e.is_alive() for e in emitters):
            return "watcher_stopped"
        if any(d not in self._watched and d.is_dir() for d in self._log_dirs):
            return "log_dir_appeared"
        return None

    async def check_hints(self, handler: FileSystemEventHandler) -> None:
        """With the hints on: start the watcher again when a log dir appeared or the watcher
        stopped; after new partition dirs, warn once if the watch limit left them unwatched.
        The stat-only rescan that follows sees what the hints missed meanwhile."""
        if self._observer is None:
            return
        reason = self._hints_need_restart()
        if reason is not None:
            log.warning("log_dir_watch_restart", reason=reason)
            self._metrics.log_dir_watch_restarts.inc()
            await asyncio.to_thread(self._stop_hints)
            await asyncio.to_thread(self._start_hints, handler)
            return
        if self._appeared and not self._limit_warned:
            self._appeared = False
            try:
                await asyncio.to_thread(_check_watches_left, self._log_dirs)
            except OSError as exc:
                if exc.errno not in _WATCH_LIMIT_ERRNOS:
                    raise
                self._limit_warned = True
                self._metrics.log_dir_hints.set(0)
                log.warning(
                    "inotify_watch_limit_reached",
                    error=str(exc),
                    fallback="new partition dirs go unwatched; their rolls are seen by the"
                    " rescans, within tiering.rescan_interval_s",
                    fix="raise the limits on the host, e.g. sysctl -w"
                    " fs.inotify.max_user_watches=1048576 (one watch per partition dir)",
                )

    async def run(self, stopping: asyncio.Event) -> None:
        """Root task: full scan, then event-driven partial scans and periodic full scans."""
        loop = asyncio.get_running_loop()
        handler = _Hints(loop, self._log_dirs, self._mark)
        # a watch on every partition dir: seconds at ten thousand, not on the event loop
        await asyncio.to_thread(self._start_hints, handler)
        try:
            next_full = 0.0
            next_stat = float("inf")  # stat-only rescans: with the hints on only
            while not stopping.is_set():
                now = loop.time()
                if now >= next_stat and now < next_full:
                    await self.check_hints(handler)
                    if not self.watching:  # the watcher could not start again: as without
                        next_stat = float("inf")
                        next_full = loop.time()
                        continue
                try:
                    if now >= next_full:
                        self._dirty.clear()
                        first = self.full_scans == 0
                        await self.scan_once(None)
                        if first:  # the dirs there at the start: the start's probe covered them
                            self._appeared = False
                        took = loop.time() - now
                        self.rescan_spacing_s = self._interval
                        if self.watching:  # rolls are seen through the hints meanwhile
                            self.rescan_spacing_s = max(self._interval, took * _FULL_RESCAN_SPACING)
                            next_stat = loop.time() + self._interval
                        next_full = loop.time() + self.rescan_spacing_s
                    elif now >= next_stat:
                        await self.rescan_stale()
                        took = loop.time() - now
                        next_stat = loop.time() + max(self._interval, took * _RESCAN_SPACING)
                    elif self._dirty:
                        dirty, self._dirty = self._dirty, set()
                        await self.scan_once(dirty)
                except OSError:
                    # counted and logged by the scan, and no view was dropped: a log dir that
                    # cannot be listed (EACCES, EIO of a failing disk) stops neither the
                    # daemon nor the hints; a full scan tries again after rescan_interval_s
                    next_full = loop.time() + self._interval
                    next_stat = float("inf")  # the full scan first; it sets the next one
                self._wake.clear()
                if self._dirty:
                    continue
                await wait_any(stopping, self._wake, within=min(next_full, next_stat) - loop.time())
                if self._wake.is_set() and not stopping.is_set():
                    # let the rest of a roll's burst of events arrive: one rescan, not five
                    await asyncio.sleep(_DEBOUNCE_S)
        finally:
            await asyncio.to_thread(self._stop_hints)
