"""The object-store interface: the few verbs the sidecar needs, and the values they return.

Every backend (``s3.py``, ``memory.py``) implements :class:`ObjectStore`; callers depend on this
module only. It must not import a backend or any third-party client.

Errors are the same for every backend (:mod:`sidecar.errors`):

* :class:`~sidecar.errors.KeyNotFoundError`: ``get``, ``head`` or ``get_range`` of a missing key;
* :class:`~sidecar.errors.InvalidRangeError`: ``get_range`` whose start is negative, after the
  end, or beyond the object's last byte (an end beyond the last byte is clamped, as S3 does);
* :class:`~sidecar.errors.ChecksumMismatchError`: the store rejected our CRC-32C, or returned
  bytes or a checksum that do not match;
* :class:`~sidecar.errors.ObjectTooLargeError`: ``get`` of an object over its ``max_bytes``;
* :class:`~sidecar.errors.StorageError` (retriable): everything else. Messages name the
  operation and the key, never a credential.

A backend built with an upload throttle (:mod:`sidecar.storage.throttle`, the daemon's bandwidth
cap) waits for it before it reads or sends each upload body (a part, a single PUT); the verbs
stay the same.

``put_file`` lets local file errors (``OSError``, e.g. ``FileNotFoundError`` when the broker
deleted the segment first) propagate unchanged, so callers can handle Kafka's deletion race.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Protocol, Self

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_PART_SIZE",
    "DELETE_BATCH_SIZE",
    "MAX_PARTS",
    "MIN_PART_SIZE",
    "Arrivals",
    "MultipartUpload",
    "ObjectInfo",
    "ObjectStore",
    "abort_uploads_of",
]

#: S3's smallest part size (every part but the last)
MIN_PART_SIZE = 5 * 1024 * 1024
#: S3's largest part count; put_file raises the part size to stay below it
MAX_PARTS = 10_000
DEFAULT_PART_SIZE = 16 * 1024 * 1024
DEFAULT_CONCURRENCY = 4
#: keys per listing request (S3's maximum)
DEFAULT_PAGE_SIZE = 1000
#: keys per DeleteObjects request (S3's maximum)
DELETE_BATCH_SIZE = 1000


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What the store knows about one object."""

    key: str
    #: size in bytes
    size: int
    #: CRC-32C of the whole object; None when unknown (listings, and ``head`` of a multipart
    #: object, whose S3 checksum is a composite CRC of part CRCs)
    crc32c: int | None = None
    #: the store's entity tag, without quotes; opaque
    etag: str | None = None
    #: timezone-aware; None when the store did not report it (put responses)
    last_modified: datetime | None = None


@dataclass(frozen=True, slots=True)
class MultipartUpload:
    """An incomplete multipart upload (the orphan scrub aborts old ones)."""

    key: str
    upload_id: str
    #: timezone-aware
    initiated: datetime | None = None


class Arrivals(Protocol):
    """Told of a ranged GET's bytes as they arrive, before ``get_range`` returns them: a
    reader that needs the first bytes of a large range can have them before the rest.

    Only bytes of the range asked for are reported, once the store's answer says they are
    (a backend that cannot tell, or that has all the bytes at once, reports nothing). The
    returned bytes remain the authority: the GET may still fail after bytes were reported,
    and it may be made again (each attempt reports its own body). Called on the event loop,
    from the backend's I/O callbacks: neither method may raise or block.
    """

    def receiving(self, body: memoryview) -> None:
        """An answer is coming: ``body`` (read-only) will hold the range's bytes, in order from
        its start (as many as the answer has: an object shorter than asked ends sooner)."""
        ...

    def arrived(self, count: int) -> None:
        """Bytes ``[0, count)`` of the last ``body`` are in; they are never written again."""
        ...


