"""The tailer's scope bookkeeping between a request and the next assignment (no Kafka: the
reading itself is tested on the real broker in tests/integration/test_metadata_topic.py)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

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


async def test_a_partition_wanted_after_a_restart_on_an_emptied_scope_is_read_again(
    tmp_path: Path,
) -> None:
    """Every partition of a metadata partition was narrowed away (the coordinator role was
    lost), its reading position kept; after a restart, a partition wanted there (reassigned
    to this broker, or the role back) has the metadata partition read again from its
    beginning: its history was dropped with the narrowing."""
    with RemoteSegmentStore(tmp_path) as store:
        tailer = _tailer(store)
        tailer.want([A, B])
        await tailer._rescope()  # never read: read from the beginning with this scope
        store.apply([], consumed={0: 41})  # what reading it did
        tailer._consumed[0] = 41
        tailer.narrow([])
        await tailer._rescope()
        assert tailer._scopes[0] == frozenset()
        assert not tailer.wants(A)
    with RemoteSegmentStore(tmp_path) as store:  # the daemon restarted
        tailer = _tailer(store)
        tailer._consumed = store.consumed_offsets()  # what start() reads
        tailer._scopes = store.scopes()
        assert tailer._scopes == {0: frozenset()}
        tailer.want([A])
        assert await tailer._rescope() == {0}  # read again up to offset 41 for A
        assert tailer._replays[0].until == 41
        assert not tailer.caught_up(0)


def test_a_partition_is_complete_once_wanted_and_caught_up(tmp_path: Path) -> None:
    """What the orphan scrub asks before it may call an object of a partition unreferenced:
    the partition's events are applied, and its metadata partition is read to its end."""
    with RemoteSegmentStore(tmp_path) as store:
        tailer = _tailer(store)
        tailer.want([A])
        assert not tailer.complete(A)  # not caught up yet
        tailer._caught_up.add(0)
        assert tailer.complete(A)
        assert not tailer.complete(B)  # caught up, but B's events are not applied


async def test_a_scope_the_store_could_not_record_is_applied_at_the_next_assignment(
    tmp_path: Path, monkeypatch
) -> None:
    """A store write that fails (another process's lock past the busy timeout, a full disk)
    is retried by the tailer: the wants it was applying are not lost, and a want asked
    meanwhile is kept with them."""
    import sqlite3

    from sidecar.metadata.errors import MetadataStoreError

    with RemoteSegmentStore(tmp_path) as store:
        tailer = _tailer(store)
        tailer.want([A])
        await tailer._rescope()  # never read: its scope is A
        tailer._consumed[0] = 41
        real = store.set_scope
        failures = [1]

        def busy_once(*args, **kwargs):
            if failures[0]:
                failures[0] -= 1
                error = MetadataStoreError("metadata store: database is locked")
                error.__cause__ = sqlite3.OperationalError("database is locked")
                raise error
            return real(*args, **kwargs)

        monkeypatch.setattr(store, "set_scope", busy_once)
        tailer.want([B])
        with pytest.raises(MetadataStoreError):
            await tailer._rescope()
        assert tailer._pending[0] == frozenset({(A.topic_id, 0), (B.topic_id, 0)})
        assert await tailer._rescope() == {0}  # B's history is read again
        assert tailer._replays[0].new == frozenset({(A.topic_id, 0), (B.topic_id, 0)})
        assert tailer._pending == {}


async def test_a_reread_whose_scope_could_not_be_stored_is_finished_at_the_next_step(
    tmp_path: Path, monkeypatch
) -> None:
    """A re-read that reached its end while the store refused its new scope is finished at the
    next step, not only when a record arrives (a quiet metadata partition has none)."""
    from sidecar.metadata.tailer import _Replay

    with RemoteSegmentStore(tmp_path) as store:
        tailer = _tailer(store)
        new = frozenset({(A.topic_id, 0), (B.topic_id, 0)})
        tailer._replays[0] = _Replay(until=41, old=frozenset({(A.topic_id, 0)}), new=new)
        tailer._replays[0].done = 41
        tailer._assigned = frozenset({0})
        tailer._tracked.add(0)

        class _Idle:
            async def getmany(self, **_: object) -> dict:
                return {}

        await tailer._step(_Idle(), asyncio.Event())
        assert 0 not in tailer._replays
        assert tailer._scopes[0] == new
        assert store.scopes()[0] == new
