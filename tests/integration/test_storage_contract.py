"""The ObjectStore contract, run against every backend: the in-memory fake and the S3 backend on
the real SeaweedFS (which verifies checksums and signatures). Then the S3-only behaviour:
checksum rejection, credentials kept out of errors, no multipart upload left behind.

Every test deletes what it writes; the ``backend`` fixture fails a test that leaks objects or
multipart uploads under its prefix (and removes them).
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from sidecar.errors import (
    ChecksumMismatchError,
    InvalidRangeError,
    KeyNotFoundError,
    StorageAccessError,
    StorageError,
)
from sidecar.storage import MIN_PART_SIZE, MemoryObjectStore, ObjectStore
from sidecar.storage._crc import crc32c
from sidecar.storage._parts import FilePartBody, PartChangedError, PartReader, plan_parts
from sidecar.storage.s3 import S3ObjectStore

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


@dataclass
class Backend:
    """One store under test, plus what the contract needs beyond the protocol."""

    name: str
    store: ObjectStore
    prefix: str
    #: a fresh, unopened store on the same backend
    new_store: Callable[[], ObjectStore]
    #: start a multipart upload and leave it incomplete (what a crash leaves)
    start_upload: Callable[[str], Awaitable[str]]


def _s3_store(s3: Any, **kwargs: Any) -> S3ObjectStore:
    arguments: dict[str, Any] = {
        "bucket": s3.bucket,
        "endpoint_url": s3.endpoint,
        "access_key_id": s3.access_key,
        "secret_access_key": s3.secret_key,
        "request_timeout_s": 30.0,
    }
    arguments.update(kwargs)
    return S3ObjectStore(**arguments)


async def _leftovers(store: ObjectStore, prefix: str) -> tuple[list[str], list[Any]]:
    keys = [o.key async for o in store.list(prefix)]
    uploads = [u async for u in store.list_multipart_uploads(prefix)]
    return keys, uploads


@pytest.fixture(params=["memory", "seaweedfs"])
async def backend(request: pytest.FixtureRequest, s3_prefix: str) -> AsyncIterator[Backend]:
    """Each backend in turn; SeaweedFS starts only when a seaweedfs case is selected."""
    if request.param == "memory":
        memory = MemoryObjectStore()
        handle = Backend(
            "memory", memory, s3_prefix, MemoryObjectStore, memory.create_multipart_upload
        )
    else:
        s3 = request.getfixturevalue("s3")
        remote = _s3_store(s3)
        handle = Backend(
            "seaweedfs",
            remote,
            s3_prefix,
            lambda: _s3_store(s3),
            remote._create_multipart_upload,  # the step put_file starts with
        )
    async with handle.store:
        yield handle
        keys, uploads = await _leftovers(handle.store, s3_prefix)
        await handle.store.delete(keys)
        for upload in uploads:
            await handle.store.abort_multipart_upload(upload.key, upload.upload_id)
    assert (keys, uploads) == ([], []), "the test leaked objects or multipart uploads"


@pytest.fixture
async def s3_store(s3: Any, s3_prefix: str) -> AsyncIterator[S3ObjectStore]:
    """The S3 backend on SeaweedFS, checked for leaks under the test's prefix afterwards."""
    async with _s3_store(s3) as store:
        yield store
        keys, uploads = await _leftovers(store, s3_prefix)
        await store.delete(keys)
        for upload in uploads:
            await store.abort_multipart_upload(upload.key, upload.upload_id)
    assert (keys, uploads) == ([], []), "the test leaked objects or multipart uploads"


