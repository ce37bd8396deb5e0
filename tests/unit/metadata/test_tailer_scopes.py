"""The tailer's scope bookkeeping between a request and the next assignment (no Kafka: the
reading itself is tested on the real broker in tests/integration/test_metadata_topic.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

from sidecar.metadata import MetadataTailer, RemoteSegmentStore, TopicIdPartition

A = TopicIdPartition(uuid.UUID(int=1), "a", 0)
B = TopicIdPartition(uuid.UUID(int=2), "b", 0)


def _tailer(store: RemoteSegmentStore) -> MetadataTailer:
    return MetadataTailer(
        bootstrap_servers="127.0.0.1:9", store=store, broker_id=1, num_partitions=1, scoped=True
    )


def test_a_want_after_a_narrowing_not_applied_yet_is_kept(tmp_path: Path) -> None:
    """A partition read whole so far, narrowed away and wanted again before the narrowing is
    applied: the narrowing keeps it, so its (complete) state is not dropped."""
    with RemoteSegmentStore(tmp_path) as store:
        tailer = _tailer(store)
        tailer.track([0])  # read whole
        tailer._consumed[0] = 10
        tailer.narrow([A])
        tailer.want([B])
        assert tailer._narrowed[0] == frozenset({(A.topic_id, 0), (B.topic_id, 0)})
        assert tailer.wants(A)
        assert tailer.wants(B)


def test_a_want_on_a_metadata_partition_already_read_waits_for_its_history(
    tmp_path: Path,
) -> None:
    with RemoteSegmentStore(tmp_path) as store:
        tailer = _tailer(store)
        tailer.want([A])
        tailer._scopes[0] = tailer._pending.pop(0)  # as the assignment applies it
        tailer._consumed[0] = 10
        tailer._caught_up.add(0)
        tailer.want([B])
        assert not tailer.caught_up(0)  # not before B's history is read
        assert tailer._pending[0] == frozenset({(A.topic_id, 0), (B.topic_id, 0)})


def test_unwanted_count_moves_only_when_a_partition_may_stop_being_read(tmp_path: Path) -> None:
    """Callers skip partitions they wanted before while the count stays: wants and a narrowing
    that keeps everything leave it, a narrowing that drops something or an untrack move it."""
    with RemoteSegmentStore(tmp_path) as store:
        tailer = _tailer(store)
        before = tailer.unwanted_count
        tailer.want([A])
        tailer.want([A, B])
        tailer._scopes[0] = tailer._pending.pop(0)  # as the assignment applies it
        tailer.narrow([A, B])  # keeps the whole scope: nothing to drop
        assert tailer.unwanted_count == before
        tailer.narrow([A])
        assert tailer.unwanted_count == before + 1
        tailer.untrack([0])
        assert tailer.unwanted_count == before + 2
