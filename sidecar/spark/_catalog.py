"""The driver's view of the archive: for every selected partition, its COPY_SEGMENT_FINISHED
segments along the leader-epoch lineage, as non-overlapping spans.

Two sources, one result. From the metadata topic, every event is applied to a throw-away
:class:`~sidecar.metadata.store.RemoteSegmentStore` (Kafka's state machine: only finished
copies count, deletes remove them). From the bucket alone, every ``*.manifest.json`` (the commit
point of a copy) becomes a COPY_SEGMENT_STARTED + FINISHED pair applied to the same store. Either
way :meth:`RemoteSegmentStore.finished_lineage` picks, for each offset, the one segment Kafka's
read path would serve it from, so copies superseded by a leader change never yield duplicates.

Runs in the planner process on the driver; no Spark here.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sidecar.metadata.events import (
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.store import RemoteSegmentStore, SegmentSpan
from sidecar.spark._options import ReadOptions, SparkOptionError
from sidecar.spark._s3 import S3Reader
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.manifest import MANIFEST_MAX_BYTES, SegmentManifest

__all__ = ["Catalog", "PartitionSpans", "build_catalog", "manifest_events"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionSpans:
    """One partition's finished segments along its lineage, in offset order."""

    tp: TopicIdPartition
    spans: tuple[SegmentSpan, ...]
    finished: tuple[SegmentMetadata, ...] = ()
    """Every COPY_SEGMENT_FINISHED segment, superseded copies included (for the audit)."""

    @property
    def first_offset(self) -> int | None:
        return self.spans[0].start_offset if self.spans else None

    @property
    def end_offset(self) -> int | None:
        """The offset after the last tiered one."""
        return self.spans[-1].end_offset + 1 if self.spans else None


@dataclass(slots=True)
class Catalog:
    """Every selected partition with tiered data, and the manifests already read (by segment)."""

    partitions: list[PartitionSpans]
    manifests: dict[uuid.UUID, SegmentManifest] = field(default_factory=dict)
    undecodable_events: int = 0


def manifest_events(manifest: SegmentManifest) -> list[RemoteLogMetadata]:
    """The COPY_SEGMENT_STARTED and FINISHED events a manifest stands for."""
    tp = TopicIdPartition(manifest.topic_id, manifest.topic, manifest.partition)
    segment_id = RemoteLogSegmentId(tp, manifest.segment_id)
    return [
        SegmentMetadata(
            segment_id=segment_id,
            start_offset=manifest.start_offset,
            end_offset=manifest.end_offset,
            broker_id=manifest.broker_id,
            max_timestamp_ms=manifest.max_timestamp_ms,
            event_timestamp_ms=manifest.event_timestamp_ms,
            segment_leader_epochs=manifest.leader_epochs,
            segment_size_in_bytes=manifest.size_bytes,
            txn_index_empty=manifest.txn_index_empty,
        ),
        SegmentMetadataUpdate(
            segment_id=segment_id,
            broker_id=manifest.broker_id,
            event_timestamp_ms=manifest.event_timestamp_ms,
            state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
        ),
    ]


def _read_manifests(
    reader: S3Reader, options: ReadOptions
) -> tuple[list[RemoteLogMetadata], dict[uuid.UUID, SegmentManifest]]:
    layout = KeyLayout(prefix=options.s3.prefix, hash_prefix=options.s3.hash_prefix)
    keys = []
    for key, _size in reader.list(options.s3.prefix):
        parsed = layout.parse(key)
        if parsed is None or parsed.suffix is not ObjectSuffix.MANIFEST:
            continue
        if options.selection.partition_selected(parsed.topic, parsed.partition):
            keys.append(key)

    def load(key: str) -> SegmentManifest:
        return SegmentManifest.from_json(reader.get(key, max_bytes=MANIFEST_MAX_BYTES), key=key)

    with ThreadPoolExecutor(max_workers=8) as pool:
        manifests = list(pool.map(load, keys))
    # events in commit order per partition, as the metadata topic would have them
    manifests.sort(key=lambda m: (m.event_timestamp_ms, m.start_offset))
    events: list[RemoteLogMetadata] = []
    for manifest in manifests:
        events += manifest_events(manifest)
    return events, {m.segment_id: m for m in manifests}


