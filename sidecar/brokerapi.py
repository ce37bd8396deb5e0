"""The contract between the read server's plugin routes (``sidecar.readserver.rsm``) and the
broker copier (``sidecar.tiering.brokercopy``): the copy request, the copier's interface and its
refusals. A module of its own so the read path never imports tiering; the composition root hands
the copier to the read server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from sidecar.errors import SidecarError
from sidecar.metadata.events import SegmentMetadata

__all__ = [
    "FILE_SUFFIXES",
    "BrokerCopyRequest",
    "BrokerPathError",
    "SegmentCopier",
    "SegmentNotCopyableError",
]

#: the files a copy request names, each with the suffix Kafka gives it
FILE_SUFFIXES: Final = {
    "log": ".log",
    "offset_index": ".index",
    "time_index": ".timeindex",
    "txn_index": ".txnindex",
    "producer_snapshot": ".snapshot",
}


class BrokerPathError(SidecarError):
    """A path in a copy request that maps outside the broker's log dirs, or is not the kind of
    file it is named as."""


class SegmentNotCopyableError(SidecarError):
    """The broker's segment cannot be copied as it is: corrupt, missing or unreadable on the
    sidecar's mount, or not the size the broker's metadata says."""


@dataclass(frozen=True, slots=True)
class BrokerCopyRequest:
    """``copyLogSegmentData``: the segment's metadata and its files as the broker names them
    (keys of :data:`FILE_SUFFIXES`; ``txn_index`` may be None), and the leader-epoch checkpoint
    the broker built in memory."""

    metadata: SegmentMetadata
    files: Mapping[str, Path | None]
    leader_epoch_index: bytes


class SegmentCopier(Protocol):
    """Copies and deletes segments on the broker's request; publishes no metadata event."""

    async def copy(self, request: BrokerCopyRequest) -> int:
        """Upload the segment's objects; returns the bytes of its ``.log``."""
        ...

    async def delete(self, metadata: SegmentMetadata) -> None:
        """Delete every object of the segment; idempotent."""
        ...
