"""Chunk files written around the page cache: exact bytes at every alignment, and a buffered
write where the filesystem refuses O_DIRECT."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from sidecar.readserver import _direct
from sidecar.readserver._direct import ALIGN, PIECE_BYTES, write_file

SIZES = [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, PIECE_BYTES, PIECE_BYTES + 1, 3 * PIECE_BYTES + 17]


@pytest.mark.parametrize("size", SIZES)
def test_direct_write_keeps_every_byte(tmp_path: Path, size: int) -> None:
    """Any length, from an unaligned view of a larger buffer: the file holds exactly the bytes,
    and the write went around the page cache (this test runs on a disk filesystem)."""
    whole = os.urandom(size + 7)
    data = memoryview(whole)[3 : 3 + size]
    path = tmp_path / "chunk"
    assert write_file(path, data) is True
    assert path.read_bytes() == whole[3 : 3 + size]


def test_direct_write_replaces_a_longer_file(tmp_path: Path) -> None:
    """A leftover under the same name is replaced, not overwritten in place."""
    path = tmp_path / "chunk"
    path.write_bytes(b"x" * (3 * ALIGN))
    assert write_file(path, b"short") is True
    assert path.read_bytes() == b"short"


def test_buffered_write_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "chunk"
    assert write_file(path, b"abc" * 5000, direct=False) is False
    assert path.read_bytes() == b"abc" * 5000


def test_open_refused_falls_back_to_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem whose open refuses O_DIRECT (EINVAL) gets a buffered write of the same
    bytes, and the caller is told."""
    real_open = os.open

    def refusing_open(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(_direct.os, "open", refusing_open)
    path = tmp_path / "chunk"
    data = os.urandom(PIECE_BYTES + 5)
    assert write_file(path, data) is False
    assert path.read_bytes() == data


def test_write_refused_falls_back_to_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device that refuses the alignment at the first write: the partial file is replaced by a
    buffered write of every byte."""

    def refusing_pwrite(fd: int, data: Any, position: int) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(_direct.os, "pwrite", refusing_pwrite)
    path = tmp_path / "chunk"
    data = os.urandom(2 * ALIGN + 1)
    assert write_file(path, data) is False
    assert path.read_bytes() == data


def test_other_errors_propagate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk is not a refusal of O_DIRECT: it is raised (the cache logs and forgets the
    chunk), not retried buffered."""

    def full_pwrite(fd: int, data: Any, position: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_direct.os, "pwrite", full_pwrite)
    path = tmp_path / "chunk"
    with pytest.raises(OSError, match="No space") as caught:
        write_file(path, os.urandom(2 * ALIGN))
    assert caught.value.errno == errno.ENOSPC
    assert not path.exists()  # nothing partial is left to take disk space


def test_a_full_disk_in_a_buffered_write_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A buffered write that runs out of space removes the file it had created."""
    path = tmp_path / "chunk"
    real_fdopen = os.fdopen

    class _Full:
        def __init__(self, handle: Any) -> None:
            self._handle = handle

        def __enter__(self) -> _Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self._handle.close()

        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    def full_fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        return _Full(real_fdopen(fd, *args, **kwargs))

    monkeypatch.setattr(os, "fdopen", full_fdopen)
    with pytest.raises(OSError, match="No space"):
        write_file(path, b"data", direct=False)
    assert not path.exists()


def test_the_file_never_grows_past_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache's disk budget counts file sizes: no write makes the file longer than the data
    (no zero-padded last block), whatever the length."""
    real_pwrite = os.pwrite
    sizes: list[int] = []

    def watching_pwrite(fd: int, data: Any, position: int) -> int:
        written = real_pwrite(fd, data, position)
        sizes.append(os.fstat(fd).st_size)
        return written

    monkeypatch.setattr(_direct.os, "pwrite", watching_pwrite)
    size = 2 * PIECE_BYTES + ALIGN + 100
    data = os.urandom(size)
    path = tmp_path / "chunk"
    assert write_file(path, data) is True
    assert max(sizes) == size
    assert path.read_bytes() == data


def test_short_direct_write_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_pwrite = os.pwrite

    def short_pwrite(fd: int, data: Any, position: int) -> int:
        return real_pwrite(fd, memoryview(data)[:ALIGN], position)

    monkeypatch.setattr(_direct.os, "pwrite", short_pwrite)
    with pytest.raises(OSError, match="short O_DIRECT write"):
        write_file(tmp_path / "chunk", os.urandom(4 * ALIGN))
