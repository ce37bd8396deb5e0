"""KIP-405 remote log metadata: events, their ``__remote_log_metadata`` wire format
(byte-identical to Kafka's ``RemoteLogMetadataSerde``), the metadata-topic partitioner, the local
store of remote segments, and the publisher and tailer of the metadata topic.

The events, serde, partitioner and store are pure and synchronous and are imported eagerly. The
publisher and tailer (aiokafka clients) are imported on first access of their names, so that
importing ``sidecar.metadata`` never loads aiokafka (the Spark data source imports the events and
must not). ``sidecar.metadata.strategies`` (Hypothesis strategies, needs the ``test`` extra) is
deliberately not imported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sidecar.metadata.errors import (
    InvalidMetadataEventError,
    MetadataFormatError,
    MetadataNotTrackedError,
    MetadataReadBackTimeoutError,
    MetadataStoreError,
    MetadataTailError,
    MetadataTopicMismatchError,
)
from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    PublishableMetadata,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    SegmentMetadata,
    SegmentMetadataSnapshot,
    SegmentMetadataUpdate,
    TopicIdPartition,
    is_valid_partition_delete_transition,
    is_valid_segment_transition,
)
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.serde import decode, encode
from sidecar.metadata.store import (
    ApplyResult,
    Rejection,
    RejectReason,
    RemoteSegmentStore,
    SegmentSpan,
    StoreCounters,
)

if TYPE_CHECKING:
    from sidecar.metadata.publisher import (
        MetadataPublisher,
        ReadBack,
        client_id,
    )
    from sidecar.metadata.tailer import MetadataTailer, UndecodableCallback

#: names whose module imports aiokafka, loaded on first access
_LAZY = {
    "MetadataPublisher": "sidecar.metadata.publisher",
    "ReadBack": "sidecar.metadata.publisher",
    "client_id": "sidecar.metadata.publisher",
    "MetadataTailer": "sidecar.metadata.tailer",
    "UndecodableCallback": "sidecar.metadata.tailer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ApplyResult",
    "InvalidMetadataEventError",
    "MetadataFormatError",
    "MetadataNotTrackedError",
    "MetadataPublisher",
    "MetadataReadBackTimeoutError",
    "MetadataStoreError",
    "MetadataTailError",
    "MetadataTailer",
    "MetadataTopicMismatchError",
    "PartitionDeleteMetadata",
    "PublishableMetadata",
    "ReadBack",
    "RejectReason",
    "Rejection",
    "RemoteLogMetadata",
    "RemoteLogSegmentId",
    "RemoteLogSegmentState",
    "RemotePartitionDeleteState",
    "RemoteSegmentStore",
    "SegmentMetadata",
    "SegmentMetadataSnapshot",
    "SegmentMetadataUpdate",
    "SegmentSpan",
    "StoreCounters",
    "TopicIdPartition",
    "UndecodableCallback",
    "client_id",
    "decode",
    "encode",
    "is_valid_partition_delete_transition",
    "is_valid_segment_transition",
    "metadata_partition",
]
