"""Kafka record batches (magic v2) as they sit in a ``.log`` segment: header parsing, CRC-32C
checks, tail detection, and record decoding for the read path.

Upstream layouts: ``clients/src/main/java/org/apache/kafka/common/record/DefaultRecordBatch.java``,
``DefaultRecord.java``, ``ControlRecordType.java`` and ``CompressionType.java``
(https://github.com/apache/kafka/tree/trunk/clients/src/main/java/org/apache/kafka/common/record).

Pure and synchronous, so Spark executors can import it. It must not import asyncio clients,
aiohttp or aiobotocore, and it never reads a whole segment into memory: files are read batch by
batch and CRCs are computed in 1 MiB chunks. Record decoding uses aiokafka's compiled batch decoder,
imported lazily by :func:`decode_records` only (header walks and CRC checks never import it).
"""

from __future__ import annotations

import enum
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol

import crc32c

from sidecar.errors import CorruptRecordError, MissingToolError, TruncatedFileError
from sidecar.kafka._io import open_with_deleted_fallback, read_at, unreadable

__all__ = [
    "BATCH_HEADER",
    "LOG_OVERHEAD",
    "RECORD_BATCH_OVERHEAD",
    "BatchHeader",
    "Buffer",
    "Compression",
    "ControlRecordType",
    "Record",
    "TimestampType",
    "decode_records",
    "iter_batches",
    "parse_batch_header",
    "read_batch",
]

Buffer = bytes | bytearray | memoryview

#: DefaultRecordBatch header, all integers big-endian; records (or one compressed blob) follow it
BATCH_HEADER = struct.Struct(
    ">"
    "q"  # baseOffset: offset of the first record
    "i"  # batchLength: bytes after this field (batch size - LOG_OVERHEAD)
    "i"  # partitionLeaderEpoch: leader epoch stamped by the broker (outside the CRC)
    "b"  # magic: 2 for this format
    "I"  # crc: CRC-32C (Castagnoli) of bytes [attributes, end of batch)
    "h"  # attributes: codec (bits 0-2), timestampType (3), isTransactional (4), isControl (5),
    #      hasDeleteHorizonMs (6)
    "i"  # lastOffsetDelta: last offset - baseOffset
    "q"  # baseTimestamp: first record's timestamp (the delete horizon when bit 6 is set)
    "q"  # maxTimestamp: largest record timestamp (the log-append time for LogAppendTime)
    "q"  # producerId: -1 when not idempotent
    "h"  # producerEpoch
    "i"  # baseSequence
    "i"  # recordsCount
)
#: baseOffset + batchLength, the prefix every log entry shares (``Records.LOG_OVERHEAD``)
_LOG_HEADER = struct.Struct(">qi")
LOG_OVERHEAD = _LOG_HEADER.size  # 12
RECORD_BATCH_OVERHEAD = BATCH_HEADER.size  # 61
_MAGIC_OFFSET = 16
_CRC_START = 21  # the CRC covers attributes to the end of the batch
_MIN_BATCH_LENGTH = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD
_CURRENT_MAGIC = 2
_CRC_CHUNK = 1024 * 1024

_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_TRANSACTIONAL_MASK = 0x10
_CONTROL_MASK = 0x20
_DELETE_HORIZON_MASK = 0x40

#: control record key: version int16, type int16 (``ControlRecordType.java``)
_CONTROL_KEY = struct.Struct(">hh")


class Compression(enum.IntEnum):
    """Codec ids in attribute bits 0-2 (``CompressionType.java``)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(enum.IntEnum):
    """Attribute bit 3 (``TimestampType.java``); Spark's Kafka source exposes the same ids."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ControlRecordType(enum.IntEnum):
    """The ``type`` in a control record's key (``ControlRecordType.java``); UNKNOWN as in Kafka."""

    UNKNOWN = -1
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


_CONTROL_TYPES = {t.value: t for t in ControlRecordType}
_COMPRESSIONS = tuple(Compression)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """One record batch's header, with where it sits in its file."""

    position: int
    """Byte position of the batch's first byte in the file (or in the buffer's origin frame)."""
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the batch occupies in the file."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def end_position(self) -> int:
        """Byte position just past the batch (where the next one starts)."""
        return self.position + self.size

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> Compression:
        return _COMPRESSIONS[self.attributes & _CODEC_MASK]

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & _TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & _DELETE_HORIZON_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        """The delete horizon the cleaner stamped into ``baseTimestamp``, if any."""
        return self.base_timestamp if self.has_delete_horizon else None


