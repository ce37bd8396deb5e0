"""The read path's errors: each one is an HTTP status, a stable machine-readable ``code`` and a
human message, sent as ``{"code": ..., "message": ..., **details}``. The same classes are raised
by the client when the server answers with an error, so callers handle one tree on both sides.

* ReadError (a :class:`~sidecar.errors.SidecarError`)                  status  code
  + BadRequestError            a malformed path, query or parameter       400  bad_request
  + UnknownTopicError          no tiered data for that topic name/id     404  unknown_topic
  + UnknownPartitionError      the topic has no such tiered partition    404  unknown_partition
  + UnknownSegmentError        no readable (COPY_SEGMENT_FINISHED) segment with that id
                                                                          404  unknown_segment
  + IndexNotFoundError         the segment has no such index (fetchIndex's
                               RemoteResourceNotFoundException)         404  index_not_found
  + AmbiguousTopicError        one name, several live topic ids          409  ambiguous_topic
  + OffsetOutOfRangeError      an offset outside the tiered range        416  offset_out_of_range
  + RangeNotSatisfiableError   a byte range outside the object           416  range_not_satisfiable
  + RemoteDataError            S3 returned bytes that fail their CRC or do not parse, or an
                               object the metadata promises is missing  502  remote_data_invalid
  + StorageUnavailableError (R) S3 failed                                503  storage_unavailable
  + MetadataUnavailableError (R) the local metadata store failed          503  metadata_unavailable
  + StorageTimeoutError (R)    an S3 call passed its deadline            504  storage_timeout

The plugin's routes (``/v1/rsm/...``, :mod:`sidecar.readserver.rsm`) add:

  + RemoteObjectNotFoundError  an object of the segment is not in the bucket
                               (RemoteResourceNotFoundException)        404  remote_object_not_found
  + SegmentNotCopyableError    the broker's segment is corrupt, missing on the sidecar's mount
                               or not the size its metadata says         422  segment_not_copyable
  + CopyInterruptedError (R)   the copy failed in a way worth retrying   503  copy_interrupted
  + BrokerCopyUnavailableError (R) this server does no copies            503  copy_unavailable

The client adds two of its own: ``ServerUnreachableError`` (``unreachable``: no server at the
socket or URL) and ``TruncatedResponseError`` (``truncated_response``: the server closed the
connection mid-body, its sign of a failure after the status line).

Limits enforced before routing have their own codes (``sidecar.readserver.routes``): 400
``unsupported_protocol`` (a plugin request of a protocol version this server does not speak), 404
``not_found`` (no such path), 405 ``method_not_allowed``, 413 ``request_too_large``, 414
``uri_too_long``, 429 ``too_many_requests``, 431 ``headers_too_large``; 500 ``internal_error`` is
the last resort. No I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.errors import SidecarError

__all__ = [
    "AmbiguousTopicError",
    "BadRequestError",
    "BrokerCopyUnavailableError",
    "CopyInterruptedError",
    "IndexNotFoundError",
    "MetadataUnavailableError",
    "OffsetOutOfRangeError",
    "RangeNotSatisfiableError",
    "ReadError",
    "RemoteDataError",
    "RemoteObjectNotFoundError",
    "SegmentNotCopyableError",
    "ServerUnreachableError",
    "StorageTimeoutError",
    "StorageUnavailableError",
    "TruncatedResponseError",
    "UnknownPartitionError",
    "UnknownSegmentError",
    "UnknownTopicError",
    "error_for",
]


class ReadError(SidecarError):
    """A read request that cannot be served: an HTTP status, a stable code and details."""

    #: the HTTP status (class default; the client keeps what the server sent)
    status: int = 500
    #: the stable, machine-readable code of the JSON body
    code: str = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        #: extra JSON fields of the error body (e.g. the available offset range)
        self.details: dict[str, Any] = details

    def to_json(self) -> dict[str, Any]:
        """The error body: code, message and the details."""
        return {"code": self.code, "message": self.message, **self.details}


class BadRequestError(ReadError):
    """A malformed path, query or parameter value."""

    status = 400
    code = "bad_request"


class UnknownTopicError(ReadError):
    """The metadata store knows no tiered partition of that topic."""

    status = 404
    code = "unknown_topic"


class UnknownPartitionError(ReadError):
    """The topic is known but has no such tiered partition."""

    status = 404
    code = "unknown_partition"


class UnknownSegmentError(ReadError):
    """No COPY_SEGMENT_FINISHED segment of the partition has that id."""

    status = 404
    code = "unknown_segment"


class IndexNotFoundError(ReadError):
    """The segment has no index of that type (an absent transaction index, as in fetchIndex)."""

    status = 404
    code = "index_not_found"


class AmbiguousTopicError(ReadError):
    """A topic name that maps to several live topic ids; pass ``topic_id``."""

    status = 409
    code = "ambiguous_topic"


class OffsetOutOfRangeError(ReadError):
    """The offset is outside the tiered range (given in the body as ``available``)."""

    status = 416
    code = "offset_out_of_range"


class RangeNotSatisfiableError(ReadError):
    """The byte range starts past the object's end or is empty (the body gives ``size``)."""

    status = 416
    code = "range_not_satisfiable"


