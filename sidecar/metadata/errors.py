"""Errors of the remote log metadata package (KIP-405 records on ``__remote_log_metadata``).

They extend the tree in ``sidecar/errors.py``:

* SidecarError
  + FormatError
    - MetadataFormatError         a record value Kafka's serde would not decode, or that we refuse;
                                  carries the byte offset inside the value
  + InvalidMetadataEventError     an event Kafka would reject (also a ValueError), or one that must
                                  never be published (a snapshot, or a state that stops consumers)

This module only defines types; it must not import the rest of the package.
"""

from __future__ import annotations

from sidecar.errors import FormatError, SidecarError

__all__ = ["InvalidMetadataEventError", "MetadataFormatError"]


class MetadataFormatError(FormatError):
    """A metadata record value that cannot be decoded; ``position`` is the offset in the value."""

    #: the offset in the record value where the undecodable item starts
    position: int

    def __init__(self, message: str, *, position: int) -> None:
        super().__init__(f"{message} (metadata record value at byte {position})", position=position)


class InvalidMetadataEventError(SidecarError, ValueError):
    """An event whose fields Kafka's serde rejects, or that must never reach the metadata topic."""