class Record(NamedTuple):
    """One decoded record. A NamedTuple because the read path builds millions of them."""

    offset: int
    timestamp: int
    """Milliseconds; the batch's maxTimestamp for every record of a LogAppendTime batch."""
    timestamp_type: TimestampType
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    control_type: ControlRecordType | None = None
    """Set for the records of a control batch (commit/abort markers and KRaft control records)."""


def parse_batch_header(
    data: Buffer, *, position: int = 0, path: str | None = None, available: int | None = None
) -> BatchHeader:
    """Parse and sanity-check the batch header at the start of ``data``.

    ``position`` is where ``data[0]`` sits in its file, for error messages and
    :attr:`BatchHeader.position`. ``available`` is how many bytes of the file remain from there
    (default ``len(data)``), so a caller can pass just the 61 header bytes of a large batch.
    Raises ``TruncatedFileError`` when fewer bytes remain than the header or the batch needs, and
    ``CorruptRecordError`` for zero padding, a wrong magic, an impossible length or unknown codec.
    """
    view = memoryview(data)
    remaining = len(view) if available is None else available
    if remaining <= 0 or len(view) == 0:
        raise TruncatedFileError(
            "expected a record batch, found end of file", path=path, position=position
        )
    head = view[: min(len(view), LOG_OVERHEAD)]
    if not any(head):
        raise CorruptRecordError(
            f"zero-padded tail ({remaining} bytes from here): "
            "the file is preallocated and not trimmed",
            path=path,
            position=position,
        )
    if remaining <= _MAGIC_OFFSET or len(view) <= _MAGIC_OFFSET:
        raise TruncatedFileError(
            f"file ends inside a record batch header ({remaining} bytes left, "
            f"{RECORD_BATCH_OVERHEAD} needed)",
            path=path,
            position=position,
        )
    magic = view[_MAGIC_OFFSET]
    if magic != _CURRENT_MAGIC:
        raise CorruptRecordError(
            f"record batch has magic {magic}; "
            f"only magic {_CURRENT_MAGIC} (Kafka >= 0.11) is supported",
            path=path,
            position=position,
        )
    _base_offset, batch_length = _LOG_HEADER.unpack_from(view)
    if batch_length < _MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"record batch length {batch_length} is smaller than the minimum {_MIN_BATCH_LENGTH}",
            path=path,
            position=position,
        )
    size = batch_length + LOG_OVERHEAD
    if size > remaining:
        raise TruncatedFileError(
            f"record batch of {size} bytes is cut off: only {remaining} bytes left in the file",
            path=path,
            position=position,
        )
    if len(view) < RECORD_BATCH_OVERHEAD:
        raise TruncatedFileError(
            f"need the {RECORD_BATCH_OVERHEAD}-byte batch header, got {len(view)} bytes",
            path=path,
            position=position,
        )
    header = BatchHeader(position, *BATCH_HEADER.unpack_from(view))
    codec = header.attributes & _CODEC_MASK
    if codec >= len(_COMPRESSIONS):
        raise CorruptRecordError(
            f"record batch has unknown compression codec id {codec}", path=path, position=position
        )
    if header.record_count < 0 or header.last_offset_delta < 0:
        raise CorruptRecordError(
            f"record batch has recordsCount {header.record_count} and lastOffsetDelta "
            f"{header.last_offset_delta}; neither may be negative",
            path=path,
            position=position,
        )
    return header