class RemoteDataError(ReadError):
    """Remote bytes that fail their CRC-32C or do not parse, or a missing object: never served."""

    status = 502
    code = "remote_data_invalid"


class StorageUnavailableError(ReadError):
    """The object store failed; another attempt may succeed."""

    retriable = True
    status = 503
    code = "storage_unavailable"


class MetadataUnavailableError(ReadError):
    """The local metadata store failed."""

    retriable = True
    status = 503
    code = "metadata_unavailable"


class StorageTimeoutError(ReadError):
    """An object-store call did not finish within its deadline."""

    retriable = True
    status = 504
    code = "storage_timeout"


class ServerUnreachableError(ReadError):
    """(client) No read server answers at the socket or URL."""

    retriable = True
    status = 0
    code = "unreachable"


class TruncatedResponseError(ReadError):
    """(client) The server closed the connection before the body was complete."""

    retriable = True
    status = 0
    code = "truncated_response"


class RemoteObjectNotFoundError(ReadError):
    """An object of a segment the broker asked for is not in the bucket."""

    status = 404
    code = "remote_object_not_found"


class SegmentNotCopyableError(ReadError):
    """The broker's segment cannot be copied: corrupt, missing on the sidecar's mount, or not the
    size its metadata says. Not worth retrying as is."""

    status = 422
    code = "segment_not_copyable"


class CopyInterruptedError(ReadError):
    """A copy failed in a way worth retrying (the ``.log`` changed during the upload)."""

    status = 503
    code = "copy_interrupted"


class BrokerCopyUnavailableError(ReadError):
    """This read server was started without the broker copier."""

    status = 503
    code = "copy_unavailable"


_BY_CODE: dict[str, type[ReadError]] = {
    cls.code: cls
    for cls in (
        BadRequestError,
        UnknownTopicError,
        UnknownPartitionError,
        UnknownSegmentError,
        IndexNotFoundError,
        AmbiguousTopicError,
        OffsetOutOfRangeError,
        RangeNotSatisfiableError,
        RemoteDataError,
        StorageUnavailableError,
        MetadataUnavailableError,
        StorageTimeoutError,
        RemoteObjectNotFoundError,
        SegmentNotCopyableError,
        CopyInterruptedError,
        BrokerCopyUnavailableError,
    )
}


def error_for(status: int, body: Mapping[str, Any] | None) -> ReadError:
    """The error a server answer stands for (the client's side of :meth:`ReadError.to_json`)."""
    body = body or {}
    code = str(body.get("code", ""))
    message = str(body.get("message", "")) or f"the read server answered HTTP {status}"
    details = {k: v for k, v in body.items() if k not in {"code", "message"}}
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message, **details)
    error = ReadError(message, **details)
    # an error without its own class (limits, routing): keep what the server said
    error.status = status
    error.code = code or "http_error"
    return error
