"""Read errors from a failing disk, injected into the sidecar's segment reads.

:func:`failing_opener` wraps the opener that ``sidecar.kafka.records`` uses for a segment given
by path (the uploader's batch-CRC walk opens ``/proc/self/fd/N`` of the segment it holds): the
first ``times`` opens of ``target`` return a file whose reads raise ``OSError(EIO)``, as a disk
with a bad sector does; later opens read normally. The sidecar's own code turns the ``OSError``
into its typed error, so the whole path from the failed ``read`` on is the production one.

Run as ``python -m tests.read_faults run --config FILE`` it is ``sidecar run`` with the fault
installed from ``TEST_READ_FAULT=<path of a .log>:<times>`` (the e2e tests start the
daemon this way). Nothing in ``sidecar/`` imports this module.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sidecar.kafka.records as records

ENV = "TEST_READ_FAULT"  # not SIDECAR_*: the config reads those


class _FailingFile:
    """An open file whose reads fail with EIO (seek, fstat and close work)."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh

    def _eio(self, *_args: Any) -> Any:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    read = readinto = _eio

    def seek(self, *args: Any) -> int:
        return int(self._fh.seek(*args))

    def fileno(self) -> int:
        return int(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> _FailingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _real_path(path: Path) -> Path:
    """The file behind ``path`` (``/proc/self/fd/N`` names the segment the uploader holds)."""
    try:
        return Path(os.path.realpath(path))
    except OSError:
        return path


def failing_opener(
    target: Path, times: int, real: Callable[[Path], tuple[Any, Path]]
) -> tuple[Callable[[Path], tuple[Any, Path]], Callable[[], int]]:
    """An opener like ``real`` whose first ``times`` opens of ``target`` fail every read, and a
    function that tells how many failing files it handed out."""
    target = Path(os.path.realpath(target))
    lock = threading.Lock()
    handed = 0

    def opener(path: Path) -> tuple[Any, Path]:
        nonlocal handed
        fh, opened = real(path)
        with lock:
            if handed < times and _real_path(Path(opened)) == target:
                handed += 1
                return _FailingFile(fh), opened
        return fh, opened

    def count() -> int:
        with lock:
            return handed

    return opener, count


def install_from_env() -> None:
    """Install the fault described by ``TEST_READ_FAULT`` (``<path>:<times>``)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    path, _, times = spec.rpartition(":")
    assert hasattr(records, "open_with_deleted_fallback"), "the seam moved: update this module"
    opener, _count = failing_opener(Path(path), int(times), records.open_with_deleted_fallback)
    records.open_with_deleted_fallback = opener  # type: ignore[assignment]


if __name__ == "__main__":
    install_from_env()
    from sidecar.cli import main

    sys.exit(main(sys.argv[1:]))