class _Source:
    """Random access to either a buffer or an open binary file, by absolute file position."""

    __slots__ = ("_fh", "_origin", "_view", "end", "path")

    def __init__(
        self,
        view: memoryview | None,
        fh: BinaryIO | None,
        *,
        origin: int,
        end: int,
        path: str | None,
    ) -> None:
        self._view = view
        self._fh = fh
        self._origin = origin
        self.end = end
        self.path = path

    def read(self, position: int, size: int) -> Buffer:
        size = max(0, min(size, self.end - position))
        if self._view is not None:
            start = position - self._origin
            return self._view[start : start + size]
        if self._fh is None:  # pragma: no cover - one of the two is always set
            raise TypeError("_Source needs a buffer or a file")
        data = read_at(self._fh, position, size, path=self.path or "<file>")
        if len(data) < size:
            raise TruncatedFileError(
                f"file shrank while being read: wanted {size} bytes, got {len(data)}",
                path=self.path,
                position=position + len(data),
            )
        return data

    def crc(self, position: int, size: int) -> int:
        value = 0
        while size > 0:
            chunk = self.read(position, min(size, _CRC_CHUNK))
            value = crc32c.crc32c(chunk, value)
            position += len(chunk)
            size -= len(chunk)
        return int(value)


def iter_batches(
    source: Buffer | BinaryIO | Path,
    *,
    verify_crc: bool = True,
    tolerate_tail: bool = False,
    start: int = 0,
    end: int | None = None,
    path: str | None = None,
    origin: int = 0,
) -> Iterator[BatchHeader]:
    """Walk the batch headers of a ``.log`` segment, a slice of one, or a ranged GET of one.

    ``source`` is a buffer, an open binary file or a path (opened with the ``.deleted`` fallback and
    read only up to its size at open time). ``start``/``end`` bound the walk by absolute position;
    for a buffer, ``origin`` is the file position of its first byte, so headers and errors carry
    file positions. With ``verify_crc`` every batch's CRC-32C is checked (1 MiB at a time).

    A zero-padded tail (a preallocated, untrimmed file) raises ``CorruptRecordError`` and a batch
    cut off by end of file raises ``TruncatedFileError``; with ``tolerate_tail`` (a segment the
    broker may still be appending to) either one just ends the walk, as the broker's reader does.
    """
    if isinstance(source, Path):
        fh, opened = open_with_deleted_fallback(source)
        with fh:
            try:
                size = os.fstat(fh.fileno()).st_size
            except OSError as exc:
                raise unreadable(opened, exc) from exc
            yield from _walk(
                _Source(
                    None,
                    fh,
                    origin=0,
                    end=size if end is None else min(end, size),
                    path=path or str(opened),
                ),
                start=start,
                verify_crc=verify_crc,
                tolerate_tail=tolerate_tail,
            )
        return
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        limit = origin + len(view)
        reader = _Source(
            view, None, origin=origin, end=limit if end is None else min(end, limit), path=path
        )
        yield from _walk(
            reader, start=max(start, origin), verify_crc=verify_crc, tolerate_tail=tolerate_tail
        )
        return
    fh = source
    name = path if path is not None else str(getattr(fh, "name", "<file>"))
    if end is None:
        try:
            end = fh.seek(0, 2)
        except OSError as exc:
            raise unreadable(name, exc) from exc
    yield from _walk(
        _Source(None, fh, origin=0, end=end, path=name),
        start=start,
        verify_crc=verify_crc,
        tolerate_tail=tolerate_tail,
    )


def _walk(
    src: _Source, *, start: int, verify_crc: bool, tolerate_tail: bool
) -> Iterator[BatchHeader]:
    position = start
    while position < src.end:
        remaining = src.end - position
        head = src.read(position, RECORD_BATCH_OVERHEAD)
        try:
            header = parse_batch_header(head, position=position, path=src.path, available=remaining)
        except (TruncatedFileError, CorruptRecordError) as exc:
            if tolerate_tail and _is_tail(exc, head):
                return
            raise
        if verify_crc:
            computed = src.crc(position + _CRC_START, header.size - _CRC_START)
            if computed != header.crc:
                raise CorruptRecordError(
                    f"record batch at offset {header.base_offset} is corrupt: stored crc "
                    f"{header.crc:#010x}, computed crc {computed:#010x}",
                    path=src.path,
                    position=position,
                )
        yield header
        position = header.end_position


def _is_tail(exc: Exception, head: Buffer) -> bool:
    """A zero-padded or cut-off tail, the two shapes an active segment's end can have."""
    return isinstance(exc, TruncatedFileError) or not any(memoryview(head)[:LOG_OVERHEAD])


