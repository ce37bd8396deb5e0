"""Errors of the remote log metadata package (KIP-405 records on ``__remote_log_metadata``).

They extend the tree in ``sidecar/errors.py`` (R = retriable):

* SidecarError
  + ConfigError
    - MetadataTopicMismatchError  the existing metadata topic has another partition count than
                                  the configured one (Kafka's TBRLMM refuses to start too)
  + FormatError
    - MetadataFormatError         a record value Kafka's serde would not decode, or that we refuse;
                                  carries the byte offset inside the value
  + InvalidMetadataEventError     an event Kafka would reject (also a ValueError), or one that must
                                  never be published (a snapshot, or a state that stops consumers)
  + MetadataPublishError (R)
    - MetadataReadBackTimeoutError (R)  published, but not read back by the tailer in time
    - MetadataNotTrackedError     the tailer does not read the event's metadata partition, so the
                                  write could never be confirmed (not retriable)
  + MetadataStoreError            the local metadata store is unusable (closed, unknown schema,
                                  corrupt file, or bound to another metadata topic)
  + MetadataTailError (R)         reading the metadata topic failed

This module only defines types; it must not import the rest of the package.
"""

from __future__ import annotations

from typing import ClassVar

from sidecar.errors import (
    ConfigError,
    FormatError,
    MetadataPublishError,
    SidecarError,
)

__all__ = [
    "InvalidMetadataEventError",
    "MetadataFormatError",
    "MetadataNotTrackedError",
    "MetadataReadBackTimeoutError",
    "MetadataStoreError",
    "MetadataTailError",
    "MetadataTopicMismatchError",
]


class MetadataFormatError(FormatError):
    """A metadata record value that cannot be decoded; ``position`` is the offset in the value."""

    #: the offset in the record value where the undecodable item starts
    position: int

    def __init__(self, message: str, *, position: int) -> None:
        super().__init__(f"{message} (metadata record value at byte {position})", position=position)


class InvalidMetadataEventError(SidecarError, ValueError):
    """An event whose fields Kafka's serde rejects, or that must never reach the metadata topic."""


class MetadataTopicMismatchError(ConfigError):
    """The metadata topic exists with another partition count than configured.

    The partition count is part of the format: every event's metadata partition is computed from
    it, so brokers and sidecars must agree on it (``remote.log.metadata.topic.num.partitions``).
    """


class MetadataReadBackTimeoutError(MetadataPublishError):
    """An event was acknowledged by Kafka but the tailer did not read it back in time."""


class MetadataNotTrackedError(MetadataPublishError):
    """The tailer does not read the metadata partition an event goes to, so its read-back can
    never be confirmed; track the partition first."""

    retriable: ClassVar[bool] = False


class MetadataStoreError(SidecarError):
    """The local metadata store cannot be used: closed, corrupt, or of an unknown schema."""


class MetadataTailError(SidecarError):
    """Reading the remote log metadata topic failed (the broker or the network)."""

    retriable: ClassVar[bool] = True
