"""The retention loop: remote retention, deletion of deleted topics and partitions, orphan scrub,
and the local-retention safety warnings. One root task (``RetentionManager.run``).

Every ``interval_s`` (Kafka's ``remote.log.manager.task.interval.ms``, 30 s by default):

1. **Partition deletion** (KIP-405): a partition whose latest partition-delete event is
   DELETE_PARTITION_MARKED or STARTED is processed by the sidecar of the broker that leads its
   *metadata* partition (Kafka's RemotePartitionRemover runs there): publish STARTED, delete
   every segment (DELETE_SEGMENT_STARTED → objects → DELETE_SEGMENT_FINISHED), publish FINISHED.
   A crash leaves STARTED (or DELETE_SEGMENT_STARTED) behind, and the next pass resumes it.
2. **Topic deletion**, on proof only. An all-topics Metadata answer leaves out the topics the
   principal may not Describe, so an id missing from it is only a *candidate*: the candidates
   are asked for by id (Metadata v12), and only ``UNKNOWN_TOPIC_ID`` counts as gone
   (``TOPIC_AUTHORIZATION_FAILED`` or any other answer keeps the data, resets the grace period,
   and counts in ``topic_deletion_unconfirmed_total``). An id confirmed gone at every pass for
   ``topic_deletion_grace_s`` (hours by default) has every segment deleted, by the same sidecar
   rule, with segment events only (Kafka's ``deleteRemoteLogPartition`` writes no
   partition-delete records). A pass whose topic deletions would remove more than
   ``topic_deletion_max_share`` of the tiered segments of the whole store (every sidecar
   computes it over every confirmed topic, not only those it deletes itself) deletes none of
   them: ``topic_deletion_halted`` (error log) and ``topic_deletion_halted_total``, unless
   ``topic_deletion_override_share`` is set.
3. **Remote retention** of the partitions this broker leads (fresh cluster view), with Kafka's
   rules (:mod:`sidecar.retention.policy`): the lineage is the broker's leader-epoch
   checkpoint, the log start offset comes from ListOffsets EARLIEST, ``retention.*`` from
   DescribeConfigs, or from a ``[[retention.overrides]]`` entry. For an overridden topic the log
   start offset counts only when it lies strictly inside a local segment (a DeleteRecords),
   checked against a listing of the partition dir made after ListOffsets answered, and only
   once it moved while the broker leads the partition (a new leader inherits its log start
   from the previous one, whose segment boundaries differ).
4. **Local-retention safety** (:mod:`sidecar.retention.safety`): at-risk gauge and warnings;
   segments the broker deleted before they were tiered are counted as lost (``note_change`` is
   the log-dir detector's callback; the check itself runs in the pass).
5. **Orphan scrub** every ``scrub_interval_s``, once every metadata partition is read, and
   only while the metadata topic keeps every record (``retention.ms`` and ``retention.bytes``
   -1 in DescribeConfigs): otherwise it is refused (``scrub_runs_total{outcome="refused"}``)
   for everything but staged segments, which never depend on the metadata.

Who runs the cluster-wide duties (1, 2 and 5) depends on ``remote_log_metadata.tailing``:

* ``selective`` (``coordinator`` given): each sidecar's tailer reads only the metadata
  partitions of the partitions its broker hosts (the tiering engine tracks those), as Kafka's
  RLMM does. One sidecar per cluster, the coordinator (:mod:`sidecar.retention.election`),
  additionally reads every metadata partition and runs 1, 2 and 5 for the whole cluster. When
  it loses the role, it stops reading the metadata partitions its broker does not need. The
  others still forget a deleted topic's partitions once nothing of them is left.
* ``all``: every sidecar reads every metadata partition; 1 and 2 run on the sidecar of the
  broker that leads the partition's metadata partition, and every sidecar scrubs.

Store reads run in worker threads; every deletion goes through the publisher with read-back.
With ``dry_run`` nothing is deleted: the decisions are logged.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sidecar._aio import wait_any
from sidecar.config import RetentionConfig
from sidecar.errors import SidecarError
from sidecar.kafka.checkpoints import decode_kafka_uuid, load_epoch_cache
from sidecar.kafka.logdir import FileKind, PartitionScan, parse_segment_file_name
from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.publisher import MetadataPublisher
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.metadata.tailer import MetadataTailer
from sidecar.observability.logging import bind_context, get_logger
from sidecar.observability.metrics import Metrics
from sidecar.retention._kafka import RetentionKafka, TopicIdState
from sidecar.retention.policy import (
    DeleteReason,
    Expiry,
    PartitionFacts,
    RetentionPlan,
    delete_records_offset,
    plan_expiry,
)
from sidecar.retention.safety import LocalRetention, at_risk_segments, lost_segments
from sidecar.retention.scrub import OrphanScrubber, UnsafeScrubError, metadata_retention_problem
from sidecar.storage.base import ObjectStore, abort_uploads_of
from sidecar.tiering.cluster import ClusterWatcher, TopicConfig, TopicSelector
from sidecar.tiering.planner import RemoteCoverage, find_highest_remote_offset
from sidecar.tiering.uploader import SegmentUploader
from sidecar.tiering.workers import remote_coverage

__all__ = ["RetentionManager"]

log = get_logger(__name__)

_STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
_DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
_PD_MARKED = RemotePartitionDeleteState.DELETE_PARTITION_MARKED
_PD_STARTED = RemotePartitionDeleteState.DELETE_PARTITION_STARTED
_PD_FINISHED = RemotePartitionDeleteState.DELETE_PARTITION_FINISHED
#: events published at once while deleting a batch of segments
_PUBLISH_CONCURRENCY = 16
#: segments deleted per round of _delete: a stop is honoured between rounds, so SIGTERM during
#: the deletion of a partition of thousands of segments waits for one round, not all of them
_DELETE_BATCH = 256
#: how long a sidecar is without the coordinator role before it drops the other partitions'
#: metadata: longer than a rebalance, which revokes the role from its holder for a moment
_NARROW_AFTER_S = 30.0
#: how long the scrub waits for the store to read every metadata partition to its end
_SCRUB_SYNC_S = 60.0


#: a time no segment expires before (retention.ms unlimited)
_NEVER_MS: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class _StoreFacts:
    """What a retention pass reads from the store for one partition."""

    highest: int
    coverage: RemoteCoverage
    segments: Sequence[SegmentMetadata]


@dataclass(slots=True)
class _Remembered:
    """What the last pass learnt of a led partition, for the inputs it had: its scan, LSO and
    store version (the highest remote offset and coverage follow from them), and, once a plan
    deleted nothing, the log start offset and topic config it was made with and the time
    before which no segment can expire by time. Small whatever the number of segments: the
    segments themselves are read again when a plan is needed."""

    scan: PartitionScan
    lso: int
    version: int
    highest: int
    coverage: RemoteCoverage
    planned: tuple[int, TopicConfig] | None = None
    quiet_until_ms: int = 0


@dataclass
class PassSummary:
    """What one pass did (logged as ``retention_pass``)."""

    partitions: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    would_delete: int = 0
    at_risk: int = 0
    errors: int = 0
    #: topic deletion stopped: it would have removed too large a share of the tiered segments
    topic_deletion_halted: bool = False


#: how long a deleted topic's series stay in /metrics after its last partition left the store:
#: long enough for every scraper to see the deletion's last increments
SERIES_GRACE_S = 600.0


class RetentionManager:
    """Applies remote retention and deletions; see the module docstring."""

    def __init__(
        self,
        *,
        config: RetentionConfig,
        views: Callable[[], Mapping[Path, PartitionScan]],
        cluster: ClusterWatcher,
        kafka: RetentionKafka,
        store: RemoteSegmentStore,
        tailer: MetadataTailer,
        publisher: MetadataPublisher,
        uploader: SegmentUploader,
        objects: ObjectStore,
        scrubber: OrphanScrubber,
        metrics: Metrics,
        metadata_topic: str,
        num_metadata_partitions: int,
        coordinator: Callable[[], bool] | None = None,
        scanned: Callable[[], bool] = lambda: True,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``coordinator``: whether this sidecar holds the cluster duties now (selective
        tailing); None runs them by the metadata partition leader rule, reading everything."""
        self._config = config
        self._coordinator = coordinator
        self._scanned = scanned
        # selective: narrowed once what the broker hosts is known (a store may hold more)
        self._reads_all = True
        self._without_role_since: float | None = None
        self._views = views
        self._cluster = cluster
        self._kafka = kafka
        self._store = store
        self._tailer = tailer
        self._publisher = publisher
        self._uploader = uploader
        self._objects = objects
        self._scrubber = scrubber
        self._metrics = metrics
        self._metadata_topic = metadata_topic
        self._num_mp = num_metadata_partitions
        self._clock_ms = clock_ms
        self._monotonic = monotonic
        self._broker_id = uploader.broker_id
        self._gone_since: dict[uuid.UUID, float] = {}
        #: the last unconfirming answer logged per topic id (logged again when it changes)
        self._unconfirmed: dict[uuid.UUID, TopicIdState] = {}
        #: topic ids seen with remote.storage.enable=true (their remote data is the broker's)
        self._broker_driven_ids: set[uuid.UUID] = set()
        self._removed: list[tuple[PartitionScan, PartitionScan | None]] = []
        # (topic, partition) -> base offsets already warned about; pruned every pass to the
        # partitions and segments in the log dir now (see _prune_warned)
        self._warned_at_risk: dict[tuple[str, int], set[int]] = {}
        # what the last pass learnt of each led partition (see _Remembered): a pass reads the
        # store again only where its inputs moved or a segment may have expired since (at a
        # thousand led partitions, three thread hand-offs each every pass were most of an
        # idle daemon's work)
        self._facts: dict[TopicIdPartition, _Remembered] = {}
        # overridden topics: (latest epoch of the broker's cache, log start offset) first seen
        # since the broker leads the partition (see _delete_records)
        self._first_starts: dict[TopicIdPartition, tuple[int | None, int]] = {}
        self._at_risk_topics: set[str] = set()
        #: deleted topics whose partitions were forgotten -> when their series are dropped
        self._series_due: dict[str, float] = {}
        self._next_scrub_at = 0.0
        self._wake = asyncio.Event()
        self.passes = 0

    def poke(self) -> None:
        """Run the next pass now (the cluster duties changed hands)."""
        self._wake.set()

    # --- the log-dir detector's callback (event loop; no I/O)

    def note_change(self, old: PartitionScan | None, new: PartitionScan | None) -> None:
        """A partition dir changed: remember removed segments for the lost-segment check."""
        if old is None:
            return
        if new is None or {s.base_offset for s in old.segments} - {
            s.base_offset for s in new.segments
        }:
            self._removed.append((old, new))

    # --- the loop

    async def run(self, stopping: asyncio.Event) -> None:
        """Root task: one pass every ``interval_s`` until ``stopping``."""
        try:
            if self._coordinator is None:
                self._tailer.track(range(self._num_mp))
            while not stopping.is_set():
                try:
                    await self.run_once(stopping)
                except SidecarError as exc:
                    self._metrics.retention_errors.labels(type(exc).__name__).inc()
                    log.warning("retention_pass_failed", error=str(exc))
                await wait_any(stopping, self._wake, within=self._config.interval_s)
                self._wake.clear()
        finally:
            await self._kafka.aclose()

    async def run_once(self, stopping: asyncio.Event | None = None) -> PassSummary:
        """One pass (see the module docstring)."""
        stop = stopping or asyncio.Event()
        summary = PassSummary()
        self.passes += 1
        self._follow_role()
        await self._check_lost()
        listed = await self._topic_ids()
        topic_ids = None if listed is None else set(listed.values())
        partitions, markers = await asyncio.to_thread(self._partitions_and_markers)
        # topic ids the store no longer holds (their partitions were forgotten) are not tracked
        stored_ids = {tp.topic_id for tp in partitions}
        self._gone_since = {i: t for i, t in self._gone_since.items() if i in stored_ids}
        self._unconfirmed = {i: s for i, s in self._unconfirmed.items() if i in stored_ids}
        self._broker_driven_ids &= stored_ids  # nothing of theirs left to leave to Kafka
        candidates: list[TopicIdPartition] = []
        # retention.enabled = false: no retention, partition or topic deletion (the scrub
        # has its own switch)
        for tp in partitions if self._config.enabled else ():
            if stop.is_set():
                break
            if self._broker_driven(tp, listed):
                continue  # Kafka's RLM deletes these itself, partition and topic deletion too
            marker = markers.get(tp)
            if marker is None and topic_ids is not None and tp.topic_id in topic_ids:
                # nothing to delete (most partitions, every pass): no per-partition task
                if self._caught_up(tp):
                    self._listed(tp)
                continue
            await self._guarded(
                summary, tp, self._deletions(tp, marker, topic_ids, summary, candidates, stop)
            )
        # a topic id must be confirmed unknown at every pass: one not asked about in this one
        # (the listing failed, its partitions not caught up, or listed again) starts over
        asked = {tp.topic_id for tp in candidates}
        self._gone_since = {i: t for i, t in self._gone_since.items() if i in asked}
        if not stop.is_set():
            await self._topic_deletions(candidates, summary, stop)
        await self._retention(summary, stop)
        self._forget_series(partitions)
        if (
            self._config.scrub_enabled
            and time.monotonic() >= self._next_scrub_at
            and not stop.is_set()
        ):
            await self._scrub(stop)
        log.info(
            "retention_pass",
            partitions=summary.partitions,
            deleted=summary.deleted,
            deleted_bytes=summary.deleted_bytes,
            would_delete=summary.would_delete,
            at_risk=summary.at_risk,
            errors=summary.errors,
            topic_deletion_halted=summary.topic_deletion_halted,
        )
        return summary

    async def _guarded(
        self, summary: PassSummary, tp: TopicIdPartition, work: Awaitable[None]
    ) -> None:
        with bind_context(topic=tp.topic, partition=tp.partition):
            try:
                await work
            except SidecarError as exc:
                summary.errors += 1
                self._metrics.retention_errors.labels(type(exc).__name__).inc()
                log.warning(
                    "retention_partition_failed", error=str(exc), error_type=type(exc).__name__
                )

    async def _topic_ids(self) -> dict[str, uuid.UUID] | None:
        """Every topic's id by name (the all-topics listing), or None without an answer."""
        if not self._config.topic_deletion:
            return None
        try:
            return await self._kafka.topic_ids()
        except SidecarError as exc:
            self._metrics.retention_errors.labels(type(exc).__name__).inc()
            log.warning("topic_ids_unavailable", error=str(exc))
            return None

    def _broker_driven(self, tp: TopicIdPartition, listed: dict[str, uuid.UUID] | None) -> bool:
        """The topic has (or had, while this process ran) remote.storage.enable=true: the
        broker's RLM owns its remote data. The config is the name's, so it counts for ``tp``'s
        topic id only while the listing gives the name that id (a standalone topic deleted and
        re-created broker-driven under its name leaves the old id's data to the sidecar: the
        broker's RLM knows only the new id). Remembered by topic id, so the topic's deletion
        does not hand its cleanup to the sidecar, until the store holds none of its
        partitions or the listing shows the same topic turned remote.storage.enable=false
        (Kafka deleted its remote data then; what is remote since is the sidecar's own
        standalone copies); without a listing, the config's topic is taken to be ``tp``'s."""
        config = self._cluster.view.configs.get(tp.topic)
        current = None if listed is None else listed.get(tp.topic)
        if current is not None and current != tp.topic_id:
            return tp.topic_id in self._broker_driven_ids  # an earlier topic of that name
        if TopicSelector.broker_driven(config):
            self._broker_driven_ids.add(tp.topic_id)
            return True
        if config is not None and current == tp.topic_id:
            self._broker_driven_ids.discard(tp.topic_id)
            return False
        return tp.topic_id in self._broker_driven_ids

    def _caught_up(self, tp: TopicIdPartition) -> bool:
        return self._tailer.caught_up(metadata_partition(tp, self._num_mp))

    def _follow_role(self) -> None:
        """Selective tailing: read every metadata partition whole while coordinator;
        otherwise keep only the partitions this broker hosts (the engine asks for those as
        they appear), once the first scan and a fresh cluster view say which they are."""
        if self._coordinator is None:
            return
        now = self._monotonic()
        if self._coordinator():
            if not self._reads_all:
                log.info("metadata_reading_all_partitions", partitions=self._num_mp)
            self._reads_all = True
            self._without_role_since = None
            self._tailer.want_everything()
            return
        if self._without_role_since is None:
            self._without_role_since = now
        if now - self._without_role_since < _NARROW_AFTER_S:
            return  # a rebalance, or the first election, may give it (back) in a moment
        if not self._reads_all or not (self._scanned() and self._cluster.view.fresh):
            return
        self._reads_all = False
        hosted = [
            TopicIdPartition(decode_kafka_uuid(scan.topic_id), scan.topic, scan.partition)
            for scan in self._views().values()
            if scan.topic_id is not None and self._cluster.tiered(scan.topic)
        ]
        self._tailer.narrow(hosted)
        log.info("metadata_reading_hosted_partitions", partitions=len(hosted))

    def _processes(self, tp: TopicIdPartition) -> bool:
        """Whether this sidecar deletes ``tp``'s data: it is the coordinator (selective
        tailing), or its broker leads the metadata partition (every sidecar reads all)."""
        if self._coordinator is not None:
            return self._coordinator()
        view = self._cluster.view
        mp = metadata_partition(tp, self._num_mp)
        return view.fresh and view.leaders.get((self._metadata_topic, mp)) == self._broker_id

    # --- partition and topic deletion

    def _partitions_and_markers(
        self,
    ) -> tuple[list[TopicIdPartition], dict[TopicIdPartition, PartitionDeleteMetadata]]:
        """(worker thread) Every partition of the store, and the partition-delete markers."""
        return self._store.partitions(), self._store.partition_deletes()

    async def _deletions(
        self,
        tp: TopicIdPartition,
        marker: PartitionDeleteMetadata | None,
        topic_ids: set[uuid.UUID] | None,
        summary: PassSummary,
        candidates: list[TopicIdPartition],
        stop: asyncio.Event,
    ) -> None:
        """Partition deletion of ``tp`` (``marker``: its partition-delete event, read at the
        pass's start); or, when its topic id is missing from the all-topics listing, add it to
        ``candidates`` for :meth:`_topic_deletions`."""
        if not self._caught_up(tp):
            return
        if marker is not None and marker.state in (_PD_MARKED, _PD_STARTED):
            if self._processes(tp):
                await self._delete_partition(tp, marker, summary, stop)
            return
        if topic_ids is None:
            return
        if tp.topic_id in topic_ids:
            self._listed(tp)
            return
        candidates.append(tp)

    def _listed(self, tp: TopicIdPartition) -> None:
        """``tp``'s topic is in the all-topics listing: any deletion proof gathered is void."""
        self._gone_since.pop(tp.topic_id, None)
        self._unconfirmed.pop(tp.topic_id, None)

    async def _confirmed_gone(self, candidates: Sequence[TopicIdPartition]) -> set[uuid.UUID]:
        """The candidates' topic ids that the cluster answered UNKNOWN_TOPIC_ID for, at every
        pass for ``topic_deletion_grace_s``. Any other answer resets the grace period."""
        names = {tp.topic_id: tp.topic for tp in candidates}
        try:
            states = await self._kafka.topic_id_states(names)
        except SidecarError as exc:
            # no answer is no proof, and the grace period needs proof at each pass
            self._metrics.retention_errors.labels(type(exc).__name__).inc()
            log.warning("topic_id_states_unavailable", error=str(exc))
            for topic_id in names:
                self._gone_since.pop(topic_id, None)
            return set()
        for topic_id in names.keys() - states.keys():
            self._gone_since.pop(topic_id, None)  # not answered for
        now = self._monotonic()
        grace = self._config.topic_deletion_grace_s
        gone: set[uuid.UUID] = set()
        for topic_id, state in states.items():
            if state is TopicIdState.ABSENT:
                self._unconfirmed.pop(topic_id, None)
                since = self._gone_since.setdefault(topic_id, now)
                if now - since >= grace:
                    gone.add(topic_id)
                continue
            self._gone_since.pop(topic_id, None)
            if state is TopicIdState.PRESENT:  # created or re-listed in between
                self._unconfirmed.pop(topic_id, None)
                continue
            self._metrics.topic_deletion_unconfirmed.labels(state.value).inc()
            if self._unconfirmed.get(topic_id) is not state:
                self._unconfirmed[topic_id] = state
                log.warning(
                    "topic_deletion_unconfirmed",
                    topic=names[topic_id],
                    topic_id=str(topic_id),
                    answer=state.value,
                    detail="missing from the topic listing but not confirmed unknown by id:"
                    " its tiered data is kept (check the sidecar principal's Describe ACLs)",
                )
        return gone

    async def _topic_deletions(
        self, candidates: Sequence[TopicIdPartition], summary: PassSummary, stop: asyncio.Event
    ) -> None:
        """Delete the data of the topics confirmed gone (see the module docstring)."""
        if not candidates:
            return
        gone = await self._confirmed_gone(candidates)
        ready = [tp for tp in candidates if tp.topic_id in gone]
        if not ready:
            return
        doomed = {tp: await asyncio.to_thread(self._store.segments, tp) for tp in ready}
        for tp in [tp for tp, segments in doomed.items() if not segments]:
            # nothing of it is left: every sidecar drops it from its store
            if await asyncio.to_thread(self._store.forget_partition, tp):
                self._series_due.setdefault(tp.topic, self._monotonic() + SERIES_GRACE_S)
                log.info(
                    "deleted_topic_partition_forgotten",
                    topic=tp.topic,
                    partition=tp.partition,
                    topic_id=str(tp.topic_id),
                )
        count = sum(len(segments) for segments in doomed.values())
        if count == 0 or (self._coordinator is not None and not self._coordinator()):
            return  # the share is the whole cluster's: only the coordinator reads all of it
        total = await asyncio.to_thread(self._live_segment_count)
        share = count / max(total, 1)
        limit = self._config.topic_deletion_max_share
        if share > limit:
            if not self._config.topic_deletion_override_share:
                summary.topic_deletion_halted = True
                self._metrics.topic_deletion_halted.inc()
                log.error(
                    "topic_deletion_halted",
                    segments=count,
                    tiered_segments=total,
                    share=round(share, 4),
                    max_share=limit,
                    topic_ids=sorted(str(t) for t in gone)[:20],
                    detail="these topics' data would be more than retention.topic_deletion_max"
                    "_share of the tiered segments: nothing deleted; after checking that the"
                    " topics are really deleted, set retention.topic_deletion_override_share",
                )
                return
            log.warning("topic_deletion_share_overridden", segments=count, tiered_segments=total)
        for tp in ready:
            if stop.is_set():
                break
            segments = doomed[tp]
            if not segments or not self._processes(tp):
                continue
            await self._guarded(
                summary, tp, self._delete_topic_partition(tp, segments, summary, stop)
            )

    def _forget_series(self, stored: Sequence[TopicIdPartition]) -> None:
        """Drop the metric series of deleted topics once their grace has passed, unless the
        name is in use again (a new topic of the same name, in the store or the log dir)."""
        now = self._monotonic()
        due = [topic for topic, at in self._series_due.items() if at <= now]
        if not due:
            return  # every pass but a rare one: nothing more to look at
        stored_topics = {tp.topic for tp in stored}
        local = {scan.topic for scan in self._views().values()}
        for topic in due:
            del self._series_due[topic]
            if topic in stored_topics or topic in local:
                continue
            self._metrics.forget_topic(topic)
            log.info("deleted_topic_series_dropped", topic=topic)

    def _live_segment_count(self) -> int:
        """Live segments of every partition of the store: this cluster's tiered segments
        (worker thread)."""
        return self._store.segment_count()

    async def _delete_topic_partition(
        self,
        tp: TopicIdPartition,
        segments: Sequence[SegmentMetadata],
        summary: PassSummary,
        stop: asyncio.Event,
    ) -> None:
        log.info("topic_deleted_remote_cleanup", topic_id=str(tp.topic_id), segments=len(segments))
        items = [Expiry(s, DeleteReason.TOPIC_DELETED) for s in segments]
        await self._delete(tp, items, summary, stop)

    async def _delete_partition(
        self,
        tp: TopicIdPartition,
        marker: PartitionDeleteMetadata,
        summary: PassSummary,
        stop: asyncio.Event,
    ) -> None:
        if self._config.dry_run:
            segments = await asyncio.to_thread(self._store.segments, tp)
            summary.would_delete += len(segments)
            log.info("partition_delete_would_run", state=marker.state.name, segments=len(segments))
            return
        if marker.state is _PD_MARKED:
            await self._publish_partition_state(tp, _PD_STARTED)
        segments = await asyncio.to_thread(self._store.segments, tp)
        log.info("partition_delete_started", segments=len(segments))
        items = [Expiry(s, DeleteReason.PARTITION_DELETED) for s in segments]
        if not await self._delete(tp, items, summary, stop):
            return  # DELETE_PARTITION_STARTED stays: the next pass deletes the rest
        await self._publish_partition_state(tp, _PD_FINISHED)
        self._metrics.partition_deletions.inc()
        log.info("partition_delete_finished", segments=len(segments))

    async def _publish_partition_state(
        self, tp: TopicIdPartition, state: RemotePartitionDeleteState
    ) -> None:
        await self._publisher.publish_and_wait(
            PartitionDeleteMetadata(
                topic_id_partition=tp,
                broker_id=self._broker_id,
                event_timestamp_ms=self._clock_ms(),
                state=state,
            )
        )

    # --- remote retention

    async def _retention(self, summary: PassSummary, stop: asyncio.Event) -> None:
        if not self._config.enabled:
            return
        view = self._cluster.view
        led: list[tuple[PartitionScan, TopicIdPartition]] = []
        at_risk: dict[str, int] = {}
        scans = self._views()
        self._prune_warned(scans.values())
        for scan in scans.values():
            if scan.topic_id is None or not self._cluster.selected(scan.topic):
                continue
            at_risk.setdefault(scan.topic, 0)
            if not view.may_upload(scan.topic, scan.partition):
                continue
            tp = TopicIdPartition(decode_kafka_uuid(scan.topic_id), scan.topic, scan.partition)
            if self._caught_up(tp):
                led.append((scan, tp))
        led_now = {tp for _, tp in led}
        self._facts = {tp: f for tp, f in self._facts.items() if tp in led_now}
        self._first_starts = {tp: f for tp, f in self._first_starts.items() if tp in led_now}
        if not led:
            self._publish_at_risk(at_risk)
            return
        try:
            starts = await self._kafka.log_start_offsets(
                [(tp.topic, tp.partition) for _, tp in led]
            )
        except SidecarError as exc:
            self._metrics.retention_errors.labels(type(exc).__name__).inc()
            log.warning("log_start_offsets_unavailable", error=str(exc))
            return
        for scan, tp in led:
            if stop.is_set():
                break
            summary.partitions += 1
            start = starts.get((tp.topic, tp.partition))
            if start is None:
                continue
            await self._guarded(
                summary, tp, self._retain_partition(scan, tp, start, summary, at_risk, stop)
            )
        self._publish_at_risk(at_risk)

    async def _retain_partition(
        self,
        scan: PartitionScan,
        tp: TopicIdPartition,
        log_start_offset: int,
        summary: PassSummary,
        at_risk: dict[str, int],
        stop: asyncio.Event,
    ) -> None:
        view = self._cluster.view
        config = view.configs.get(scan.topic)
        lso = view.lso(scan.topic, scan.partition)
        if config is None or lso is None:
            return
        version = self._store.partition_version(tp)
        known = self._facts.get(tp)
        segments: Sequence[SegmentMetadata] | None = None
        if known is None or known.scan is not scan or (known.lso, known.version) != (lso, version):
            stored = await asyncio.to_thread(self._read_store_facts, scan, tp, lso)
            segments = stored.segments
            known = _Remembered(scan, lso, version, stored.highest, stored.coverage)
            self._facts[tp] = known
        highest = known.highest
        now_ms = self._clock_ms()
        self._check_at_risk(scan, highest, known.coverage, config, now_ms, summary, at_risk)
        override = self._config.override_for(scan.topic)
        # recorded at every pass, before anything returns early
        first_start = None if override is None else self._first_start(tp, scan, log_start_offset)
        if (
            override is None
            and known.planned == (log_start_offset, config)
            and now_ms < known.quiet_until_ms
        ):
            return  # the same inputs planned nothing, and nothing is old enough yet
        if segments is None:
            segments = await asyncio.to_thread(self._store.segments, tp)
        if not segments:
            if override is None:  # nothing to expire until a copy moves the store's version
                known.planned, known.quiet_until_ms = (log_start_offset, config), _NEVER_MS
            return
        retention_ms, retention_bytes = config.retention_ms, config.retention_bytes
        delete_records: int | None = None
        if override is not None:
            if override.retention_ms != -2:
                retention_ms = override.retention_ms
            if override.retention_bytes != -2:
                retention_bytes = override.retention_bytes
            if log_start_offset != first_start:
                # listed after ListOffsets answered (see delete_records_offset)
                bases = await asyncio.to_thread(_local_base_offsets, scan.path)
                delete_records = delete_records_offset(log_start_offset, bases)
        facts = PartitionFacts(
            # the broker's loaded epoch cache: the lineage Kafka's retention walks
            lineage=[(e.epoch, e.start_offset) for e in load_epoch_cache(scan.leader_epochs)],
            log_start_offset=log_start_offset,
            log_end_offset=lso,
            only_local_bytes=sum(s.size for s in scan.segments if s.base_offset >= highest),
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            now_ms=now_ms,
            override=override is not None,
            delete_records_offset=delete_records,
        )
        plan = plan_expiry(segments, facts)
        if not plan.deletions and override is None:
            # until the oldest segment reaches retention.ms, a plan on the same inputs deletes
            # nothing again (the time rule is the only one that depends on the clock)
            oldest = min(s.max_timestamp_ms for s in segments)
            known.planned = (log_start_offset, config)
            known.quiet_until_ms = oldest + retention_ms if retention_ms > -1 else _NEVER_MS
        if plan.deletions:
            floor = _retained_floor(plan)
            if floor is not None and not self._config.dry_run:
                # first: tiering must not take these deletions for holes and upload them again
                await asyncio.to_thread(self._store.raise_remote_floor, tp, floor)
            await self._delete(
                tp, list(plan.deletions), summary, stop, still=functools.partial(self._retains, tp)
            )

    def _retains(self, tp: TopicIdPartition) -> bool:
        """This sidecar still applies remote retention to ``tp``: its topic is standalone and
        its broker leads it on a fresh view (a topic turned broker-driven is Kafka's to expire)."""
        return self._cluster.selected(tp.topic) and self._cluster.view.may_upload(
            tp.topic, tp.partition
        )

    def _first_start(self, tp: TopicIdPartition, scan: PartitionScan, log_start_offset: int) -> int:
        """The log start offset first seen since the broker leads ``tp`` (in the latest epoch
        of its leader-epoch cache). An overridden topic's log start counts as a DeleteRecords
        only once it has moved past this one: the broker took the one it had when it became
        leader from the previous leader's (followers follow the leader's log start), which
        the previous leader's own retention may have set inside one of this broker's
        segments (segment boundaries differ between replicas)."""
        epochs = load_epoch_cache(scan.leader_epochs)
        epoch = epochs[-1].epoch if epochs else None
        known = self._first_starts.get(tp)
        if known is None or known[0] != epoch:
            known = (epoch, log_start_offset)
            self._first_starts[tp] = known
        return known[1]

    def _read_store_facts(self, scan: PartitionScan, tp: TopicIdPartition, lso: int) -> _StoreFacts:
        """(worker thread) The highest remote offset of the lineage, the remote coverage and
        the live segments of ``tp``."""
        active = scan.active_segment
        log_end = max(active.base_offset if active is not None else 0, lso)
        highest = find_highest_remote_offset(
            load_epoch_cache(scan.leader_epochs),
            log_end,
            functools.partial(self._store.highest_offset_for_epoch, tp),
        )
        coverage = remote_coverage(self._store, scan, tp, lso)
        return _StoreFacts(highest, coverage, tuple(self._store.segments(tp)))

    def _check_at_risk(
        self,
        scan: PartitionScan,
        highest: int,
        coverage: RemoteCoverage,
        config: TopicConfig,
        now_ms: int,
        summary: PassSummary,
        at_risk: dict[str, int],
    ) -> None:
        retention = LocalRetention.of(
            remote_storage_enable=config.remote_storage_enable,
            remote_log_copy_disable=config.remote_log_copy_disable,
            retention_ms=config.retention_ms,
            retention_bytes=config.retention_bytes,
            local_retention_ms=config.local_retention_ms,
            local_retention_bytes=config.local_retention_bytes,
        )
        risky = at_risk_segments(
            scan.segments,
            highest_tiered_offset=highest,
            retention=retention,
            now_ms=now_ms,
            fraction=self._config.at_risk_fraction,
            coverage=coverage,
        )
        at_risk[scan.topic] = at_risk.get(scan.topic, 0) + len(risky)
        summary.at_risk += len(risky)
        for segment in risky:
            warned = self._warned_at_risk.setdefault((scan.topic, scan.partition), set())
            if segment.base_offset in warned:
                continue
            warned.add(segment.base_offset)
            log.warning(
                "segment_at_risk",
                base_offset=segment.base_offset,
                end_offset=segment.end_offset,
                local_retention_ms=retention.ms,
                local_retention_bytes=retention.bytes,
            )

    def _prune_warned(self, scans: Iterable[PartitionScan]) -> None:
        """Forget warnings for partitions and segments no longer in the log dir, so the memory
        follows the partitions present now (topics deleted or moved away, segments deleted)."""
        present = {(s.topic, s.partition): s for s in scans}
        for key in list(self._warned_at_risk):
            scan = present.get(key)
            if scan is None:
                del self._warned_at_risk[key]
                continue
            warned = self._warned_at_risk[key]
            warned &= {s.base_offset for s in scan.segments}
            if not warned:
                del self._warned_at_risk[key]

    def _publish_at_risk(self, at_risk: Mapping[str, int]) -> None:
        for topic, count in at_risk.items():
            self._metrics.segments_at_risk.labels(topic).set(count)
        # a topic no longer in the log dir (deleted, moved away) drops its series
        for topic in self._at_risk_topics - at_risk.keys():
            self._metrics.segments_at_risk.remove(topic)
        self._at_risk_topics = set(at_risk)

    async def _check_lost(self) -> None:
        removed, self._removed = self._removed, []
        for old, new in removed:
            if old.topic_id is None or not self._cluster.selected(old.topic):
                continue
            tp = TopicIdPartition(decode_kafka_uuid(old.topic_id), old.topic, old.partition)
            active = old.active_segment
            highest = await asyncio.to_thread(
                find_highest_remote_offset,
                load_epoch_cache(old.leader_epochs),
                active.base_offset if active is not None else 0,
                functools.partial(self._store.highest_offset_for_epoch, tp),
            )
            coverage = await asyncio.to_thread(remote_coverage, self._store, old, tp, None)
            lost = lost_segments(
                old.segments,
                new.segments if new is not None else (),
                highest_tiered_offset=highest,
                coverage=coverage,
            )
            for segment in lost:
                self._metrics.segments_lost.labels(old.topic).inc()
                log.error(
                    "segment_lost_untiered",
                    topic=old.topic,
                    partition=old.partition,
                    base_offset=segment.base_offset,
                    end_offset=segment.end_offset,
                    highest_tiered_offset=highest,
                )

    # --- deleting segments

    async def _delete(
        self,
        tp: TopicIdPartition,
        items: Sequence[Expiry],
        summary: PassSummary,
        stop: asyncio.Event,
        *,
        still: Callable[[], bool] | None = None,
    ) -> bool:
        """Delete ``items`` in rounds of :data:`_DELETE_BATCH`, in their order; True once all
        are deleted, False when ``stop`` ended it between rounds (every round is whole, and
        the rest is left for the next pass), or ``still`` said no before a round (the
        partition's retention is no longer this sidecar's: another leader, or Kafka's)."""
        for first in range(0, len(items), _DELETE_BATCH):
            if first and stop.is_set():
                log.info(
                    "remote_segment_deletion_stopped",
                    deleted=first,
                    left=len(items) - first,
                    detail="the daemon is stopping: the next pass deletes the rest",
                )
                return False
            if still is not None and not still():
                log.info(
                    "remote_segment_deletion_stopped",
                    deleted=first,
                    left=len(items) - first,
                    detail="no longer this sidecar's to expire: another broker leads the"
                    " partition, or its topic turned broker-driven",
                )
                return False
            await self._delete_round(tp, items[first : first + _DELETE_BATCH], summary)
        return True

    async def _delete_round(
        self, tp: TopicIdPartition, items: Sequence[Expiry], summary: PassSummary
    ) -> None:
        """DELETE_SEGMENT_STARTED for each (unless already) → delete the objects (and any open
        multipart upload of an unfinished copy) → DELETE_SEGMENT_FINISHED for each."""
        if self._config.dry_run:
            summary.would_delete += len(items)
            for item in items:
                log.info(
                    "remote_segment_would_delete",
                    reason=item.reason.value,
                    segment_id=str(item.segment.segment_id.id),
                    start_offset=item.segment.start_offset,
                    end_offset=item.segment.end_offset,
                )
            return
        slots = asyncio.Semaphore(_PUBLISH_CONCURRENCY)

        async def publish(segment: SegmentMetadata, state: RemoteLogSegmentState) -> None:
            async with slots:
                await self._publisher.publish_and_wait(
                    SegmentMetadataUpdate(
                        segment_id=segment.segment_id,
                        broker_id=self._broker_id,
                        event_timestamp_ms=self._clock_ms(),
                        state=state,
                    )
                )

        log.info(
            "remote_segments_deleting",
            segments=len(items),
            reasons=sorted({i.reason.value for i in items}),
        )
        await asyncio.gather(
            *(
                publish(i.segment, _DELETE_STARTED)
                for i in items
                if i.segment.state is not _DELETE_STARTED
            )
        )
        keys = [key for i in items for key in self._uploader.keys(i.segment).values()]
        await self._objects.delete(keys)
        for item in items:
            if item.segment.state is _STARTED or item.reason is DeleteReason.RETRY:
                await self._abort_uploads(self._uploader.keys(item.segment).values())
        await asyncio.gather(*(publish(i.segment, _DELETE_FINISHED) for i in items))
        for item in items:
            segment = item.segment
            self._metrics.retention_deleted_segments.labels(tp.topic, item.reason.value).inc()
            self._metrics.retention_deleted_bytes.labels(tp.topic, item.reason.value).inc(
                segment.segment_size_in_bytes
            )
            summary.deleted += 1
            summary.deleted_bytes += segment.segment_size_in_bytes
            log.info(
                "remote_segment_deleted",
                reason=item.reason.value,
                segment_id=str(segment.segment_id.id),
                start_offset=segment.start_offset,
                end_offset=segment.end_offset,
                bytes=segment.segment_size_in_bytes,
            )

    async def _abort_uploads(self, keys: Iterable[str]) -> None:
        for key in keys:
            await abort_uploads_of(self._objects, key)

    # --- scrub

    async def _scrub(self, stop: asyncio.Event) -> None:
        if self._coordinator is not None and not self._coordinator():
            return  # one scrub per cluster: the coordinator's
        view = self._cluster.view
        meta_config = view.configs.get(self._metadata_topic)
        if (
            not all(self._tailer.caught_up(p) for p in range(self._num_mp))
            or not view.fresh
            or meta_config is None
        ):
            self._metrics.scrub_runs.labels("skipped").inc()
            return
        behind = await self._metadata_behind(stop)
        if stop.is_set():
            return
        if behind is not None:
            # the objects of copies this store never read about would look like orphans
            self._metrics.scrub_runs.labels("skipped").inc()
            log.warning("scrub_skipped", reason=behind)
            return
        self._next_scrub_at = time.monotonic() + self._config.scrub_interval_s
        unsafe = metadata_retention_problem(self._metadata_topic, meta_config)
        try:
            report = await self._scrubber.scrub(
                dry_run=self._config.dry_run, unsafe=unsafe, stop=stop
            )
        except UnsafeScrubError as exc:
            self._metrics.scrub_runs.labels("refused").inc()
            self._metrics.retention_errors.labels(type(exc).__name__).inc()
            return  # the scrubber logged scrub_refused
        except SidecarError as exc:
            self._metrics.scrub_runs.labels("failed").inc()
            self._metrics.retention_errors.labels(type(exc).__name__).inc()
            log.warning("scrub_failed", error=str(exc))
            return
        if report.stopped:
            self._metrics.scrub_runs.labels("stopped").inc()
            return
        if report.refused is not None:
            # only staged segments went: the rest waits for a metadata topic that keeps all
            self._metrics.scrub_runs.labels("refused").inc()
            self._metrics.retention_errors.labels(UnsafeScrubError.__name__).inc()
        else:
            self._metrics.scrub_runs.labels("ok").inc()
        if not report.dry_run:
            self._metrics.scrub_deleted_objects.inc(len(report.orphans))
            self._metrics.scrub_aborted_uploads.inc(len(report.aborted_uploads))

    async def _metadata_behind(self, stop: asyncio.Event) -> str | None:
        """Why the store may lack events published before now, or None once every metadata
        partition is read up to its end offset asked now. Being caught up once is not enough:
        a tailer that stopped reading since (a revoked ACL, an unreachable leader) keeps that.
        ``stop`` set meanwhile ends the wait (the tailer stops reading at shutdown)."""
        tailer = self._tailer
        if not tailer.healthy:
            return f"the metadata tailer is failing: {tailer.last_error}"
        if tailer.stalled:
            return f"metadata partitions {sorted(tailer.stalled)} are not being read"

        async def synced() -> None:
            for p in range(self._num_mp):
                await tailer.sync(p)

        syncing = asyncio.ensure_future(synced())
        stopping = asyncio.ensure_future(stop.wait())
        failure: Exception | None = None
        try:
            await asyncio.wait(
                (syncing, stopping), timeout=_SCRUB_SYNC_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
            finished = syncing.done()
            syncing.cancel()  # a no-op once it is done; then its outcome is taken here
            try:
                await syncing
            except asyncio.CancelledError:
                if not syncing.cancelled():
                    raise  # this task is being cancelled
            except Exception as exc:  # noqa: BLE001 - any failure of the reading is a reason
                failure = exc
        if failure is not None:
            return f"the store did not read the metadata topic to its end: {failure!r}"
        if stop.is_set():
            return "stopping"
        if not finished:
            return f"the store did not read the metadata topic to its end in {_SCRUB_SYNC_S:g} s"
        return None


def _retained_floor(plan: RetentionPlan) -> int | None:
    """The offset below which ``plan`` deletes remote data on purpose: the new remote log start
    of its time and size deletions, and the ends of its log-start deletions."""
    ends = [
        item.segment.end_offset + 1
        for item in plan.deletions
        if item.reason is DeleteReason.LOG_START_OFFSET
    ]
    if plan.new_log_start_offset is not None:
        ends.append(plan.new_log_start_offset)
    return max(ends, default=None)


def _local_base_offsets(path: Path) -> list[int]:
    """Base offsets of the ``.log`` files in a partition dir now (worker thread; read only).
    Files being deleted (``.deleted``) are left out; a vanished dir lists nothing."""
    try:
        names = [entry.name for entry in path.iterdir()]
    except OSError:
        return []
    offsets = []
    for name in names:
        parsed = parse_segment_file_name(name)
        if parsed is not None and parsed.kind is FileKind.LOG and not parsed.suffix:
            offsets.append(parsed.offset)
    return offsets