class ObjectStore(Protocol):
    """An object store: a bucket (or a fake of one) seen through the sidecar's verbs only.

    Use it as an async context manager, or call :meth:`aclose` (idempotent). Using a closed
    store raises ``RuntimeError``.
    """

    async def put(self, key: str, body: bytes) -> ObjectInfo:
        """Store ``body`` under ``key`` (one request), with its CRC-32C checked by the store."""
        ...

    async def put_if_absent(self, key: str, body: bytes) -> bool:
        """Store ``body`` under ``key`` only if no object is there, atomically (one PUT with
        ``If-None-Match: *``): True when written, False when the key exists. A store without
        conditional writes raises ``ConditionalWriteUnsupportedError``."""
        ...

    async def put_file(
        self,
        key: str,
        path: str | os.PathLike[str],
        *,
        part_size: int = DEFAULT_PART_SIZE,
        concurrency: int = DEFAULT_CONCURRENCY,
        part_crcs: Sequence[int] | None = None,
    ) -> ObjectInfo:
        """Upload a local file: one PUT up to twice ``part_size``, a multipart upload above it.

        The file is read in a thread, never more than ``part_size`` bytes per part in flight
        (``concurrency`` parts at once). Every part carries its CRC-32C; the returned
        ``crc32c`` is the whole file's. ``part_crcs``: each part's CRC-32C, already computed by
        the caller from the same bytes (``PartChecksums``, with the same ``part_size``), so the
        file is not read once more for them; bytes that no longer match fail the upload. A
        failed multipart upload is aborted.
        """
        ...

    async def copy(self, source_key: str, key: str) -> ObjectInfo:
        """Copy an object inside the bucket (the store moves the bytes; at most 5 GiB, above
        any Kafka segment). A missing source is :class:`~sidecar.errors.KeyNotFoundError`."""
        ...

    async def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """The whole object (for small objects: manifests, indexes). With ``max_bytes``, an
        object larger than that is :class:`~sidecar.errors.ObjectTooLargeError`, raised before
        its body is read."""
        ...

    async def get_range(
        self, key: str, start: int, end_inclusive: int, *, arrivals: Arrivals | None = None
    ) -> bytes | memoryview:
        """Bytes ``start..end_inclusive`` (Kafka's ``fetchLogSegment`` convention); an end
        beyond the last byte is clamped. A backend may hand them over as a read-only
        ``memoryview`` (the S3 one does: the body is read into one buffer, not joined), and
        may tell ``arrivals`` of them as they come (:class:`Arrivals`)."""
        ...

    async def head(self, key: str) -> ObjectInfo:
        """Size, checksum and entity tag of an object."""
        ...

    async def delete(self, keys: Sequence[str]) -> None:
        """Delete objects, in batches of :data:`DELETE_BATCH_SIZE`; missing keys are fine."""
        ...

    def list(self, prefix: str, *, page_size: int = DEFAULT_PAGE_SIZE) -> AsyncIterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order, one page at a time."""
        ...

    def list_multipart_uploads(
        self, prefix: str, *, page_size: int = DEFAULT_PAGE_SIZE
    ) -> AsyncIterator[MultipartUpload]:
        """Incomplete multipart uploads whose key starts with ``prefix``, in the store's order."""
        ...

    async def abort_multipart_upload(self, key: str, upload_id: str) -> None:
        """Abort an incomplete multipart upload; an upload that is already gone is fine."""
        ...

    async def aclose(self) -> None:
        """Release connections; idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


async def abort_uploads_of(objects: ObjectStore, key: str, *, keep: str | None = None) -> list[str]:
    """Abort the incomplete multipart uploads of exactly ``key`` (a listing by prefix also
    names longer keys), all but ``keep``; returns the ids aborted. An upload's id is known only
    to whoever started it: one cancelled before the store answered, or one whose answer was
    lost, can be found only this way."""
    doomed = [
        u.upload_id
        async for u in objects.list_multipart_uploads(key)
        if u.key == key and u.upload_id != keep
    ]
    for upload_id in doomed:
        await objects.abort_multipart_upload(key, upload_id)
    return doomed
