"""The log-dir detector: full scans, inotify hints for single partitions, removal."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.observability.metrics import Metrics
from sidecar.tiering.detector import LogDirDetector


def _files(d: Path) -> tuple[str, ...] | None:
    if not d.is_dir() or "-" not in d.name:
        return None
    return tuple(sorted(p.name for p in d.iterdir()))


def _detector(
    log_dir: Path,
    *,
    on_change: Callable[[Path, object, object], None],
    scan: Callable[[Path], object] = _files,
    interval: float = 3600,
) -> LogDirDetector[object]:
    """A detector of one log dir (an hour between full rescans unless told)."""
    return LogDirDetector(
        log_dirs=[log_dir],
        scan_partition=scan,
        on_change=on_change,
        rescan_interval_s=interval,
        metrics=Metrics(),
    )


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, object, object]] = []
        self.event = asyncio.Event()

    def __call__(self, d: Path, old: object, new: object) -> None:
        self.changes.append((d.name, old, new))
        self.event.set()

    async def next(self, timeout: float = 10.0) -> tuple[str, object, object]:
        await asyncio.wait_for(self.event.wait(), timeout)
        self.event.clear()
        return self.changes[-1]


async def _hinted_change(rec: Recorder, partition_dir: Path) -> tuple[str, object, object]:
    """Create files in ``partition_dir`` until the detector reports a change (the observer's
    thread may start watching after the first scan has ended)."""
    for attempt in range(50):
        (partition_dir / f"0000000000000000{attempt:04d}.snapshot").write_bytes(b"")
        try:
            return await rec.next(timeout=0.5)
        except TimeoutError:
            continue
    raise AssertionError("no change reported after inotify events")


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    (d / "orders-0").mkdir(parents=True)
    (d / "orders-0" / "00000000000000000000.log").write_bytes(b"")
    return d


class TestLogDirDetector:
    async def test_initial_full_scan_reports_partitions(self, log_dir):
        """The first scan reports every partition directory as new."""
        rec = Recorder()
        det = _detector(log_dir, on_change=rec)
        await det.scan_once()
        assert rec.changes == [("orders-0", None, ("00000000000000000000.log",))]
        assert det.full_scans == 1

    async def test_inotify_hint_rescans_the_partition(self, log_dir):
        """A file created in a partition dir is seen without waiting for the periodic rescan."""
        rec = Recorder()
        det = _detector(log_dir, on_change=rec)
        stopping = asyncio.Event()
        task = asyncio.create_task(det.run(stopping))
        await rec.next()
        # wait for the observer thread to be watching before we create a file
        await asyncio.wait_for(det.scanned.wait(), 10)
        name, old, new = await _hinted_change(rec, log_dir / "orders-0")
        stopping.set()
        await asyncio.wait_for(task, 10)
        assert name == "orders-0"
        assert old is not None
        assert any(n.endswith(".snapshot") for n in new)  # type: ignore[union-attr]
        assert det.full_scans == 1  # found through the hint, not a full rescan

    async def test_a_symlinked_log_dir_gets_its_hints(self, log_dir, tmp_path):
        """A log dir configured through a symlink (a mount's alias) is watched where it is:
        a new file is seen through the hint, not a full rescan."""
        alias = tmp_path / "alias"
        alias.symlink_to(log_dir, target_is_directory=True)
        rec = Recorder()
        det = _detector(alias, on_change=rec)
        stopping = asyncio.Event()
        task = asyncio.create_task(det.run(stopping))
        await rec.next()
        await asyncio.wait_for(det.scanned.wait(), 10)
        assert det.watching
        name, _, new = await _hinted_change(rec, log_dir / "orders-0")
        stopping.set()
        await asyncio.wait_for(task, 10)
        assert name == "orders-0"
        assert any(n.endswith(".snapshot") for n in new)  # type: ignore[union-attr]
        assert det.full_scans == 1  # through the hint
        assert det.stat_scans == 0

    async def test_removed_partition_is_reported(self, log_dir):
        """A partition directory that disappears is reported with new=None on the next scan."""
        rec = Recorder()
        det = _detector(log_dir, on_change=rec)
        await det.scan_once()
        for f in (log_dir / "orders-0").iterdir():
            f.unlink()
        (log_dir / "orders-0").rmdir()
        await det.scan_once()
        assert rec.changes[-1][0] == "orders-0"
        assert rec.changes[-1][2] is None
        assert det.views == {}

    async def test_non_partitions_are_ignored(self, log_dir):
        """Directories the scan function rejects never become views."""
        (log_dir / "garbage").mkdir()
        rec = Recorder()
        det = _detector(log_dir, on_change=rec)
        await det.scan_once()
        assert [c[0] for c in rec.changes] == ["orders-0"]

    async def test_missing_log_dir_is_not_fatal(self, tmp_path):
        """A configured log dir that does not exist yet scans as empty."""
        rec = Recorder()
        det = _detector(tmp_path / "absent", on_change=rec)
        stopping = asyncio.Event()
        task = asyncio.create_task(det.run(stopping))
        await asyncio.wait_for(det.scanned.wait(), 10)
        stopping.set()
        await asyncio.wait_for(task, 10)
        assert rec.changes == []

    async def test_failing_scans_are_counted_and_retried_not_fatal(self, log_dir):
        """A scan that fails with an OSError (a failing disk's EIO, EACCES) is counted as
        ``log_dir_scans{outcome="error"}`` and logged; the detector goes on and its next full
        scan, once the disk reads again, reports the partition."""
        import errno

        from structlog.testing import capture_logs

        failures = [2]

        def flaky(d: Path) -> object:
            if failures[0]:
                failures[0] -= 1
                raise OSError(errno.EIO, "Input/output error", str(d))
            return _files(d)

        rec = Recorder()
        det = _detector(log_dir, on_change=rec, scan=flaky, interval=0.01)
        metrics = det._metrics
        stopping = asyncio.Event()
        with capture_logs() as logs:
            task = asyncio.create_task(det.run(stopping))
            await asyncio.wait_for(det.scanned.wait(), 10)
            stopping.set()
            await asyncio.wait_for(task, 10)
        assert rec.changes == [("orders-0", None, ("00000000000000000000.log",))]
        assert metrics.log_dir_scans.labels("error")._value.get() == 2
        assert metrics.log_dir_scans.labels("ok")._value.get() >= 1
        assert [e["event"] for e in logs].count("log_dir_scan_failed") == 2

    async def test_only_scans_that_list_the_log_dirs_count(self, log_dir):
        """Full scans and stat-only rescans count in ``log_dir_scans``; a rescan of the
        partition dirs a hint named does not, so its success cannot hide full scans that
        keep failing."""
        det = _detector(log_dir, on_change=Recorder())
        ok = det._metrics.log_dir_scans.labels("ok")
        await det.scan_once()
        assert ok._value.get() == 1
        (log_dir / "orders-0" / "00000000000000000100.log").write_bytes(b"")
        await det.scan_once({log_dir / "orders-0"})
        assert ok._value.get() == 1
        await det.rescan_stale()
        assert ok._value.get() == 2


class TestWatchLimit:
    """The kernel refuses inotify watches (fs.inotify.max_user_watches too small for the
    partition dirs): one warning with the sysctl to raise, then full rescans; never a crash."""

    @pytest.mark.parametrize("granted", [0, 1], ids=["log-dir-refused", "partition-dirs-refused"])
    async def test_watch_limit_falls_back_to_rescans(self, log_dir, monkeypatch, granted):
        """``granted`` watches before the limit: with none the log dir's own watch is refused
        (watchdog raises); with one, as a real limit below the partition dirs does, only the
        partition dirs' are (watchdog 7 starts without a word, the detector's probe tells)."""
        import ctypes
        import errno

        from structlog.testing import capture_logs
        from watchdog.observers import inotify_c

        real = inotify_c.inotify_add_watch
        left = [granted]

        def limited(fd: int, path: bytes, mask: int) -> int:
            if left[0] > 0:
                left[0] -= 1
                return real(fd, path, mask)
            ctypes.set_errno(errno.ENOSPC)  # what the kernel answers past the watch limit
            return -1

        # the real watchdog observer and its error handling; only the syscall is limited
        monkeypatch.setattr(inotify_c, "inotify_add_watch", limited)
        rec = Recorder()
        det = _detector(log_dir, on_change=rec, interval=0.05)
        stopping = asyncio.Event()
        with capture_logs() as logs:
            task = asyncio.create_task(det.run(stopping))
            await asyncio.wait_for(det.scanned.wait(), 10)
            (log_dir / "orders-0" / "00000000000000000100.log").write_bytes(b"")
            while len(rec.changes) < 2:  # the next full rescan sees the roll
                det.scanned.clear()
                await asyncio.wait_for(det.scanned.wait(), 10)
            stopping.set()
            await asyncio.wait_for(task, 10)
        assert det.watching is False
        assert rec.changes[-1][0] == "orders-0"
        assert "00000000000000000100.log" in rec.changes[-1][2]
        warnings = [e for e in logs if e["event"] == "inotify_watch_limit_reached"]
        assert len(warnings) == 1
        assert "fs.inotify.max_user_watches" in warnings[0]["fix"]

    async def test_other_watch_errors_still_fail(self, log_dir):
        from sidecar.tiering.detector import start_observer

        class Broken:
            def schedule(self, *args: object, **kwargs: object) -> None:
                return None

            def start(self) -> None:
                raise PermissionError(13, "denied")

            def stop(self) -> None:
                return None

        with pytest.raises(PermissionError):
            start_observer(object(), [log_dir], Broken)  # type: ignore[arg-type]


class TestHintsAfterStart:
    """The hints stop covering everything after the start, without a word from watchdog: a
    log dir created later, a watcher whose thread ended, partition dirs created past the watch
    limit. Before each stat-only rescan the detector finds these, starts the watcher again or
    warns once, and the stat-only rescans see the rolls meanwhile."""

    @staticmethod
    async def _until(det: LogDirDetector[object], done: Callable[[], bool]) -> None:
        """Wait through the detector's scans until ``done()`` holds."""
        for _ in range(500):
            if done():
                return
            det.scanned.clear()
            await asyncio.wait_for(det.scanned.wait(), 10)
        raise AssertionError("the detector's scans went on without the expected state")

    @staticmethod
    def _hinted(metrics: Metrics, partition_dir: Path) -> Callable[[], bool]:
        """A probe that creates a file in ``partition_dir`` and holds once the hints count
        more events than before (only the watcher counts events)."""
        before = [-1.0]
        created = [0]

        def probe() -> bool:
            count = metrics.log_dir_events._value.get()
            if before[0] >= 0 and count > before[0]:
                return True
            before[0] = count
            created[0] += 1
            (partition_dir / f"{created[0]:020d}.snapshot").write_bytes(b"")
            return False

        return probe

    def _run(
        self,
        log_dir: Path,
        rec: Recorder,
        monkeypatch,
        observers: list[object] | None = None,
        restarted_as: type | None = None,
    ) -> tuple[LogDirDetector[object], Metrics]:
        """A detector of ``log_dir`` whose watchers are appended to ``observers``; a watcher
        started again is a ``restarted_as`` (default: watchdog's own)."""
        from watchdog.observers import Observer

        from sidecar.tiering import detector

        monkeypatch.setattr(detector, "_FULL_RESCAN_SPACING", 1e9)  # stat-only rescans only
        metrics = Metrics()
        started: list[object] = [] if observers is None else observers

        def factory() -> Observer:
            kind = Observer if not started or restarted_as is None else restarted_as
            observer = kind()
            started.append(observer)
            return observer

        det = LogDirDetector(
            log_dirs=[log_dir],
            scan_partition=_files,
            on_change=rec,
            rescan_interval_s=0.05,
            metrics=metrics,
            observer_factory=factory,
        )
        return det, metrics

    @staticmethod
    def _stop(observer: object) -> None:
        """Stop a watcher, as an error in its thread would; on the loop's thread, so the
        detector does not look at it while it stops."""
        observer.stop()  # type: ignore[attr-defined]
        observer.join(5)  # type: ignore[attr-defined]

    async def test_a_log_dir_created_later_is_watched(self, tmp_path, monkeypatch):
        from structlog.testing import capture_logs

        log_dir = tmp_path / "data"
        rec = Recorder()
        det, metrics = self._run(log_dir, rec, monkeypatch)
        stopping = asyncio.Event()
        with capture_logs() as logs:
            task = asyncio.create_task(det.run(stopping))
            await asyncio.wait_for(det.scanned.wait(), 10)
            (log_dir / "orders-0").mkdir(parents=True)
            await self._until(det, lambda: metrics.log_dir_watch_restarts._value.get() == 1)
            await self._until(det, self._hinted(metrics, log_dir / "orders-0"))
            stopping.set()
            await asyncio.wait_for(task, 10)
        assert det.watching
        assert metrics.log_dir_hints._value.get() == 1
        restarts = [e for e in logs if e["event"] == "log_dir_watch_restart"]
        assert [e["reason"] for e in restarts] == ["log_dir_appeared"]
        assert rec.changes[0][0] == "orders-0"

    async def test_a_stopped_watcher_is_started_again(self, log_dir, monkeypatch):
        from structlog.testing import capture_logs

        rec = Recorder()
        observers: list[object] = []
        det, metrics = self._run(log_dir, rec, monkeypatch, observers)
        stopping = asyncio.Event()
        with capture_logs() as logs:
            task = asyncio.create_task(det.run(stopping))
            await asyncio.wait_for(det.scanned.wait(), 10)
            self._stop(observers[0])
            await self._until(det, lambda: len(observers) == 2)
            await self._until(det, self._hinted(metrics, log_dir / "orders-0"))
            stopping.set()
            await asyncio.wait_for(task, 10)
        assert det.watching
        assert metrics.log_dir_watch_restarts._value.get() == 1
        restarts = [e for e in logs if e["event"] == "log_dir_watch_restart"]
        assert [e["reason"] for e in restarts] == ["watcher_stopped"]

    async def test_a_watcher_that_cannot_start_again_leaves_the_rescans(self, log_dir, monkeypatch):
        """Started again after the start (a log dir gone meanwhile, a failing disk), the
        watcher fails with an error other than the limit: the detector says so and goes on
        with rescans alone, as without hints; it does not stop."""
        from structlog.testing import capture_logs
        from watchdog.observers import Observer

        class Broken(Observer):
            def start(self) -> None:
                raise OSError(5, "Input/output error")

        rec = Recorder()
        observers: list[object] = []
        det, _ = self._run(log_dir, rec, monkeypatch, observers, restarted_as=Broken)
        stopping = asyncio.Event()
        with capture_logs() as logs:
            task = asyncio.create_task(det.run(stopping))
            await asyncio.wait_for(det.scanned.wait(), 10)
            self._stop(observers[0])
            await self._until(det, lambda: len(observers) == 2 and not det.watching)
            (log_dir / "orders-0" / "00000000000000000100.log").write_bytes(b"")
            await self._until(
                det, lambda: any("00000000000000000100.log" in (c[2] or ()) for c in rec.changes)
            )
            stopping.set()
            await asyncio.wait_for(task, 10)
        assert [e["event"] for e in logs if e["event"].startswith("log_dir_watch")] == [
            "log_dir_watch_restart",
            "log_dir_watch_failed",
        ]

    async def test_partition_dirs_past_the_limit_are_warned_of_and_rescanned(
        self, log_dir, monkeypatch
    ):
        """The limit leaves room for the log dir, its one partition dir and the start's probe;
        a partition dir created afterwards gets no watch (watchdog skips it silently)."""
        import ctypes
        import errno

        from structlog.testing import capture_logs
        from watchdog.observers import inotify_c

        real = inotify_c.inotify_add_watch
        left = [3]

        def limited(fd: int, path: bytes, mask: int) -> int:
            if left[0] > 0:
                left[0] -= 1
                return real(fd, path, mask)
            ctypes.set_errno(errno.ENOSPC)
            return -1

        monkeypatch.setattr(inotify_c, "inotify_add_watch", limited)
        rec = Recorder()
        det, metrics = self._run(log_dir, rec, monkeypatch)
        stopping = asyncio.Event()
        with capture_logs() as logs:
            task = asyncio.create_task(det.run(stopping))
            await asyncio.wait_for(det.scanned.wait(), 10)
            assert metrics.log_dir_hints._value.get() == 1
            (log_dir / "orders-1").mkdir()
            await self._until(det, lambda: metrics.log_dir_hints._value.get() == 0)
            (log_dir / "orders-1" / "00000000000000000100.log").write_bytes(b"")
            await self._until(
                det, lambda: any("00000000000000000100.log" in (c[2] or ()) for c in rec.changes)
            )
            for _ in range(3):  # the warning is not repeated
                det.scanned.clear()
                await asyncio.wait_for(det.scanned.wait(), 10)
            stopping.set()
            await asyncio.wait_for(task, 10)
        assert det.watching  # the watched dirs keep their hints
        warnings = [e for e in logs if e["event"] == "inotify_watch_limit_reached"]
        assert len(warnings) == 1
        assert "unwatched" in warnings[0]["fallback"]
        assert metrics.log_dir_watch_restarts._value.get() == 0


class TestHintMask:
    """The detector's inotify watches ask only for what a roll, a deletion or a partition
    move does to the log dirs."""

    def test_reads_and_writes_are_not_watched(self, log_dir, monkeypatch):
        """No opens, closes, reads or writes are queued by the kernel: the detector's own scans
        of every partition and the broker's appends never overflow the inotify queue."""
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import inotify_c

        from sidecar.tiering.detector import start_observer

        constants = inotify_c.InotifyConstants
        calls: list[tuple[int, int]] = []
        real = inotify_c.inotify_add_watch

        def recording(fd: int, path: bytes, mask: int) -> int:
            calls.append((fd, mask))
            return real(fd, path, mask)

        monkeypatch.setattr(inotify_c, "inotify_add_watch", recording)
        observer = start_observer(FileSystemEventHandler(), [log_dir])
        assert observer is not None
        try:
            unwanted = (
                constants.IN_OPEN
                | constants.IN_CLOSE_NOWRITE
                | constants.IN_ACCESS
                | constants.IN_MODIFY
                | constants.IN_CLOSE_WRITE
                | constants.IN_ATTRIB
            )
            wanted = constants.IN_CREATE | constants.IN_DELETE | constants.IN_MOVE
            # watchdog's instance (the detector's probe of the limit uses one of its own)
            masks = [mask for fd, mask in calls if fd == calls[0][0]]
            assert len(masks) == 2  # the log dir and its partition dir
            assert [m & unwanted for m in masks] == [0, 0]
            assert [m & wanted for m in masks] == [wanted, wanted]
        finally:
            observer.stop()
            observer.join(5)


class TestStepwiseFullScan:
    """A full rescan goes a few partition dirs at a time: a partition marked meanwhile (a roll)
    is scanned between two steps, not after the whole rescan."""

    async def test_a_marked_partition_is_scanned_before_the_rescan_ends(
        self, tmp_path, monkeypatch
    ):
        from sidecar.tiering import detector

        monkeypatch.setattr(detector, "_FULL_SCAN_STEP", 2)
        log_dir = tmp_path / "data"
        for n in range(6):
            (log_dir / f"orders-{n}").mkdir(parents=True)
        (log_dir / "orders-9").mkdir()
        order: list[str] = []
        first_step = asyncio.Event()
        go_on = asyncio.Event()
        loop = asyncio.get_running_loop()

        def scan(d: Path) -> str | None:
            order.append(d.name)
            if len(order) == 2:  # the end of the first step: a roll in another partition
                loop.call_soon_threadsafe(first_step.set)
                asyncio.run_coroutine_threadsafe(go_on.wait(), loop).result(10)
            return d.name if d.is_dir() else None

        det = _detector(log_dir, scan=scan, on_change=lambda *_: None)
        full = asyncio.create_task(det.scan_once())
        await asyncio.wait_for(first_step.wait(), 10)
        (log_dir / "orders-9").rmdir()  # seen by the mark, not the rescan's listing
        det._mark(log_dir / "orders-9")
        go_on.set()
        await asyncio.wait_for(full, 10)
        assert order[2] == "orders-9"  # right after the first step
        assert sorted(order[3:]) == sorted(set(order[3:]))  # nothing scanned twice after it
        assert len(order) == 8  # 7 listed dirs and the marked one
        assert sorted(det.views) == sorted((log_dir / f"orders-{n}").resolve() for n in range(6))
        assert det.full_scans == 1

    async def test_a_partition_gone_since_the_last_rescan_is_dropped(self, log_dir):
        """A dir in the views that the next rescan does not list is reported gone."""
        rec = Recorder()
        det = _detector(log_dir, on_change=rec)
        await det.scan_once()
        (log_dir / "orders-0" / "00000000000000000000.log").unlink()
        (log_dir / "orders-0").rmdir()
        await det.scan_once()
        assert rec.changes[-1] == ("orders-0", ("00000000000000000000.log",), None)
        assert det.views == {}

    async def test_full_rescans_forget_the_stamps_of_gone_dirs(self, log_dir):
        """Without inotify hints no stat-only rescan runs, which otherwise drops the stamps of
        dirs no longer listed: the full rescans do it, so every topic ever deleted does not
        stay in memory."""
        det = _detector(log_dir, on_change=lambda *_: None)
        for n in range(3):  # topics created, then deleted (Kafka renames them first)
            (log_dir / f"gone{n}-0").mkdir()
        for d in log_dir.iterdir():  # a stamp is kept once a dir's mtime is not too recent
            os.utime(d, ns=(1_600_000_000_000_000_000,) * 2)
        await det.scan_once()
        assert len(det._stamps) == 4
        for n in range(3):
            (log_dir / f"gone{n}-0").rmdir()
        await det.scan_once()
        assert sorted(det._stamps) == [str(log_dir / "orders-0")]


class TestRescanSpacing:
    """With inotify hints on, a full rescan that took t seconds is followed by the next one no
    sooner than 20 t later (it is a safety net, and at ten thousand partitions it costs
    seconds); without hints the rescans keep the configured interval, as they are all there is."""

    async def _spacing(self, log_dir: Path, monkeypatch, *, watching: bool) -> float:
        import ctypes
        import errno
        import time

        from watchdog.observers import inotify_c

        if not watching:

            def refused(fd: int, path: bytes, mask: int) -> int:
                ctypes.set_errno(errno.ENOSPC)
                return -1

            monkeypatch.setattr(inotify_c, "inotify_add_watch", refused)

        def slow(d: Path) -> tuple[str, ...] | None:
            time.sleep(0.02)  # a rescan of many partitions
            return _files(d)

        det = _detector(log_dir, scan=slow, on_change=lambda *_: None, interval=0.05)
        stopping = asyncio.Event()
        task = asyncio.create_task(det.run(stopping))
        await asyncio.wait_for(det.scanned.wait(), 10)
        await asyncio.sleep(0)  # the loop sets the spacing right after the scan
        stopping.set()
        await asyncio.wait_for(task, 10)
        assert det.watching is watching
        return det.rescan_spacing_s

    async def test_with_hints_a_slow_rescan_spaces_out_the_next(self, log_dir, monkeypatch):
        assert await self._spacing(log_dir, monkeypatch, watching=True) >= 20 * 0.02

    async def test_without_hints_the_interval_holds(self, log_dir, monkeypatch):
        assert await self._spacing(log_dir, monkeypatch, watching=False) == 0.05


class TestStatRescan:
    """Between full rescans, the safety net is a stat of every partition dir: only the dirs
    whose entries changed since their last scan (or that are new) are scanned again, the gone
    ones dropped; a dir changed within the second before its scan is scanned again."""

    @staticmethod
    def _fresh(*dirs: Path) -> None:
        """The dirs last changed within the second before every scan of the test, however
        long the test's setup and steps take (a stamp ahead of the clock)."""
        import os
        import time

        for d in dirs:
            then = time.time() + 60
            os.utime(d, (then, then))

    @staticmethod
    def _age(*dirs: Path) -> None:
        """The dirs last changed a minute ago (their stamps are trusted)."""
        import os
        import time

        for d in dirs:
            then = time.time() - 60
            os.utime(d, (then, then))

    async def test_only_changed_new_and_gone_dirs(self, tmp_path):
        log_dir = tmp_path / "data"
        for n in range(5):
            (log_dir / f"orders-{n}").mkdir(parents=True)
        self._age(*(log_dir / f"orders-{n}" for n in range(5)))
        scanned: list[str] = []

        def scan(d: Path) -> tuple[str, ...] | None:
            scanned.append(d.name)
            return _files(d)

        rec = Recorder()
        det = _detector(log_dir, scan=scan, on_change=rec)
        await det.scan_once()
        assert sorted(scanned) == [f"orders-{n}" for n in range(5)]
        scanned.clear()
        await det.rescan_stale()
        assert scanned == []  # nothing changed: nothing read but the dirs' stats
        (log_dir / "orders-3" / "00000000000000000042.log").write_bytes(b"")  # a missed roll
        (log_dir / "orders-4").rmdir()
        (log_dir / "orders-5").mkdir()
        await det.rescan_stale()
        assert sorted(scanned) == ["orders-3", "orders-5"]
        assert det.views[(log_dir / "orders-3").resolve()] == ("00000000000000000042.log",)
        assert (log_dir / "orders-4").resolve() not in det.views
        assert ("orders-4", (), None) in rec.changes
        assert det.stat_scans == 2
        assert det.full_scans == 1

    async def test_a_dir_changed_just_before_its_scan_is_scanned_again(self, log_dir):
        scanned: list[str] = []

        def scan(d: Path) -> tuple[str, ...] | None:
            scanned.append(d.name)
            return _files(d)

        det = _detector(log_dir, scan=scan, on_change=lambda *_: None)
        self._fresh(log_dir / "orders-0")
        await det.scan_once()  # orders-0 was changed just now: its stamp is not trusted
        await det.rescan_stale()
        assert scanned == ["orders-0", "orders-0"]
        self._age(log_dir / "orders-0")
        await det.rescan_stale()  # scanned once more, with an old enough stamp
        await det.rescan_stale()
        assert scanned == ["orders-0"] * 3

    async def test_with_hints_the_stat_rescans_run_between_full_ones(self, log_dir, monkeypatch):
        from sidecar.tiering import detector

        monkeypatch.setattr(detector, "_FULL_RESCAN_SPACING", 1e9)  # not within the test
        det = _detector(log_dir, on_change=lambda *_: None, interval=0.01)
        stopping = asyncio.Event()
        task = asyncio.create_task(det.run(stopping))
        while det.stat_scans < 3:
            await asyncio.wait_for(det.scanned.wait(), 10)
            det.scanned.clear()
        stopping.set()
        await asyncio.wait_for(task, 10)
        assert det.watching
        assert det.full_scans == 1
