"""The prefix ownership marker: the first claim writes it, the owner's claims pass, another
cluster's (or another metadata topic's) claim is refused with a typed error that says how to fix
it. In-memory bucket."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest

from sidecar.errors import ConditionalWriteUnsupportedError, SidecarError
from sidecar.storage.base import ObjectInfo
from sidecar.storage.memory import MemoryObjectStore
from sidecar.storage.ownership import (
    MARKER_NAME,
    PrefixOwner,
    PrefixOwnershipError,
    claim_prefix,
    is_marker_key,
    marker_key,
    marker_prefix,
    ownership_problem,
    read_owner,
)

WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class TestClaim:
    async def test_the_first_claim_writes_the_marker(self):
        objects = MemoryObjectStore()
        owner, created = await claim_prefix(
            objects, "prod/", cluster_id="c-a", metadata_topic="__rlm", now=WHEN
        )
        assert created
        assert owner == PrefixOwner("c-a", "__rlm", "2026-01-02T03:04:05+00:00")
        body = json.loads(objects.objects["prod/" + MARKER_NAME])
        assert body == {
            "cluster_id": "c-a",
            "metadata_topic": "__rlm",
            "created_at": "2026-01-02T03:04:05+00:00",
            "version": 1,
        }

    async def test_the_owner_claims_again_without_rewriting(self):
        objects = MemoryObjectStore()
        await claim_prefix(objects, "", cluster_id="c-a", metadata_topic="__rlm", now=WHEN)
        owner, created = await claim_prefix(objects, "", cluster_id="c-a", metadata_topic="__rlm")
        assert not created
        assert owner.created_at == "2026-01-02T03:04:05+00:00"  # the first claim's

    @pytest.mark.parametrize(
        ("cluster_id", "topic"), [("c-b", "__rlm"), ("c-a", "__other_metadata")]
    )
    async def test_another_owner_is_refused_with_the_fix(self, cluster_id, topic):
        objects = MemoryObjectStore()
        await claim_prefix(objects, "", cluster_id="c-a", metadata_topic="__rlm", now=WHEN)
        with pytest.raises(PrefixOwnershipError) as caught:
            await claim_prefix(objects, "", cluster_id=cluster_id, metadata_topic=topic)
        message = str(caught.value)
        assert "\n" not in message
        assert "bucket root" in message
        assert "'c-a'" in message
        assert "'__rlm'" in message
        assert repr(cluster_id) in message  # who asked
        assert f"s3.prefix = '{cluster_id}/'" in message  # how to fix it
        assert isinstance(caught.value, SidecarError)
        assert caught.value.exit_code == 4
        assert json.loads(objects.objects[MARKER_NAME])["cluster_id"] == "c-a"  # untouched

    async def test_an_unreadable_marker_is_refused(self):
        objects = MemoryObjectStore()
        await objects.put(marker_key("x/"), b"not json")
        with pytest.raises(PrefixOwnershipError, match="cannot be read"):
            await claim_prefix(objects, "x/", cluster_id="c-a", metadata_topic="__rlm")
        problem = await ownership_problem(objects, "x/", cluster_id="c-a", metadata_topic="__rlm")
        assert problem is not None
        assert "cannot be read" in problem


class _RacingStore(MemoryObjectStore):
    """Every claim's first read of the marker waits until all ``racers`` have read: they all
    find none and go on to write. Then one writes at a time, each reading its marker back
    before the next writes: the order in which two clusters could both read back their own."""

    def __init__(self, racers: int) -> None:
        super().__init__()
        self._racers = racers
        self._read = 0
        self._all_read = asyncio.Event()
        self._turn = asyncio.Lock()
        self._writer: asyncio.Task[object] | None = None

    async def _write_turn(self) -> None:
        await self._turn.acquire()
        self._writer = asyncio.current_task()

    async def put(self, key: str, body: bytes) -> ObjectInfo:
        await self._write_turn()
        return await super().put(key, body)

    async def put_if_absent(self, key: str, body: bytes) -> bool:
        await self._write_turn()
        return await super().put_if_absent(key, body)

    async def get(self, key: str) -> bytes:
        if not self._all_read.is_set():
            self._read += 1
            if self._read == self._racers:
                self._all_read.set()
            await self._all_read.wait()
        try:
            return await super().get(key)
        finally:
            if self._writer is asyncio.current_task():  # its read-back: the next may write
                self._writer = None
                self._turn.release()


class _NoConditionalWrites(MemoryObjectStore):
    async def put_if_absent(self, key: str, body: bytes) -> bool:
        raise ConditionalWriteUnsupportedError(f"put {key}: no If-None-Match here")


class TestRace:
    async def test_of_clusters_racing_for_a_fresh_prefix_one_wins(self):
        """Each finds no marker; the store lets one write, the others read its marker back
        and stop (before, each could read back its own and serve the same prefix)."""
        objects = _RacingStore(racers=3)
        results = await asyncio.gather(
            *(
                claim_prefix(objects, "p/", cluster_id=f"c-{n}", metadata_topic="__rlm")
                for n in range(3)
            ),
            return_exceptions=True,
        )
        won = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, PrefixOwnershipError)]
        assert len(won) == 1, results
        assert len(refused) == 2, results
        owner, created = won[0]
        assert created
        assert json.loads(objects.objects[marker_key("p/")])["cluster_id"] == owner.cluster_id

    async def test_a_store_without_conditional_writes_gets_a_plain_write(self):
        objects = _NoConditionalWrites()
        owner, created = await claim_prefix(objects, "", cluster_id="c-a", metadata_topic="t")
        assert created
        assert owner.cluster_id == "c-a"
        assert json.loads(objects.objects[MARKER_NAME])["cluster_id"] == "c-a"


class TestProblem:
    async def test_missing_foreign_and_ours(self):
        objects = MemoryObjectStore()
        missing = await ownership_problem(objects, "p/", cluster_id="c-a", metadata_topic="t")
        assert missing is not None
        assert "no ownership marker" in missing
        await claim_prefix(objects, "p/", cluster_id="c-b", metadata_topic="t")
        foreign = await ownership_problem(objects, "p/", cluster_id="c-a", metadata_topic="t")
        assert foreign is not None
        assert "'c-b'" in foreign
        assert await ownership_problem(objects, "p/", cluster_id="c-b", metadata_topic="t") is None
        assert await read_owner(objects, "q/") is None


class TestKeys:
    def test_marker_keys(self):
        assert is_marker_key(MARKER_NAME)
        assert is_marker_key(f"B/{MARKER_NAME}")
        assert not is_marker_key(f"B/x{MARKER_NAME}")
        assert marker_prefix(f"B/c/{MARKER_NAME}") == "B/c/"
        assert marker_prefix(MARKER_NAME) == ""
