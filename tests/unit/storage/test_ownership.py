"""The prefix ownership marker: the first claim writes it, the owner's claims pass, another
cluster's (or another metadata topic's) claim is refused with a typed error that says how to fix
it. In-memory bucket."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from sidecar.errors import SidecarError
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
