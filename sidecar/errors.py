"""The sidecar's exception tree. Every error we raise is one of these; third-party errors are
translated at the boundary with ``raise X(...) from exc``.

The type carries the retry policy (``retriable``); workers decide from the type, never from text.

* SidecarError
  + ConfigError                  the configuration is invalid (exit code 2)
    - CacheDirInUseError         another process uses the read cache's directory
  + MissingToolError             a required tool (java, mvn, weed) is missing or unusable
  + CommandError                 a CLI command cannot do what was asked (exit code 1)
  + FormatError                  a log-dir file we cannot parse (carries the path and byte position)
    - CorruptRecordError         a record batch with a bad CRC, bad magic or impossible length
    - TruncatedFileError         a file ends in the middle of a structure
    - IndexFormatError           an offset/time/txn index entry that is malformed or out of range
    - SnapshotFormatError        a producer snapshot with a bad version or CRC
    - CheckpointFormatError      a leader-epoch-checkpoint, partition.metadata or meta.properties
    - UnreadableFileError (R)    a file that exists but cannot be opened or read (permissions, EIO)
  + SegmentVanishedError         a segment disappeared (deleted by the broker) while we read it
  + StorageError (R)             an object-store call failed
    - KeyNotFoundError           the key does not exist (not retriable)
    - InvalidRangeError          the byte range is outside the object (not retriable)
    - ChecksumMismatchError      the store rejected or returned data whose checksum did not match
      . ChecksumNotEchoedError   the store did not echo an upload's checksum and that is refused
    - StorageAccessError         credentials refused, access denied, no bucket (not retriable)
    - ObjectTooLargeError        a whole-object GET of more bytes than the caller takes (not R)
  + MetadataPublishError (R)     publishing to the remote log metadata topic failed
  + StackError                   the local development stack could not be started or stopped
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "CacheDirInUseError",
    "CheckpointFormatError",
    "ChecksumMismatchError",
    "ChecksumNotEchoedError",
    "CommandError",
    "ConfigError",
    "CorruptRecordError",
    "FormatError",
    "IndexFormatError",
    "InvalidRangeError",
    "KeyNotFoundError",
    "MetadataPublishError",
    "MissingToolError",
    "ObjectTooLargeError",
    "SegmentVanishedError",
    "SidecarError",
    "SnapshotFormatError",
    "StackError",
    "StorageAccessError",
    "StorageError",
    "TruncatedFileError",
    "UnreadableFileError",
]


class SidecarError(Exception):
    """Base of every error the sidecar raises."""

    retriable: ClassVar[bool] = False
    #: process exit code when this error ends a CLI command
    exit_code: ClassVar[int] = 1


class ConfigError(SidecarError):
    """The configuration is invalid: unknown key, wrong type, or an impossible combination."""

    exit_code: ClassVar[int] = 2


class CacheDirInUseError(ConfigError):
    """Another process (a second sidecar or read server) holds the lock of the chunk cache's
    directory: two caches in one directory would evict each other's files."""


class MissingToolError(SidecarError):
    """A tool the command needs (java, mvn, weed) is missing; the message says what to install."""

    exit_code: ClassVar[int] = 3


class CommandError(SidecarError):
    """A one-shot command cannot do what was asked: Kafka unreachable, a partition that does not
    exist, a refused confirmation. The message says what, where and what to do."""


class FormatError(SidecarError):
    """A file in a broker log dir that we cannot parse.

    Carries the file and the byte position, so an operator can look at the bytes.
    """

    def __init__(self, message: str, *, path: str | None = None, position: int | None = None):
        where = ""
        if path is not None:
            where = f" ({path}" + (f" at byte {position}" if position is not None else "") + ")"
        super().__init__(message + where)
        self.path = path
        self.position = position


class CorruptRecordError(FormatError):
    """A record batch whose CRC, magic or length is wrong."""


class TruncatedFileError(FormatError):
    """A file ends in the middle of a structure."""


class IndexFormatError(FormatError):
    """An index entry that is malformed or points outside its segment."""


class SnapshotFormatError(FormatError):
    """A producer-state snapshot with an unknown version or a bad CRC."""


class CheckpointFormatError(FormatError):
    """A leader-epoch-checkpoint, partition.metadata or meta.properties we cannot parse."""


class UnreadableFileError(FormatError):
    """A log-dir file that exists but cannot be opened or read: permissions, a directory where a
    file should be, or an I/O error. An operator problem rather than corrupt bytes: retriable
    (a disk may answer the next read), and never a reason to quarantine a segment.

    ``errno`` is the ``OSError``'s number when there was one (``errno.EIO``, ``errno.EACCES``).
    """

    retriable: ClassVar[bool] = True

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        position: int | None = None,
        errno: int | None = None,
    ):
        super().__init__(message, path=path, position=position)
        self.errno = errno


class SegmentVanishedError(SidecarError):
    """The broker deleted a segment (and its ``.deleted`` twin) while we were reading it."""


class StorageError(SidecarError):
    """An object-store call failed; worth retrying unless a subclass says otherwise."""

    retriable: ClassVar[bool] = True


class KeyNotFoundError(StorageError):
    """The object does not exist."""

    retriable: ClassVar[bool] = False


class InvalidRangeError(StorageError):
    """The requested byte range is outside the object."""

    retriable: ClassVar[bool] = False


class ChecksumMismatchError(StorageError):
    """The store rejected our checksum, or returned bytes whose checksum does not match."""


class ChecksumNotEchoedError(ChecksumMismatchError):
    """The store stored an upload without echoing its CRC-32C, and ``s3.checksum_echo`` is
    ``refuse``: a store that does not echo will not on a retry either (not retriable)."""

    retriable: ClassVar[bool] = False


class ConditionalWriteUnsupportedError(StorageError):
    """The store does not implement a conditional write (``If-None-Match: *``): the caller
    falls back to a plain write (not retriable: it will not learn on a retry)."""

    retriable: ClassVar[bool] = False


class StorageAccessError(StorageError):
    """The store refused our credentials or permissions, or the bucket does not exist.

    Retrying at once cannot help; the worker backs off for long and readiness turns false.
    """

    retriable: ClassVar[bool] = False


class ObjectTooLargeError(StorageError):
    """A whole-object GET found more bytes than the caller's limit (a manifest, a marker: a few
    KB when the sidecar wrote them); refused before the body is read, so an object someone
    else put at such a key cannot fill memory (not retriable: it is as large next time)."""

    retriable: ClassVar[bool] = False


class MetadataPublishError(SidecarError):
    """Publishing to the remote log metadata topic failed."""

    retriable: ClassVar[bool] = True


class StackError(SidecarError):
    """The local development stack (Kafka, SeaweedFS) could not be started or stopped."""
