"""Fake tiered data for read-path tests: a real RemoteSegmentStore, the MemoryObjectStore, and
segments written the way the uploader writes them (the .log, the packed indexes object, the
manifest) with their COPY_SEGMENT_STARTED/FINISHED events applied; and the batch builders."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.kafka.checkpoints import (
    EpochEntry,
    ProducerSnapshotEntry,
    format_leader_epoch_checkpoint,
    format_producer_snapshot,
)
from sidecar.kafka.indexes import AbortedTxn
from sidecar.kafka.logdir import FileKind, segment_file_name
from sidecar.kafka.records import (
    BatchHeader,
    Compression,
    ControlRecordType,
    Record,
    decode_batches,
    iter_batches,
    parse_batch_header,
    read_batch,
)
from sidecar.metadata.events import (
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.readserver.cache import ChunkCache, MemoryCache
from sidecar.readserver.service import ReadService
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.manifest import IndexKind, ObjectEntry, SegmentManifest, pack_indexes
from sidecar.storage.memory import MemoryObjectStore
from sidecar.testing import (
    TestRecord,
    build_batch,
    build_control_batch,
    rebase_batch,
    write_segment,
)

TOPIC_ID = uuid.UUID(int=0x5EED_0000_0000_0000_0000_0000_0000_0001)
TP = TopicIdPartition(TOPIC_ID, "orders", 0)
LAYOUT = KeyLayout(prefix="test/")


@dataclass
class Remote:
    """What the tests tiered: the store, the objects, and the records per segment."""

    store: RemoteSegmentStore
    objects: MemoryObjectStore  # or any ObjectStore (the integration tests use S3)
    files: Path
    segments: list[SegmentMetadata] = field(default_factory=list)
    logs: dict[uuid.UUID, bytes] = field(default_factory=dict)
    layout: KeyLayout = LAYOUT

    async def upload(
        self,
        base_offset: int,
        batches: Sequence[bytes],
        *,
        tp: TopicIdPartition = TP,
        aborted: Sequence[AbortedTxn] = (),
        finish: bool = True,
        manifest: bool = True,
        segment_id: uuid.UUID | None = None,
        keep_offsets: bool = False,
        snapshot: bytes | None = None,
    ) -> SegmentMetadata:
        """Tier one segment of ``batches`` (re-based to consecutive offsets from
        ``base_offset`` unless ``keep_offsets``) and return its metadata. Its producer
        snapshot is the state after the batches of ``tp``'s segments tiered below it and its
        own (:func:`producer_snapshot`), unless ``snapshot`` gives the bytes."""
        sid = segment_id or uuid.uuid4()
        directory = self.files / f"{sid}"
        if keep_offsets:
            rebased = list(batches)
        else:
            rebased = []
            offset = base_offset
            for raw in batches:
                batch = rebase_batch(raw, offset)
                rebased.append(batch)
                offset = parse_batch_header(batch).next_offset
        next_offset, max_ts = write_segment(directory, base_offset, rebased, aborted=aborted)
        log = (directory / segment_file_name(base_offset, FileKind.LOG)).read_bytes()
        epochs: list[tuple[int, int]] = []
        for raw in rebased:
            header = parse_batch_header(raw)
            if not epochs or epochs[-1][0] != header.partition_leader_epoch:
                epochs.append((header.partition_leader_epoch, header.base_offset))
        txn = directory / segment_file_name(base_offset, FileKind.TXNINDEX)
        files = {
            IndexKind.OFFSET_INDEX: (
                directory / segment_file_name(base_offset, FileKind.INDEX)
            ).read_bytes(),
            IndexKind.TIME_INDEX: (
                directory / segment_file_name(base_offset, FileKind.TIMEINDEX)
            ).read_bytes(),
            IndexKind.TXN_INDEX: txn.read_bytes() if txn.exists() else None,
            IndexKind.PRODUCER_SNAPSHOT: (
                self._snapshot(tp, base_offset, rebased) if snapshot is None else snapshot
            ),
            IndexKind.LEADER_EPOCH_CHECKPOINT: format_leader_epoch_checkpoint(
                EpochEntry(e, o) for e, o in epochs
            ),
        }
        metadata = SegmentMetadata(
            segment_id=RemoteLogSegmentId(tp, sid),
            start_offset=base_offset,
            end_offset=next_offset - 1,
            broker_id=1,
            max_timestamp_ms=max_ts,
            event_timestamp_ms=1,
            segment_leader_epochs=tuple(epochs),
            segment_size_in_bytes=len(log),
            txn_index_empty=not aborted,
        )
        keys = {
            suffix: self.layout.segment_key(
                topic=tp.topic,
                topic_id=tp.topic_id,
                partition=tp.partition,
                base_offset=base_offset,
                segment_id=sid,
                suffix=suffix,
            )
            for suffix in ObjectSuffix
        }
        blob, ranges = pack_indexes(files)
        log_crc = (await self.objects.put(keys[ObjectSuffix.LOG], log)).crc32c or 0
        blob_crc = (await self.objects.put(keys[ObjectSuffix.INDEXES], blob)).crc32c or 0
        if manifest:
            document = SegmentManifest(
                topic=tp.topic,
                topic_id=tp.topic_id,
                partition=tp.partition,
                segment_id=sid,
                start_offset=base_offset,
                end_offset=next_offset - 1,
                max_timestamp_ms=max_ts,
                size_bytes=len(log),
                leader_epochs=tuple(epochs),
                txn_index_empty=not aborted,
                broker_id=1,
                event_timestamp_ms=1,
                log=ObjectEntry(keys[ObjectSuffix.LOG], len(log), log_crc),
                indexes=ObjectEntry(keys[ObjectSuffix.INDEXES], len(blob), blob_crc, ranges),
            )
            await self.objects.put(keys[ObjectSuffix.MANIFEST], document.to_json())
        events: list[SegmentMetadata | SegmentMetadataUpdate] = [metadata]
        if finish:
            events.append(
                SegmentMetadataUpdate(
                    segment_id=metadata.segment_id,
                    broker_id=1,
                    event_timestamp_ms=2,
                    state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                )
            )
        result = self.store.apply(events)
        assert not result.rejected, result.rejected
        self.segments.append(metadata)
        self.logs[sid] = log
        return metadata

    def _snapshot(self, tp: TopicIdPartition, base_offset: int, batches: Sequence[bytes]) -> bytes:
        below = sorted(
            (
                s
                for s in self.segments
                if s.segment_id.topic_id_partition == tp and s.end_offset < base_offset
            ),
            key=lambda s: s.start_offset,
        )
        headers = [h for s in below for h in iter_batches(self.logs[s.segment_id.id])]
        return producer_snapshot([*headers, *map(parse_batch_header, batches)])

    def delete(self, metadata: SegmentMetadata) -> None:
        """Delete a tiered segment as Kafka's retention does: DELETE_SEGMENT_STARTED, then
        FINISHED (its objects are left: the store no longer names them)."""
        result = self.store.apply(
            [
                SegmentMetadataUpdate(
                    segment_id=metadata.segment_id,
                    broker_id=1,
                    event_timestamp_ms=3,
                    state=state,
                )
                for state in (
                    RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
                    RemoteLogSegmentState.DELETE_SEGMENT_FINISHED,
                )
            ]
        )
        assert not result.rejected, result.rejected


def producer_snapshot(headers: Sequence[BatchHeader]) -> bytes:
    """The producer snapshot a broker writes after ``headers``' batches: one entry per
    producer, with the first offset of its transaction still open (no marker yet), or -1."""
    last: dict[int, BatchHeader] = {}
    open_at: dict[int, int] = {}
    for header in headers:
        pid = header.producer_id
        if pid < 0:
            continue
        last[pid] = header
        if header.is_control:
            open_at.pop(pid, None)
        elif header.is_transactional:
            open_at.setdefault(pid, header.base_offset)
    return format_producer_snapshot(
        [
            ProducerSnapshotEntry(
                producer_id=pid,
                epoch=h.producer_epoch,
                last_sequence=h.base_sequence + h.last_offset_delta,
                last_offset=h.last_offset,
                offset_delta=h.last_offset_delta,
                timestamp=h.max_timestamp,
                coordinator_epoch=0,
                current_txn_first_offset=open_at.get(pid, -1),
            )
            for pid, h in sorted(last.items())
        ]
    )


def records_of(log: bytes) -> list[Record]:
    """Every data record of a .log (control batches skipped), as the broker wrote them."""
    return [r for header, rs in decode_batches(log) if not header.is_control for r in rs]


def batches_of(log: bytes) -> list[bytes]:
    """The record batches of a .log, one bytes object each."""
    return [read_batch(log, header) for header in iter_batches(log)]


BASE_TS = 1_700_000_000_000


def data_batches(
    first: int,
    count: int,
    *,
    per_batch: int = 5,
    codec: Compression = Compression.NONE,
    epoch: int = 0,
    value_size: int = 300,
    tag: bytes = b"",
) -> list[bytes]:
    """``count`` batches of ``per_batch`` records numbered from ``first`` (keys, values with a
    tag, one header, increasing timestamps)."""
    out = []
    for b in range(count):
        n0 = first + b * per_batch
        records = [
            TestRecord(
                key=f"key-{n}".encode(),
                value=tag + f"{n:08d}".encode() * (value_size // 8),
                headers=[("n", str(n).encode()), ("null", None)],
                timestamp=BASE_TS + 10 * n,
            )
            for n in range(n0, n0 + per_batch)
        ]
        out.append(build_batch(records, compression=codec, leader_epoch=epoch))
    return out


async def three_segments(remote: Remote) -> list[Record]:
    """Three segments (none, gzip, zstd; 60 records each), the middle one with a transaction
    that commits and one that aborts. Returns every data record, in offset order."""
    await remote.upload(0, data_batches(0, 12))
    txn = [
        *data_batches(60, 4, codec=Compression.GZIP),
        build_batch(
            [TestRecord(b"t", b"committed", timestamp=BASE_TS + 900)],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        ),
        build_control_batch(ControlRecordType.COMMIT, producer_id=7, timestamp=BASE_TS + 901),
        build_batch(
            [TestRecord(b"t", b"aborted", timestamp=BASE_TS + 902)],
            producer_id=8,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        ),
        build_control_batch(ControlRecordType.ABORT, producer_id=8, timestamp=BASE_TS + 903),
        *data_batches(84, 7, codec=Compression.GZIP),
    ]
    await remote.upload(60, txn, aborted=[AbortedTxn(0, 8, 82, 83, 82)])
    end = remote.segments[-1].end_offset + 1
    await remote.upload(end, data_batches(end, 12, codec=Compression.ZSTD))
    return [r for log in remote.logs.values() for r in records_of(log)]


def read_service(remote: Remote, chunks: ChunkCache) -> ReadService:
    """The read engine over ``remote`` and ``chunks`` (no broker log dirs: the lineage is
    derived; responses of any size planned once verified, as the data here is small)."""
    return ReadService(
        store=remote.store,
        objects=remote.objects,
        layout=LAYOUT,
        chunks=chunks,
        indexes=MemoryCache(max_weight=1024 * 1024),
        lineage_ttl_s=0.0,
        plan_min_bytes=0,
    )