def _resolve_topics(store: RemoteSegmentStore, options: ReadOptions) -> list[TopicIdPartition]:
    """The selected partitions; a topic name with several topic ids (deleted and re-created)
    resolves to the incarnation whose partitions are not being deleted: no partition-delete
    event; of several such, the one with a segment left (Kafka 4 deletes a topic segment by
    segment, with no partition-delete event)."""
    by_name: dict[str, dict[uuid.UUID, list[TopicIdPartition]]] = {}
    for tp in store.partitions():
        if options.selection.partition_selected(tp.topic, tp.partition):
            by_name.setdefault(tp.topic, {}).setdefault(tp.topic_id, []).append(tp)
    chosen: list[TopicIdPartition] = []
    for topic, ids in sorted(by_name.items()):
        if len(ids) > 1:
            if not any(store.segments(tp) for tps in ids.values() for tp in tps):
                continue  # no incarnation holds tiered data: nothing to read, nothing ambiguous
            live = {
                i: tps
                for i, tps in ids.items()
                if all(store.partition_delete(tp) is None for tp in tps)
            }
            if len(live) > 1:
                live = {i: tps for i, tps in live.items() if any(store.segments(tp) for tp in tps)}
            if len(live) != 1:
                raise SparkOptionError(
                    f"topic {topic!r} has tiered data under several topic ids"
                    f" ({', '.join(sorted(str(i) for i in ids))}); the archive is ambiguous"
                )
            ids = live
        for tps in ids.values():
            chosen += sorted(tps, key=lambda tp: tp.partition)
    return chosen


def build_catalog(options: ReadOptions, reader: S3Reader | None = None) -> Catalog:
    """Read the metadata (topic or manifests) and compute every selected partition's spans."""
    manifests: dict[uuid.UUID, SegmentManifest] = {}
    undecodable = 0
    if options.metadata == "topic":
        from sidecar.spark._metadata_topic import read_metadata_events  # driver only

        events, undecodable = read_metadata_events(
            options.bootstrap_servers or "",
            options.metadata_topic,
            client_options=options.kafka_security.client_options(),
        )
        if undecodable:
            # the query goes on (the daemon skips them too), but not without a word: a lost
            # COPY_SEGMENT_FINISHED ends a partition's archive a segment early
            _log.warning(
                "%d records of the metadata topic %s did not decode and were skipped; the"
                " segments they describe are missing from this read (the sidecar's"
                " metadata_undecodable_records_total counts them too)",
                undecodable,
                options.metadata_topic,
            )
    else:
        events, manifests = _read_manifests(reader or S3Reader(options.s3), options)
    return catalog_from_events(options, events, manifests=manifests, undecodable=undecodable)


def catalog_from_events(
    options: ReadOptions,
    events: Iterable[RemoteLogMetadata],
    *,
    manifests: dict[uuid.UUID, SegmentManifest] | None = None,
    undecodable: int = 0,
) -> Catalog:
    """Apply ``events`` to a temporary store and take the lineage of each selected partition."""
    state_dir = tempfile.mkdtemp(prefix="kafka-tiered-plan-")
    try:
        with RemoteSegmentStore(state_dir) as store:
            store.apply(list(events))
            finished = [RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
            partitions = [
                PartitionSpans(
                    tp,
                    tuple(store.finished_lineage(tp)),
                    tuple(store.segments(tp, states=finished)),
                )
                for tp in _resolve_topics(store, options)
            ]
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    return Catalog(
        [p for p in partitions if p.spans], dict(manifests or {}), undecodable_events=undecodable
    )


def describe(catalog: Catalog) -> str:
    """A one-line JSON summary (no keys, no credentials), for logs and errors."""
    return json.dumps(
        {
            f"{p.tp.topic}-{p.tp.partition}": [p.first_offset, p.end_offset, len(p.spans)]
            for p in catalog.partitions
        }
    )
