"""How long the uploader holds the broker's files: the ``.log`` is closed once its bytes are
sent, so a segment the broker deletes meanwhile does not keep its disk space through the
metadata read-backs or the cleanup of a failed copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.errors import StorageError
from sidecar.metadata.events import RemoteLogMetadata, RemoteLogSegmentState
from tests.unit.tiering.test_engine import Rig


def held_open(path: Path) -> bool:
    """Whether a descriptor of this process refers to ``path`` (or to it unlinked)."""
    target = str(path.resolve())
    for fd in Path("/proc/self/fd").iterdir():
        try:
            link = str(fd.readlink())
        except OSError:
            continue
        if link in (target, f"{target} (deleted)"):
            return True
    return False


def _watch(rig: Rig, path: Path) -> dict[RemoteLogSegmentState, bool]:
    """Record, for each event the uploader publishes, whether the ``.log`` is open then."""
    seen: dict[RemoteLogSegmentState, bool] = {}

    def before(event: RemoteLogMetadata) -> None:
        state = getattr(event, "state", RemoteLogSegmentState.COPY_SEGMENT_STARTED)
        seen[state] = held_open(path)

    rig.publisher.before = before
    return seen


class TestSegmentFileHold:
    async def test_the_log_is_closed_before_finished_is_published(self, rig):
        """While STARTED is published the ``.log`` is open (its bytes are still to be sent);
        by FINISHED, whose read-back may wait out a Kafka outage, it is closed."""
        r = rig()
        segment = r.rolled[0]
        seen = _watch(r, segment.log_path)
        await r.uploader.upload(r.scan, segment)
        assert seen == {
            RemoteLogSegmentState.COPY_SEGMENT_STARTED: True,
            RemoteLogSegmentState.COPY_SEGMENT_FINISHED: False,
        }
        assert not held_open(segment.log_path)

    async def test_the_log_is_closed_before_a_failed_copy_is_cleaned_up(self, rig):
        """A copy that fails after STARTED is deleted (DELETE_SEGMENT_STARTED, objects,
        DELETE_SEGMENT_FINISHED) with the ``.log`` already closed."""
        r = rig()
        segment = r.rolled[0]
        seen = _watch(r, segment.log_path)
        real_put = r.objects.put

        async def put(key: str, body: Any) -> Any:
            if key.endswith("manifest.json"):
                raise StorageError(f"put {key} failed: the store is down")
            return await real_put(key, body)

        r.objects.put = put  # type: ignore[method-assign]
        with pytest.raises(StorageError, match="the store is down"):
            await r.uploader.upload(r.scan, segment)
        assert seen[RemoteLogSegmentState.COPY_SEGMENT_STARTED] is True
        assert seen[RemoteLogSegmentState.DELETE_SEGMENT_STARTED] is False
        assert seen[RemoteLogSegmentState.DELETE_SEGMENT_FINISHED] is False
        assert not held_open(segment.log_path)
