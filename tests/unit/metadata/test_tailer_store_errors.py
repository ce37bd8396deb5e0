"""Which metadata-store failures the tailer retries: a write the disk refused (SQLite FULL or
IOERR, rolled back) is retried once space returns, one another process's lock held past the busy
timeout (BUSY) once it is released; a store that disagrees with the topic is not."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sidecar.metadata.errors import MetadataStoreError
from sidecar.metadata.tailer import _store_may_recover


def _full_error(tmp_path: Path) -> sqlite3.OperationalError:
    """A real SQLITE_FULL: a database capped at a few pages, written past its cap."""
    db = sqlite3.connect(tmp_path / "capped.sqlite3")
    try:
        db.execute("CREATE TABLE t (v BLOB)")
        db.execute("PRAGMA max_page_count = 8")
        for _ in range(100):
            try:
                db.execute("INSERT INTO t VALUES (zeroblob(4096))")
            except sqlite3.OperationalError as exc:
                return exc
        raise AssertionError("the capped database took every write")
    finally:
        db.close()


def _wrapped(cause: BaseException | None) -> MetadataStoreError:
    error = MetadataStoreError("metadata store /state/metadata.sqlite3: failed")
    error.__cause__ = cause
    return error


def test_a_full_disk_is_retried(tmp_path: Path) -> None:
    cause = _full_error(tmp_path)
    assert "full" in str(cause)
    assert _store_may_recover(_wrapped(cause))


def test_an_os_error_is_retried() -> None:
    assert _store_may_recover(_wrapped(OSError(28, "No space left on device")))


def test_a_store_ahead_of_the_topic_is_not_retried(tmp_path: Path) -> None:
    assert not _store_may_recover(_wrapped(None))
    db = sqlite3.connect(tmp_path / "x.sqlite3")
    try:
        with pytest.raises(sqlite3.OperationalError) as caught:
            db.execute("SELECT * FROM missing")
    finally:
        db.close()
    assert not _store_may_recover(_wrapped(caught.value))


def test_another_process_holding_the_lock_is_retried(tmp_path: Path) -> None:
    """SQLITE_BUSY past the busy timeout (another process writing the store): the write is
    rolled back and applies once the lock is released, so the tailer keeps running."""
    path = tmp_path / "store.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    writer = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        holder.execute("CREATE TABLE t (v INTEGER)")
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as caught:
            writer.execute("INSERT INTO t VALUES (1)")
    finally:
        holder.close()
        writer.close()
    assert caught.value.sqlite_errorcode == sqlite3.SQLITE_BUSY
    assert _store_may_recover(_wrapped(caught.value))
