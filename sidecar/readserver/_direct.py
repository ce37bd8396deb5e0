"""Writing chunk-cache files with ``O_DIRECT``, then reading them back into the page cache.

A buffered write of a new file into fresh page-cache pages cost 2.2-2.5 CPU-s per GiB on the
2-core test VM (Firecracker, ext4; it hands free memory back to its host, so pages not used for
a while are expensive to get again), against 0.06-0.08 through ``O_DIRECT`` (the bytes go from a
user buffer to the device) and 0.3 with the pages read back into the page cache afterwards
(:func:`_read_back`). A buffered write into pages just freed, as when a full cache evicts a
chunk for each one it writes, costs 0.3-0.4 with its writeback, against 0.5-0.6 for
``O_DIRECT`` and the read-back: the chunk cache uses this module only while it fills.

``O_DIRECT`` wants the buffer, the file position and the length aligned to the device's logical
block size. Each piece is copied into a page-aligned scratch buffer of the writing thread
(:data:`PIECE_BYTES`, allocated once per thread); the last partial block of a length that is not
a multiple of :data:`ALIGN` is written through the page cache (``O_DIRECT`` cleared on the open
file), so the file never holds more than its bytes. A filesystem that refuses
``O_DIRECT`` (``EINVAL``: tmpfs on older kernels, some network filesystems) gets a buffered write
instead, and the caller learns it from the result.

Blocking: call from a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import threading
from pathlib import Path

__all__ = ["ALIGN", "DIRECT_SUPPORTED", "FILE_MODE", "PIECE_BYTES", "write_file"]

#: alignment of buffers, positions and lengths (a page: the largest logical block size in use)
ALIGN = 4096
#: bytes copied and written per ``O_DIRECT`` write (the scratch buffer of each thread)
PIECE_BYTES = 1024 * 1024
#: whether this platform has ``O_DIRECT`` at all
DIRECT_SUPPORTED = hasattr(os, "O_DIRECT")
#: the mode a new file is created with (less the umask): tiered data is not for every user
#: of the host; the broker plugin, which reads the files, is in their group (the pod's
#: ``fsGroup``, or the sidecar's group on a systemd host)
FILE_MODE = 0o640

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
_THREAD = threading.local()


def _scratch() -> mmap.mmap:
    """This thread's page-aligned :data:`PIECE_BYTES` buffer (an anonymous mapping)."""
    scratch: mmap.mmap | None = getattr(_THREAD, "scratch", None)
    if scratch is None:
        scratch = _THREAD.scratch = mmap.mmap(-1, PIECE_BYTES)
    return scratch


def write_file(path: Path, data: bytes | memoryview, *, direct: bool = True) -> bool:
    """Create (or replace) ``path`` holding ``data``; returns whether it was written with
    ``O_DIRECT``. ``direct=False``, a platform without ``O_DIRECT`` or a filesystem that refuses
    it: a buffered write. Any other ``OSError`` (a full disk) propagates, and no file is left
    at ``path``."""
    try:
        return _write_file(path, data, direct)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _write_file(path: Path, data: bytes | memoryview, direct: bool) -> bool:
    if direct and DIRECT_SUPPORTED and _write_direct_or_refused(path, data):
        return True
    # replaces what a refused O_DIRECT write left
    with os.fdopen(os.open(path, _FLAGS, FILE_MODE), "wb") as out:
        out.write(data)
    return False


def _write_direct_or_refused(path: Path, data: bytes | memoryview) -> bool:
    """Write ``path`` with ``O_DIRECT`` and read it back; False when the filesystem or the
    device refuses ``O_DIRECT`` (``EINVAL`` at the open or the first write)."""
    try:
        fd = os.open(path, _FLAGS | os.O_DIRECT, FILE_MODE)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False
    try:
        _write_direct(fd, data)
        _read_back(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False
    finally:
        os.close(fd)
    return True


def _read_back(fd: int) -> None:
    """Ask for the file's pages in the page cache (``POSIX_FADV_WILLNEED`` starts the reads and
    returns): a chunk just fetched is the likeliest to be read again soon, and its reads then
    find it in memory as after a buffered write. Filling pages from the device cost 0.24 CPU-s
    per GiB on the VM above, a tenth of the buffered write."""
    with contextlib.suppress(OSError):  # advice only
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)


def _write_direct(fd: int, data: bytes | memoryview) -> None:
    scratch = _scratch()
    with memoryview(data) as source, memoryview(scratch) as buffer:
        size = source.nbytes
        aligned = size - size % ALIGN
        position = 0
        while position < aligned:
            length = min(PIECE_BYTES, aligned - position)
            buffer[:length] = source[position : position + length]
            with buffer[:length] as piece:
                written = os.pwrite(fd, piece, position)
            if written != length:
                raise OSError(
                    errno.EIO, f"short O_DIRECT write: {written} of {length} bytes at {position}"
                )
            position += length
        if aligned < size:
            # the last partial block goes through the page cache: the file is never longer
            # than its bytes (the cache's disk budget counts file sizes)
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            with source[aligned:] as tail:
                while position < size:
                    with tail[position - aligned :] as rest:
                        position += os.pwrite(fd, rest, position)
