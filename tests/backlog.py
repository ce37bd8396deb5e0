"""A backlog of rolled Kafka segments, and tiering it without Kafka: for the upload bandwidth
cap's integration test and its benchmark.

The segments are written by :mod:`sidecar.testing` (a broker's bytes, indexes, snapshots and
epoch checkpoint) with random, incompressible values. :func:`tier_backlog` uploads them with the
daemon's own :class:`~sidecar.tiering.uploader.SegmentUploader` (CRC check, ``.log`` in parts,
indexes, manifest), one task per partition uploading its segments in order, as the engine does
with ``max_concurrent_uploads`` at least the partition count. Metadata events go to a publisher
that only keeps them: no Kafka is needed.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

from sidecar.kafka.logdir import PartitionScan, scan_partition_dir
from sidecar.metadata.events import RemoteLogMetadata
from sidecar.storage.base import ObjectStore
from sidecar.storage.keys import KeyLayout
from sidecar.testing import TestRecord, build_batch, write_partition
from sidecar.tiering.uploader import SegmentUploader

__all__ = ["Backlog", "KeptEvents", "tier_backlog", "write_backlog"]

MiB = 1024 * 1024
#: bytes of one record's value; 16 records make a batch of about 1 MiB
_VALUE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Backlog:
    """The partitions written, and the bytes of their rolled ``.log`` files."""

    scans: list[PartitionScan]
    log_bytes: int


def write_backlog(
    log_dir: Path, *, partitions: int, segments: int, segment_mib: int, topic: str = "backlog"
) -> Backlog:
    """``partitions`` partition directories, each with ``segments`` rolled segments of about
    ``segment_mib`` MiB (and a small active one)."""
    pool = os.urandom(4 * MiB)  # values are slices of it at random offsets: nothing compresses
    starts = random.Random(0)

    def batch() -> bytes:
        records = []
        for _ in range(16):
            start = starts.randrange(len(pool) - _VALUE_BYTES)
            records.append(TestRecord(b"key", pool[start : start + _VALUE_BYTES]))
        return build_batch(records)

    scans = []
    for p in range(partitions):
        rolled = [[batch() for _ in range(segment_mib)] for _ in range(segments)]
        directory = write_partition(
            log_dir, topic, p, [*rolled, [batch()]], topic_id=uuid.UUID(int=p + 1)
        )
        scan = scan_partition_dir(directory)
        assert scan is not None
        scans.append(scan)
    log_bytes = sum(s.size for scan in scans for s in scan.ready_segments)
    return Backlog(scans, log_bytes)


class KeptEvents:
    """A metadata publisher that keeps the events (there is no metadata topic here)."""

    def __init__(self) -> None:
        self.events: list[RemoteLogMetadata] = []

    async def publish_and_wait(self, event: RemoteLogMetadata) -> tuple[int, int]:
        self.events.append(event)
        return 0, len(self.events)


async def tier_backlog(
    objects: ObjectStore,
    backlog: Backlog,
    *,
    prefix: str,
    part_size: int,
    concurrency: int = 2,
) -> int:
    """Upload every rolled segment of the backlog; returns the bytes of the ``.log`` objects
    and indexes written (what the store reports, not what the files hold)."""
    uploader = SegmentUploader(
        objects=objects,
        publisher=KeptEvents(),  # type: ignore[arg-type]
        layout=KeyLayout(prefix=prefix),
        broker_id=1,
        part_size=part_size,
        concurrency=concurrency,
    )

    async def partition(scan: PartitionScan) -> int:
        sent = 0
        for segment in scan.ready_segments:
            outcome = await uploader.upload(scan, segment)
            sent += outcome.log_bytes + outcome.index_bytes
        return sent

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(partition(scan)) for scan in backlog.scans]
    return sum(t.result() for t in tasks)
