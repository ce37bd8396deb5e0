"""KIP-405 remote log metadata: events, their ``__remote_log_metadata`` wire format
(byte-identical to Kafka's ``RemoteLogMetadataSerde``) and the metadata-topic partitioner.

Everything here is pure and synchronous. ``sidecar.metadata.strategies`` (Hypothesis strategies,
needs the ``test`` extra) is deliberately not imported here.
"""

from sidecar.metadata.errors import InvalidMetadataEventError, MetadataFormatError
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

__all__ = [
    "InvalidMetadataEventError",
    "MetadataFormatError",
    "PartitionDeleteMetadata",
    "PublishableMetadata",
    "RemoteLogMetadata",
    "RemoteLogSegmentId",
    "RemoteLogSegmentState",
    "RemotePartitionDeleteState",
    "SegmentMetadata",
    "SegmentMetadataSnapshot",
    "SegmentMetadataUpdate",
    "TopicIdPartition",
    "decode",
    "encode",
    "is_valid_partition_delete_transition",
    "is_valid_segment_transition",
    "metadata_partition",
]