def read_batch(source: Buffer | BinaryIO, header: BatchHeader, *, origin: int = 0) -> bytes:
    """The bytes of the batch ``header`` describes, from the buffer or file it was read from."""
    if isinstance(source, bytes | bytearray | memoryview):
        start = header.position - origin
        data = bytes(memoryview(source)[start : start + header.size])
    else:
        name = str(getattr(source, "name", "<file>"))
        data = read_at(source, header.position, header.size, path=name)
    if len(data) != header.size:
        raise TruncatedFileError(
            f"record batch of {header.size} bytes is cut off at {len(data)} bytes",
            path=None if isinstance(source, bytes | bytearray | memoryview) else name,
            position=header.position,
        )
    return data


def decode_records(
    batch: Buffer, *, verify_crc: bool = True, path: str | None = None, position: int = 0
) -> list[Record]:
    """Decode every record of one batch (``batch`` starts at the batch; extra bytes are ignored).

    Handles every codec (gzip, snappy with or without the Java client's xerial framing, lz4, zstd),
    control batches (``Record.control_type``), headers and LogAppendTime (every record gets the
    batch's maxTimestamp). ``position`` is the batch's file position, for error messages. Keep
    ``verify_crc`` on for bytes that were not checked already: the compiled decoder trusts lengths.

    Raises ``CorruptRecordError`` for anything undecodable, and ``MissingToolError`` when the codec
    library is missing (snappy, lz4 and zstd need the ``cramjam`` package).
    """
    header = parse_batch_header(batch, position=position, path=path)
    view = memoryview(batch)[: header.size]
    if verify_crc:
        computed = int(crc32c.crc32c(view[_CRC_START:]))
        if computed != header.crc:
            raise CorruptRecordError(
                f"record batch at offset {header.base_offset} is corrupt: stored crc "
                f"{header.crc:#010x}, computed crc {computed:#010x}",
                path=path,
                position=position,
            )
    decoded = _decode_with_aiokafka(bytes(view), header, path=path)
    if not header.is_control:
        return decoded
    return [
        r._replace(control_type=_control_type(r.key, path=path, position=position)) for r in decoded
    ]


def _decode_with_aiokafka(data: bytes, header: BatchHeader, *, path: str | None) -> list[Record]:
    # Imported here so header walks and CRC checks never import aiokafka (see the module docstring).
    from aiokafka.errors import UnsupportedCodecError
    from aiokafka.record.default_records import DefaultRecordBatch

    timestamp_type = header.timestamp_type
    new = tuple.__new__  # skips NamedTuple's Python-level __new__: a third of the per-record cost
    try:
        records: Iterator[_DecodedRecord] = DefaultRecordBatch(data)
        return [
            new(Record, (r.offset, r.timestamp, timestamp_type, r.key, r.value, r.headers, None))
            for r in records
        ]
    except UnsupportedCodecError as exc:
        raise MissingToolError(
            f"cannot decode a {header.compression.name.lower()} record batch: {exc}; "
            "install cramjam (pip install 'aiokafka[snappy,lz4,zstd]')"
        ) from exc
    except Exception as exc:
        # aiokafka raises CorruptRecordException, the codecs raise their own errors (OSError,
        # EOFError, zlib.error, cramjam.DecompressionError), header keys raise UnicodeDecodeError:
        # all mean the same thing here.
        raise CorruptRecordError(
            f"cannot decode record batch at offset {header.base_offset} "
            f"({header.compression.name.lower()}): {type(exc).__name__}: {exc}",
            path=path,
            position=header.position,
        ) from exc


class _DecodedRecord(Protocol):
    """The attributes we use of aiokafka's ``DefaultRecord``."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> list[tuple[str, bytes | None]]: ...


def _control_type(key: bytes | None, *, path: str | None, position: int) -> ControlRecordType:
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptRecordError(
            f"control record key must be at least {_CONTROL_KEY.size} bytes, got "
            f"{'null' if key is None else len(key)}",
            path=path,
            position=position,
        )
    _version, type_id = _CONTROL_KEY.unpack_from(key)
    return _CONTROL_TYPES.get(type_id, ControlRecordType.UNKNOWN)
