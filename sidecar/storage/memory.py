"""An in-memory :class:`~sidecar.storage.base.ObjectStore` with fault injection, for unit tests
of the modules above storage (uploader, read path, retention, orphan scrub).

It follows the S3 backend's contract closely: the same errors, range clamping, part-size rules,
multipart uploads that are visible while in flight and aborted on failure, and no full-object
CRC from ``head`` of a multipart object. It does no network I/O and reads only the files given
to ``put_file`` (in a worker thread, like the S3 backend).

Faults: ``store.fail_next("get", StorageError("boom"))`` makes the next ``get`` raise; the
operation names are :data:`Operation`. ``store.calls`` counts the operations. An
``upload_throttle`` is charged as the S3 backend charges it: each part and each single PUT,
before its bytes are read.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
from collections import Counter, deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Literal, Self

from sidecar.errors import InvalidRangeError, KeyNotFoundError, ObjectTooLargeError
from sidecar.storage._parts import (
    PartChangedError,
    batches,
    check_page_size,
    check_range,
    check_upload_args,
    combine_parts,
    crc32c_off_loop,
    open_parts,
    plan_parts,
)
from sidecar.storage.base import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PAGE_SIZE,
    DEFAULT_PART_SIZE,
    Arrivals,
    MultipartUpload,
    ObjectInfo,
)
from sidecar.storage.throttle import TokenBucket

__all__ = ["MemoryObjectStore", "Operation"]

#: the operations that can be made to fail; ``upload_part`` and ``complete_multipart_upload``
#: are the steps inside a multipart ``put_file``
Operation = Literal[
    "put",
    "put_file",
    "upload_part",
    "complete_multipart_upload",
    "get",
    "get_range",
    "head",
    "copy",
    "delete",
    "list",
    "list_multipart_uploads",
    "abort_multipart_upload",
    "create_multipart_upload",
]


@dataclass(frozen=True, slots=True)
class _Object:
    body: bytes
    crc32c: int
    etag: str
    last_modified: datetime
    #: number of parts; 0 for a single PUT
    parts: int


def _md5(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


def _check_announced(
    path: str | os.PathLike[str], part_crcs: Sequence[int] | None, index: int, crc: int
) -> None:
    if part_crcs and part_crcs[index] != crc:
        raise PartChangedError(
            f"{os.fspath(path)}: part {index + 1} does not match the CRC-32C it was announced with"
        )


class MemoryObjectStore:
    """An object store in a dict. Not shared between event loops or threads."""

    def __init__(self, *, upload_throttle: TokenBucket | None = None) -> None:
        self._throttle = upload_throttle
        self._objects: dict[str, _Object] = {}
        self._uploads: dict[str, MultipartUpload] = {}
        self._faults: dict[str, deque[BaseException]] = {}
        self._upload_ids = itertools.count(1)
        self._closed = False
        #: how many times each operation was called (failed calls included)
        self.calls: Counter[str] = Counter()

    # -- test controls -------------------------------------------------------------------

    def fail_next(self, op: Operation, exc: BaseException, *, times: int = 1) -> None:
        """Make the next ``times`` calls of ``op`` raise ``exc`` (queued after earlier faults)."""
        if times < 1:
            raise ValueError("times must be at least 1")
        self._faults.setdefault(op, deque()).extend([exc] * times)

    def clear_faults(self) -> None:
        """Forget every fault that has not fired yet."""
        self._faults.clear()

    @property
    def objects(self) -> Mapping[str, bytes]:
        """A snapshot of the stored objects, key to bytes."""
        return {key: obj.body for key, obj in self._objects.items()}

    async def create_multipart_upload(self, key: str) -> str:
        """Start a multipart upload and leave it incomplete (what a crash mid-upload leaves)."""
        await self._enter("create_multipart_upload")
        upload_id = f"upload-{next(self._upload_ids)}"
        self._uploads[upload_id] = MultipartUpload(key, upload_id, datetime.now(UTC))
        return upload_id

    # -- ObjectStore ---------------------------------------------------------------------

    async def put(self, key: str, body: bytes) -> ObjectInfo:
        """Store ``body`` under ``key``."""
        await self._enter("put")
        body = bytes(body)
        await self._charge(len(body))
        crc = await crc32c_off_loop(body)
        return self._store(key, body, crc, _md5(body).hex(), parts=0)

    async def put_if_absent(self, key: str, body: bytes) -> bool:
        """Store ``body`` under ``key`` unless an object is there (checked and written at
        once: no await between them)."""
        await self._enter("put")
        body = bytes(body)
        await self._charge(len(body))
        crc = await crc32c_off_loop(body)
        if key in self.objects:
            return False
        self._store(key, body, crc, _md5(body).hex(), parts=0)
        return True

    async def put_file(
        self,
        key: str,
        path: str | os.PathLike[str],
        *,
        part_size: int = DEFAULT_PART_SIZE,
        concurrency: int = DEFAULT_CONCURRENCY,
        part_crcs: Sequence[int] | None = None,
    ) -> ObjectInfo:
        """Upload a local file, as one PUT up to twice ``part_size`` and in parts above it. Given
        ``part_crcs`` are checked against the bytes, as a store checks the checksums it gets."""
        check_upload_args(part_size, concurrency)
        await self._enter("put_file")
        async with open_parts(path) as reader:
            parts = plan_parts(reader.size, part_size)
            if part_crcs is not None and len(part_crcs) != len(parts):
                part_crcs = None  # computed for another plan: ignored, as the S3 backend does
            if len(parts) <= 1:
                await self._charge(reader.size)
                buffer, crc = await reader.read(0, reader.size)
                body = buffer.tobytes()
                buffer.release()
                _check_announced(path, part_crcs, 0, crc)
                return self._store(key, body, crc, _md5(body).hex(), parts=0)
            upload_id = await self.create_multipart_upload(key)
            bodies: list[bytes] = []
            crcs: list[tuple[int, int]] = []
            try:
                for part in parts:
                    await self._enter("upload_part")
                    await self._charge(part.length)
                    buffer, crc = await reader.read(part.offset, part.length)
                    bodies.append(buffer.tobytes())
                    buffer.release()
                    _check_announced(path, part_crcs, part.number - 1, crc)
                    crcs.append((crc, part.length))
                await self._enter("complete_multipart_upload")
            except BaseException:
                self._uploads.pop(upload_id, None)
                raise
        self._uploads.pop(upload_id, None)
        etag = _md5(b"".join(_md5(b) for b in bodies)).hex() + f"-{len(bodies)}"
        return self._store(key, b"".join(bodies), combine_parts(crcs), etag, parts=len(bodies))

    async def _charge(self, size: int) -> None:
        if self._throttle is not None:
            await self._throttle.acquire(size)

    async def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """The whole object; one over ``max_bytes`` is ObjectTooLargeError."""
        await self._enter("get")
        body = self._lookup(key).body
        if max_bytes is not None and len(body) > max_bytes:
            raise ObjectTooLargeError(
                f"{key}: the object has {len(body)} bytes, more than the {max_bytes}"
                " its reader takes"
            )
        return body

    async def get_range(
        self, key: str, start: int, end_inclusive: int, *, arrivals: Arrivals | None = None
    ) -> bytes:
        """Bytes ``start..end_inclusive``, the end clamped to the last byte (all at once:
        ``arrivals`` is told nothing)."""
        await self._enter("get_range")
        check_range(key, start, end_inclusive)
        body = self._lookup(key).body
        if start >= len(body):
            raise InvalidRangeError(
                f"get_range {key}: range {start}-{end_inclusive} is beyond the object's "
                f"{len(body)} bytes"
            )
        return body[start : end_inclusive + 1]

    async def copy(self, source_key: str, key: str) -> ObjectInfo:
        """Copy an object; its checksum and part count go with it."""
        await self._enter("copy")
        obj = self._lookup(source_key)
        stored = self._store(key, obj.body, obj.crc32c, obj.etag, parts=obj.parts)
        return ObjectInfo(key, stored.size, None, stored.etag, None)

    async def head(self, key: str) -> ObjectInfo:
        """Size, checksum (None for a multipart object, as S3) and entity tag."""
        await self._enter("head")
        obj = self._lookup(key)
        crc = obj.crc32c if obj.parts == 0 else None
        return ObjectInfo(key, len(obj.body), crc, obj.etag, obj.last_modified)

    async def delete(self, keys: Sequence[str]) -> None:
        """Delete the keys that exist."""
        await self._enter("delete")
        for key in keys:
            self._objects.pop(key, None)

    async def list(
        self, prefix: str, *, page_size: int = DEFAULT_PAGE_SIZE
    ) -> AsyncIterator[ObjectInfo]:
        """Objects under ``prefix`` in key order, without checksums (as S3 lists them)."""
        check_page_size(page_size)
        await self._enter("list")
        keys = sorted(k for k in self._objects if k.startswith(prefix))
        for batch in batches(keys, page_size):
            page = [(k, self._objects.get(k)) for k in batch]
            for key, obj in page:
                if obj is not None:
                    yield ObjectInfo(key, len(obj.body), None, obj.etag, obj.last_modified)
            await asyncio.sleep(0)

    async def list_multipart_uploads(
        self, prefix: str, *, page_size: int = DEFAULT_PAGE_SIZE
    ) -> AsyncIterator[MultipartUpload]:
        """Incomplete multipart uploads under ``prefix``, by key then upload id."""
        check_page_size(page_size)
        await self._enter("list_multipart_uploads")
        uploads = sorted(
            (u for u in self._uploads.values() if u.key.startswith(prefix)),
            key=lambda u: (u.key, u.upload_id),
        )
        for batch in batches(uploads, page_size):
            for upload in batch:
                yield upload
            await asyncio.sleep(0)

    async def abort_multipart_upload(self, key: str, upload_id: str) -> None:
        """Forget an incomplete upload; one that is already gone is fine."""
        await self._enter("abort_multipart_upload")
        upload = self._uploads.get(upload_id)
        if upload is not None and upload.key == key:
            del self._uploads[upload_id]

    async def aclose(self) -> None:
        """Mark the store closed; idempotent. The objects stay readable via :attr:`objects`."""
        self._closed = True

    async def __aenter__(self) -> Self:
        if self._closed:
            raise RuntimeError("MemoryObjectStore is closed")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"MemoryObjectStore(objects={len(self._objects)}, uploads={len(self._uploads)})"

    # -- internals -----------------------------------------------------------------------

    async def _enter(self, op: Operation) -> None:
        if self._closed:
            raise RuntimeError("MemoryObjectStore is closed")
        self.calls[op] += 1
        await asyncio.sleep(0)  # a real store always yields to the loop
        faults = self._faults.get(op)
        if faults:
            raise faults.popleft()

    def _lookup(self, key: str) -> _Object:
        obj = self._objects.get(key)
        if obj is None:
            raise KeyNotFoundError(f"{key}: no such key")
        return obj

    def _store(self, key: str, body: bytes, crc: int, etag: str, *, parts: int) -> ObjectInfo:
        now = datetime.now(UTC)
        self._objects[key] = _Object(body, crc, etag, now, parts)
        return ObjectInfo(key, len(body), crc, etag, None)
