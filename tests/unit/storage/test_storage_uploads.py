"""abort_uploads_of: the incomplete uploads of exactly one key, over the memory store."""

from __future__ import annotations

from sidecar.storage.base import abort_uploads_of
from sidecar.storage.memory import MemoryObjectStore


async def test_only_the_keys_own_uploads_are_aborted_and_keep_is_kept() -> None:
    objects = MemoryObjectStore()
    first = await objects.create_multipart_upload("p/seg.log")
    second = await objects.create_multipart_upload("p/seg.log")
    longer = await objects.create_multipart_upload("p/seg.log.2")  # the same prefix
    assert await abort_uploads_of(objects, "p/seg.log", keep=second) == [first]
    left = sorted([(u.key, u.upload_id) async for u in objects.list_multipart_uploads("p/")])
    assert left == sorted([("p/seg.log", second), ("p/seg.log.2", longer)])
    assert await abort_uploads_of(objects, "p/seg.log") == [second]
    assert await abort_uploads_of(objects, "p/seg.log") == []