def _payload(size: int, seed: int = 0) -> bytes:
    """Deterministic, incompressible-enough bytes."""
    block = (
        os.urandom(64 * 1024) if seed < 0 else bytes((i * 131 + seed) % 251 for i in range(4096))
    )
    return (block * (size // len(block) + 1))[:size]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


class TestRoundTrip:
    async def test_put_get(self, backend: Backend) -> None:
        """A put object comes back byte-identical, with its size and CRC-32C reported."""
        key = f"{backend.prefix}object.bin"
        body = _payload(300_000)
        info = await backend.store.put(key, body)
        assert (key, len(body), crc32c(body)) == (info.key, info.size, info.crc32c)
        assert body == await backend.store.get(key)
        head = await backend.store.head(key)
        assert (len(body), crc32c(body), info.etag) == (head.size, head.crc32c, head.etag)
        assert head.last_modified is not None
        assert abs(datetime.now(UTC) - head.last_modified) < timedelta(minutes=5)
        await backend.store.delete([key])

    async def test_put_empty_and_overwrite(self, backend: Backend) -> None:
        """An empty object is stored, and a second put replaces the first."""
        key = f"{backend.prefix}empty"
        await backend.store.put(key, b"")
        assert await backend.store.get(key) == b""
        assert (await backend.store.head(key)).size == 0
        await backend.store.put(key, b"second")
        assert await backend.store.get(key) == b"second"
        await backend.store.delete([key])

    async def test_put_if_absent_writes_only_a_new_key(self, backend: Backend) -> None:
        """A conditional put writes a new key once; on an existing key (its own, after a
        first write, or another's) it says so and changes nothing. Of eight racing for one
        key, exactly one writes (SeaweedFS enforces If-None-Match under concurrency)."""
        key = f"{backend.prefix}marker"
        assert await backend.store.put_if_absent(key, b"first")
        assert not await backend.store.put_if_absent(key, b"second")
        assert await backend.store.get(key) == b"first"
        raced = f"{backend.prefix}raced"
        wrote = await asyncio.gather(
            *(backend.store.put_if_absent(raced, bytes([n])) for n in range(8))
        )
        assert sorted(wrote) == [False] * 7 + [True]
        assert await backend.store.get(raced) == bytes([wrote.index(True)])
        await backend.store.delete([key, raced])


class TestGetRange:
    async def test_inclusive_end(self, backend: Backend) -> None:
        """Ranges include their end byte: first byte, last byte, a middle span, everything."""
        key = f"{backend.prefix}range.bin"
        body = _payload(10_000, seed=7)
        await backend.store.put(key, body)
        store = backend.store
        assert body[:1] == await store.get_range(key, 0, 0)
        assert body[-1:] == await store.get_range(key, len(body) - 1, len(body) - 1)
        assert body[100:201] == await store.get_range(key, 100, 200)
        assert body == await store.get_range(key, 0, len(body) - 1)
        await store.delete([key])

    async def test_end_beyond_object_is_clamped(self, backend: Backend) -> None:
        """An end past the last byte returns up to the last byte, as S3 does."""
        key = f"{backend.prefix}clamp.bin"
        body = _payload(1000, seed=3)
        await backend.store.put(key, body)
        assert body[900:] == await backend.store.get_range(key, 900, 5000)
        await backend.store.delete([key])

    @pytest.mark.parametrize(
        ("start", "end"),
        [
            pytest.param(1000, 1000, id="start-at-size"),
            pytest.param(5000, 6000, id="start-past-size"),
            pytest.param(-1, 10, id="negative-start"),
            pytest.param(10, 9, id="end-before-start"),
        ],
    )
    async def test_unsatisfiable_range(self, backend: Backend, start: int, end: int) -> None:
        """A range starting beyond the last byte, or malformed, is InvalidRangeError."""
        key = f"{backend.prefix}short.bin"
        await backend.store.put(key, _payload(1000))
        with pytest.raises(InvalidRangeError):
            await backend.store.get_range(key, start, end)
        await backend.store.delete([key])

    async def test_range_of_empty_object(self, backend: Backend) -> None:
        """No range is satisfiable on an empty object."""
        key = f"{backend.prefix}empty"
        await backend.store.put(key, b"")
        with pytest.raises(InvalidRangeError):
            await backend.store.get_range(key, 0, 0)
        await backend.store.delete([key])


class TestMissingKey:
    @pytest.mark.parametrize("op", ["get", "head", "get_range"])
    async def test_missing_key(self, backend: Backend, op: str) -> None:
        """Reading a key that does not exist is KeyNotFoundError, naming the key."""
        key = f"{backend.prefix}absent"
        call: Callable[[], Awaitable[object]] = {
            "get": lambda: backend.store.get(key),
            "head": lambda: backend.store.head(key),
            "get_range": lambda: backend.store.get_range(key, 0, 10),
        }[op]
        with pytest.raises(KeyNotFoundError, match="absent"):
            await call()


class TestPutFile:
    async def test_small_file_single_put(self, backend: Backend, tmp_path: Path) -> None:
        """A file up to one part goes up in one PUT, with the whole file's CRC-32C."""
        data = _payload(MIN_PART_SIZE - 1, seed=1)
        key = f"{backend.prefix}small.log"
        info = await backend.store.put_file(key, _write(tmp_path / "small.log", data))
        assert (len(data), crc32c(data)) == (info.size, info.crc32c)
        assert info.etag is not None
        assert "-" not in info.etag  # not a multipart entity tag
        assert crc32c(data) == (await backend.store.head(key)).crc32c
        assert data == await backend.store.get(key)
        await backend.store.delete([key])

    async def test_multipart(self, backend: Backend, tmp_path: Path) -> None:
        """A 12 MiB file in 5 MiB parts, 3 at a time, arrives whole with the right CRC-32C."""
        data = _payload(12 * MiB + 12345, seed=-1)
        key = f"{backend.prefix}big.log"
        info = await backend.store.put_file(
            key, _write(tmp_path / "big.log", data), part_size=5 * MiB, concurrency=3
        )
        assert (len(data), crc32c(data)) == (info.size, info.crc32c)
        assert info.etag is not None
        assert info.etag.endswith("-3")
        head = await backend.store.head(key)
        assert (len(data), None) == (head.size, head.crc32c)  # S3's checksum is composite
        assert data == await backend.store.get(key)
        assert data[5 * MiB - 1 : 5 * MiB + 1] == await backend.store.get_range(
            key, 5 * MiB - 1, 5 * MiB
        )
        assert [u async for u in backend.store.list_multipart_uploads(backend.prefix)] == []
        await backend.store.delete([key])

    async def test_empty_file(self, backend: Backend, tmp_path: Path) -> None:
        """An empty file is an empty object with CRC-32C 0."""
        key = f"{backend.prefix}empty.log"
        info = await backend.store.put_file(key, _write(tmp_path / "empty.log", b""))
        assert (info.size, info.crc32c) == (0, 0)
        assert await backend.store.get(key) == b""
        await backend.store.delete([key])

    async def test_missing_file(self, backend: Backend, tmp_path: Path) -> None:
        """A missing local file raises FileNotFoundError unchanged and writes nothing."""
        with pytest.raises(FileNotFoundError):
            await backend.store.put_file(f"{backend.prefix}gone.log", tmp_path / "gone.log")

    async def test_part_size_below_minimum(self, backend: Backend, tmp_path: Path) -> None:
        """A part size S3 would refuse is rejected before any request."""
        with pytest.raises(ValueError, match="part_size"):
            await backend.store.put_file(
                f"{backend.prefix}x", _write(tmp_path / "x", b"x"), part_size=MIN_PART_SIZE - 1
            )


class TestDelete:
    async def test_delete_several_with_missing(self, backend: Backend) -> None:
        """Deleting existing and missing keys together succeeds and removes the existing."""
        keys = [f"{backend.prefix}d/{i}" for i in range(5)]
        for key in keys:
            await backend.store.put(key, key.encode())
        await backend.store.delete([*keys[:3], f"{backend.prefix}d/never-written"])
        assert keys[3:] == [o.key async for o in backend.store.list(f"{backend.prefix}d/")]
        await backend.store.delete(keys[3:])
        await backend.store.delete([])
        assert [o.key async for o in backend.store.list(f"{backend.prefix}d/")] == []


class TestList:
    async def test_pagination(self, backend: Backend) -> None:
        """Small pages still list every key under the prefix, in order, with sizes."""
        keys = [f"{backend.prefix}l/{i:03d}" for i in range(23)]
        await asyncio.gather(*(backend.store.put(k, b"x" * i) for i, k in enumerate(keys)))
        await backend.store.put(f"{backend.prefix}other", b"not listed")
        listed = [o async for o in backend.store.list(f"{backend.prefix}l/", page_size=5)]
        assert keys == [o.key for o in listed]
        assert list(range(23)) == [o.size for o in listed]
        assert all(o.last_modified is not None for o in listed)
        await backend.store.delete([*keys, f"{backend.prefix}other"])

    async def test_empty_prefix(self, backend: Backend) -> None:
        """Listing a prefix with nothing under it yields nothing."""
        assert [o async for o in backend.store.list(f"{backend.prefix}nothing/")] == []


class TestMultipartUploads:
    async def test_list_and_abort(self, backend: Backend) -> None:
        """Incomplete uploads are listed (across pages) and aborting removes them, twice is fine."""
        keys = [f"{backend.prefix}mpu/{i}" for i in range(3)]
        ids = [await backend.start_upload(k) for k in keys]
        listed = [
            u
            async for u in backend.store.list_multipart_uploads(
                f"{backend.prefix}mpu/", page_size=2
            )
        ]
        assert sorted(zip(keys, ids, strict=True)) == sorted((u.key, u.upload_id) for u in listed)
        assert all(u.initiated is not None for u in listed)
        for key, upload_id in zip(keys, ids, strict=True):
            await backend.store.abort_multipart_upload(key, upload_id)
        await backend.store.abort_multipart_upload(keys[0], ids[0])
        assert [u async for u in backend.store.list_multipart_uploads(backend.prefix)] == []


class TestLifecycle:
    async def test_closed_store_refuses_calls(self, backend: Backend) -> None:
        """After aclose (idempotent) every call raises RuntimeError."""
        async with backend.new_store() as store:
            await store.aclose()
        await store.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await store.get(f"{backend.prefix}x")


class TestS3RangedGets:
    async def test_raw_and_botocore_gets_read_the_same_bytes(
        self, s3: Any, s3_store: S3ObjectStore, s3_prefix: str, tmp_path: Path
    ) -> None:
        """Ranged GETs of a multipart object through the raw client (this endpoint is plain
        HTTP) equal those through botocore, at part edges and across many reads; a missing
        key and a range past the end are the same errors both ways."""
        data = _payload(21 * MiB, seed=-1)
        key = f"{s3_prefix}ranged.log"
        await s3_store.put_file(key, _write(tmp_path / "f", data), part_size=5 * MiB)
        ranges = [(0, 0), (5 * MiB - 3, 5 * MiB + 2), (1, 16 * MiB), (20 * MiB, 30 * MiB)]
        async with _s3_store(s3, raw_range_gets=False) as botocore_store:
            assert s3_store.raw_range_gets
            assert not botocore_store.raw_range_gets
            for start, end in ranges:
                raw = await s3_store.get_range(key, start, end)
                assert bytes(raw) == data[start : end + 1]
                assert bytes(raw) == bytes(await botocore_store.get_range(key, start, end))
            for store in (s3_store, botocore_store):
                with pytest.raises(KeyNotFoundError):
                    await store.get_range(f"{s3_prefix}absent", 0, 9)
                with pytest.raises(InvalidRangeError):
                    await store.get_range(key, len(data), len(data) + 9)
        assert s3_store.raw_range_gets  # nothing sent it back to botocore
        await s3_store.delete([key])

    async def test_an_endpoint_written_with_capitals_reads_through_the_raw_client(
        self, s3: Any, s3_store: S3ObjectStore, s3_prefix: str
    ) -> None:
        """With the endpoint written ``http://LocalHost:<port>``, botocore signs the host in
        lower case; SeaweedFS checks the signature against the Host header it receives, so
        the raw client's ranged GETs are accepted only when they send the host as signed."""
        port = urlsplit(s3.endpoint).port
        data = _payload(100_000)
        key = f"{s3_prefix}capitals.log"
        await s3_store.put(key, data)
        async with _s3_store(s3, endpoint_url=f"http://LocalHost:{port}", max_attempts=1) as store:
            assert store.raw_range_gets
            assert bytes(await store.get_range(key, 10, 60_009)) == data[10:60_010]
            assert store.raw_range_gets  # not sent back to botocore
        await s3_store.delete([key])


class TestS3Checksums:
    async def test_wrong_crc32c_is_rejected(self, s3_store: S3ObjectStore, s3_prefix: str) -> None:
        """SeaweedFS refuses a body whose CRC-32C is wrong; that is ChecksumMismatchError."""
        body = b"the bytes the broker wrote" * 100
        key = f"{s3_prefix}corrupt"
        with pytest.raises(ChecksumMismatchError, match="corrupt"):
            await s3_store._put_object(
                key, body, len(body), crc32c(body) ^ 1
            )  # private: inject a bad CRC
        with pytest.raises(KeyNotFoundError):
            await s3_store.head(key)

    async def test_wrong_part_crc32c_aborts_upload(
        self, s3_store: S3ObjectStore, s3_prefix: str, tmp_path: Path, monkeypatch: Any
    ) -> None:
        """A part whose CRC-32C the store rejects fails the upload and leaves nothing behind."""
        original = s3_store._upload_part

        async def corrupt_part_2(
            key: str, upload_id: str, number: int, body: io.BytesIO, crc: int
        ) -> str:
            return await original(key, upload_id, number, body, crc ^ (number == 2))

        monkeypatch.setattr(s3_store, "_upload_part", corrupt_part_2)
        key = f"{s3_prefix}bad-part.log"
        path = _write(tmp_path / "f", _payload(11 * MiB))
        with pytest.raises(ChecksumMismatchError):
            await s3_store.put_file(key, path, part_size=5 * MiB, concurrency=2)
        assert [u async for u in s3_store.list_multipart_uploads(s3_prefix)] == []
        with pytest.raises(KeyNotFoundError):
            await s3_store.head(key)


class TestS3SendfileBodies:
    """A single PUT to SeaweedFS over http:// goes with sendfile, never read by the process;
    the store's own check of the CRC-32C header guards it."""

    async def test_a_single_put_goes_with_sendfile_and_round_trips(
        self, s3_store: S3ObjectStore, s3_prefix: str, tmp_path: Path, monkeypatch: Any
    ) -> None:
        sent: list[int] = []
        zero_copy = FilePartBody.send_zero_copy

        async def counted(body: FilePartBody, sock: int) -> None:
            sent.append(body.length)
            await zero_copy(body, sock)

        async def streamed(body: FilePartBody, *args: Any) -> None:
            raise AssertionError("the body was read through the process")

        monkeypatch.setattr(FilePartBody, "send_zero_copy", counted)
        monkeypatch.setattr(FilePartBody, "send", streamed)
        data = _payload(9 * MiB + 123, seed=-1)
        key = f"{s3_prefix}sendfile.log"
        info = await s3_store.put_file(
            key, _write(tmp_path / "f", data), part_size=5 * MiB, part_crcs=[crc32c(data)]
        )
        assert sent == [len(data)]
        assert info.crc32c == crc32c(data)
        assert await s3_store.get(key) == data
        await s3_store.delete([key])

    async def test_multipart_parts_go_with_sendfile_when_their_crcs_are_known(
        self, s3_store: S3ObjectStore, s3_prefix: str, tmp_path: Path, monkeypatch: Any
    ) -> None:
        """With the parts' CRC-32Cs handed in (the batch check's), no part is read into a
        buffer: each goes with sendfile, and the object reads back whole."""
        sent: list[int] = []
        zero_copy = FilePartBody.send_zero_copy

        async def counted(body: FilePartBody, sock: int) -> None:
            sent.append(body.length)
            await zero_copy(body, sock)

        async def no_buffer(*args: Any) -> Any:
            raise AssertionError("a part was read into a buffer")

        monkeypatch.setattr(FilePartBody, "send_zero_copy", counted)
        monkeypatch.setattr(PartReader, "read", no_buffer)
        data = _payload(17 * MiB + 5, seed=-1)
        parts = plan_parts(len(data), 5 * MiB)
        crcs = [crc32c(data[p.offset : p.offset + p.length]) for p in parts]
        key = f"{s3_prefix}sendfile-mpu.log"
        info = await s3_store.put_file(
            key, _write(tmp_path / "f", data), part_size=5 * MiB, concurrency=2, part_crcs=crcs
        )
        assert sorted(sent) == sorted(p.length for p in parts)
        assert info.crc32c == crc32c(data)
        assert await s3_store.get(key) == data
        await s3_store.delete([key])

    async def test_a_part_changed_since_its_check_aborts_the_upload(
        self, s3_store: S3ObjectStore, s3_prefix: str, tmp_path: Path
    ) -> None:
        """Part 2's CRC-32C no longer matches the file: the store refuses that part, the
        upload fails with PartChangedError and is aborted; nothing is left."""
        data = _payload(12 * MiB, seed=5)
        parts = plan_parts(len(data), 5 * MiB)
        crcs = [crc32c(data[p.offset : p.offset + p.length]) ^ (p.number == 2) for p in parts]
        key = f"{s3_prefix}changed-mpu.log"
        with pytest.raises(PartChangedError, match="changed since"):
            await s3_store.put_file(
                key, _write(tmp_path / "f", data), part_size=5 * MiB, part_crcs=crcs
            )
        assert [u async for u in s3_store.list_multipart_uploads(s3_prefix)] == []
        with pytest.raises(KeyNotFoundError):
            await s3_store.head(key)

    async def test_a_file_changed_since_its_check_is_refused_by_the_store(
        self, s3_store: S3ObjectStore, s3_prefix: str, tmp_path: Path
    ) -> None:
        """The CRC-32C handed in no longer matches the file (it changed after the batch check):
        SeaweedFS refuses the body, the file is read to tell why, and nothing is stored."""
        data = _payload(6 * MiB, seed=3)
        key = f"{s3_prefix}changed.log"
        with pytest.raises(PartChangedError, match="changed since"):
            await s3_store.put_file(
                key, _write(tmp_path / "f", data), part_size=5 * MiB, part_crcs=[crc32c(data) ^ 1]
            )
        with pytest.raises(KeyNotFoundError):
            await s3_store.head(key)


class TestS3Failures:
    async def test_failed_part_aborts_upload(
        self, s3_store: S3ObjectStore, s3_prefix: str, tmp_path: Path, monkeypatch: Any
    ) -> None:
        """When one part fails, put_file raises it and no multipart upload or object remains."""
        original = s3_store._upload_part

        async def fail_part_3(
            key: str, upload_id: str, number: int, body: io.BytesIO, crc: int
        ) -> str:
            if number == 3:
                raise StorageError(f"injected failure of part {number}")
            return await original(key, upload_id, number, body, crc)

        monkeypatch.setattr(s3_store, "_upload_part", fail_part_3)
        key = f"{s3_prefix}failing.log"
        path = _write(tmp_path / "f", _payload(16 * MiB))
        with pytest.raises(StorageError, match="injected failure of part 3"):
            await s3_store.put_file(key, path, part_size=5 * MiB, concurrency=2)
        assert [u async for u in s3_store.list_multipart_uploads(s3_prefix)] == []
        with pytest.raises(KeyNotFoundError):
            await s3_store.head(key)

    async def test_cancelled_upload_is_aborted(
        self, s3_store: S3ObjectStore, s3_prefix: str, tmp_path: Path, monkeypatch: Any
    ) -> None:
        """Cancelling put_file mid-upload (shutdown) still aborts the multipart upload."""
        original = s3_store._upload_part
        stuck = asyncio.Event()

        async def hang_part_2(
            key: str, upload_id: str, number: int, body: io.BytesIO, crc: int
        ) -> str:
            if number == 2:
                stuck.set()
                await asyncio.Event().wait()
            return await original(key, upload_id, number, body, crc)

        monkeypatch.setattr(s3_store, "_upload_part", hang_part_2)
        path = _write(tmp_path / "f", _payload(11 * MiB))
        task = asyncio.create_task(
            s3_store.put_file(f"{s3_prefix}cancelled.log", path, part_size=5 * MiB, concurrency=1)
        )
        await asyncio.wait_for(stuck.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [u async for u in s3_store.list_multipart_uploads(s3_prefix)] == []

    async def test_retried_part_resends_the_whole_body(
        self, s3: Any, s3_prefix: str, tmp_path: Path
    ) -> None:
        """A part retried after a dropped connection sends all its bytes again."""
        delays: list[float] = []

        async def fake_sleep(delay: float) -> None:
            delays.append(delay)

        async with _s3_store(s3, sleep=fake_sleep) as store:
            client = await store._ensure_client()
            original = client.upload_part
            dropped: list[int] = []

            async def drop_first_attempt(**params: Any) -> Any:
                if params["PartNumber"] == 2 and not dropped:
                    dropped.append(len(params["Body"].read()))  # consumed, as a send would
                    raise ConnectionResetError("injected: connection reset mid-body")
                return await original(**params)

            client.upload_part = drop_first_attempt
            data = _payload(11 * MiB, seed=5)
            key = f"{s3_prefix}retried.log"
            info = await store.put_file(key, _write(tmp_path / "f", data), part_size=5 * MiB)
            assert (dropped, len(delays)) == ([5 * MiB], 1)
            assert info.crc32c == crc32c(data)
            assert await store.get(key) == data
            await store.delete([key])

    @pytest.mark.parametrize("wrong", ["secret", "access-key"])
    async def test_wrong_credentials(self, s3: Any, s3_prefix: str, wrong: str) -> None:
        """Refused credentials are a StorageError whose message holds neither key nor secret."""
        access_key = s3.access_key if wrong == "secret" else "AKIDNOTKNOWNHERE01"
        secret = "wrong-" + s3.secret_key if wrong == "secret" else s3.secret_key
        async with _s3_store(
            s3, access_key_id=access_key, secret_access_key=secret, max_attempts=2
        ) as store:
            assert secret not in repr(store)
            for call in (
                lambda: store.put(f"{s3_prefix}denied", b"x"),
                lambda: store.get(f"{s3_prefix}denied"),
                lambda: store.get_range(f"{s3_prefix}denied", 0, 9),
            ):
                with pytest.raises(StorageError) as info:
                    await call()
                message = str(info.value)
                assert type(info.value) is StorageAccessError
                assert not info.value.retriable
                assert "denied" in message
                assert access_key not in message
                assert secret not in message
                assert s3.secret_key not in message


def _strip_echoes(store: S3ObjectStore, client: Any, *methods: str) -> list[str]:
    """Make ``methods`` of the real client answer as a store that does not echo checksums
    (the request still goes to SeaweedFS); returns the methods that had an echo removed."""
    stripped: list[str] = []
    for method in methods:
        original = getattr(client, method)

        async def without_echo(*args: Any, _original: Any = original, **params: Any) -> Any:
            response = await _original(*args, **params)
            if response.pop("ChecksumCRC32C", None) is not None:
                stripped.append(_original.__name__)
            return response

        setattr(client, method, without_echo)
    return stripped


def _unechoed(metrics: Any, resolution: str) -> float:
    value = metrics.registry.get_sample_value(
        "kafka_tiered_sidecar_s3_unechoed_uploads_total", {"resolution": resolution}
    )
    return 0.0 if value is None else value


class TestS3ChecksumEcho:
    """SeaweedFS behind a client whose upload answers lose the CRC-32C echo: the upload is
    verified another way (checksum_echo = verify) or refused and removed (refuse)."""

    @pytest.mark.parametrize(
        ("head_echoes", "resolution"),
        [(True, "verified_head"), (False, "verified_get")],
        ids=["by-head", "by-read-back"],
    )
    async def test_unechoed_uploads_are_verified(
        self, s3: Any, s3_prefix: str, tmp_path: Path, head_echoes: bool, resolution: str
    ) -> None:
        """SeaweedFS returns the stored checksum to a HEAD with ChecksumMode=ENABLED; without
        it (a store that keeps no checksums) the last part is read back and compared."""
        from sidecar.observability.metrics import Metrics

        metrics = Metrics()
        async with _s3_store(s3, metrics=metrics) as store:
            client = await store._ensure_client()
            methods = ["put_object", "upload_part", "complete_multipart_upload"]
            stripped = _strip_echoes(
                store, client, *methods, *([] if head_echoes else ["head_object"])
            )
            small, large = _payload(70_000, seed=1), _payload(11 * MiB, seed=2)
            await store.put(f"{s3_prefix}small", small)
            info = await store.put_file(
                f"{s3_prefix}large.log", _write(tmp_path / "f", large), part_size=5 * MiB
            )
            assert info.crc32c == crc32c(large)
            assert set(stripped) >= {"put_object", "complete_multipart_upload"}
            assert _unechoed(metrics, resolution) == 2
            assert _unechoed(metrics, "mismatch") == 0
            assert await store.get(f"{s3_prefix}small") == small
            assert await store.get(f"{s3_prefix}large.log") == large
            await store.delete([f"{s3_prefix}small", f"{s3_prefix}large.log"])

    @pytest.mark.parametrize("head_echoes", [True, False], ids=["by-head", "by-read-back"])
    async def test_unechoed_upload_of_other_bytes_is_caught_and_deleted(
        self, s3: Any, s3_prefix: str, head_echoes: bool
    ) -> None:
        """The store keeps other bytes than we sent (consistent with their own checksum, so
        it accepts them) and echoes nothing: the verification catches it, deletes the object
        and raises ChecksumMismatchError."""
        from sidecar.observability.metrics import Metrics
        from sidecar.storage._crc import encode_checksum

        metrics = Metrics()
        async with _s3_store(s3, metrics=metrics, max_attempts=1) as store:
            client = await store._ensure_client()
            original = client.put_object

            async def store_other_bytes(**params: Any) -> Any:
                other = bytes(params["Body"])[::-1]
                params.update(Body=other, ChecksumCRC32C=encode_checksum(crc32c(other)))
                response = await original(**params)
                response.pop("ChecksumCRC32C", None)
                return response

            client.put_object = store_other_bytes
            if not head_echoes:
                _strip_echoes(store, client, "head_object")
            key = f"{s3_prefix}swapped"
            with pytest.raises(ChecksumMismatchError, match="no CRC-32C echo"):
                await store.put(key, b"the bytes the broker wrote" * 100)
            assert _unechoed(metrics, "mismatch") == 1
            with pytest.raises(KeyNotFoundError):
                await store.head(key)

    async def test_refuse_fails_and_leaves_nothing(
        self, s3: Any, s3_prefix: str, tmp_path: Path
    ) -> None:
        from sidecar.errors import ChecksumNotEchoedError
        from sidecar.observability.metrics import Metrics

        metrics = Metrics()
        async with _s3_store(s3, metrics=metrics, checksum_echo="refuse") as store:
            client = await store._ensure_client()
            _strip_echoes(store, client, "put_object", "upload_part", "complete_multipart_upload")
            with pytest.raises(ChecksumNotEchoedError, match="refuse"):
                await store.put(f"{s3_prefix}small", b"x" * 1000)
            with pytest.raises(ChecksumNotEchoedError, match="refuse"):
                await store.put_file(
                    f"{s3_prefix}large.log",
                    _write(tmp_path / "f", _payload(11 * MiB)),
                    part_size=5 * MiB,
                )
            assert _unechoed(metrics, "refused") >= 2
            assert await _leftovers(store, s3_prefix) == ([], [])
