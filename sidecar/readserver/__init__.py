"""Reads of tiered data over a local socket: HTTP/1.1 on a Unix domain socket (and optionally
loopback TCP), by offset, by timestamp, raw segment ranges and indexes, through a bounded disk
chunk cache.

* ``app``      the aiohttp application and the :class:`ReadServer` root task
* ``routes``   the v1 HTTP API (``openapi.yaml``): parse, call the service, JSON errors
* ``service``  the read engine: lineage → segment → remote index → batches
* ``cache``    the disk chunk cache and the memory cache of indexes (single flight)
* ``client``   the async Python client
* ``errors``   the read errors, one HTTP status and stable code each
* ``_txn``     isolation levels, aborted-transaction lists, the read_committed filter

Layering: this package sits beside ``tiering`` (``app > readserver > metadata | storage > kafka``);
it never imports ``sidecar.app`` or ``sidecar.tiering``.
"""

from __future__ import annotations

from sidecar.readserver._txn import AbortedTransaction, CommittedFilter, IsolationLevel
from sidecar.readserver.app import ReadServer, build_app, socket_path_for
from sidecar.readserver.cache import ChunkCache, MemoryCache, ObjectRef
from sidecar.readserver.client import ReadClient, RecordBatches, RecordsPage
from sidecar.readserver.errors import (
    AmbiguousTopicError,
    BadRequestError,
    IndexNotFoundError,
    MetadataUnavailableError,
    OffsetOutOfRangeError,
    RangeNotSatisfiableError,
    ReadError,
    RemoteDataError,
    ServerUnreachableError,
    StorageTimeoutError,
    StorageUnavailableError,
    TruncatedResponseError,
    UnknownPartitionError,
    UnknownSegmentError,
    UnknownTopicError,
)
from sidecar.readserver.routes import ReadLimits
from sidecar.readserver.service import ReadService

__all__ = [
    "AbortedTransaction",
    "AmbiguousTopicError",
    "BadRequestError",
    "ChunkCache",
    "CommittedFilter",
    "IndexNotFoundError",
    "IsolationLevel",
    "MemoryCache",
    "MetadataUnavailableError",
    "ObjectRef",
    "OffsetOutOfRangeError",
    "RangeNotSatisfiableError",
    "ReadClient",
    "ReadError",
    "ReadLimits",
    "ReadServer",
    "ReadService",
    "RecordBatches",
    "RecordsPage",
    "RemoteDataError",
    "ServerUnreachableError",
    "StorageTimeoutError",
    "StorageUnavailableError",
    "TruncatedResponseError",
    "UnknownPartitionError",
    "UnknownSegmentError",
    "UnknownTopicError",
    "build_app",
    "socket_path_for",
]
