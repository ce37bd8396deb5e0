"""Kafka record batches (magic v2) as they sit in a ``.log`` segment: header parsing, CRC-32C
checks, tail detection, and record decoding for the read path.

Upstream layouts: ``clients/src/main/java/org/apache/kafka/common/record/DefaultRecordBatch.java``,
``DefaultRecord.java``, ``ControlRecordType.java`` and ``CompressionType.java``
(https://github.com/apache/kafka/tree/trunk/clients/src/main/java/org/apache/kafka/common/record).

Pure and synchronous, so Spark executors can import it. It must not import asyncio clients,
aiohttp or aiobotocore, and it never reads a whole segment into memory: files are read through one
window of at most 1 MiB (a bigger batch is CRC-checked 1 MiB at a time). Record decoding uses
aiokafka's compiled batch decoder, imported lazily by :func:`decode_records` and
:func:`decode_batches` only (header walks and CRC checks never import it).

Hot paths: a batch header is one ``struct`` unpack into a NamedTuple, CRCs run over memoryview
slices (no copies), and :func:`decode_batches` checks each CRC once and feeds the same bytes to the
compiled decoder.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol

import crc32c

from sidecar.errors import CorruptRecordError, MissingToolError, TruncatedFileError
from sidecar.kafka._codecs import MAX_DECOMPRESSED_BATCH_BYTES, inflate
from sidecar.kafka._io import open_with_deleted_fallback, read_at, unreadable
from sidecar.kafka._lenient import walk_records

__all__ = [
    "BATCH_HEADER",
    "LOG_OVERHEAD",
    "MAX_DECOMPRESSED_BATCH_BYTES",
    "RECORD_BATCH_OVERHEAD",
    "BatchHeader",
    "Buffer",
    "Compression",
    "ControlRecordType",
    "Record",
    "TimestampType",
    "decode_batches",
    "decode_records",
    "iter_batches",
    "parse_batch_header",
    "prepare_decoder",
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
_TIMESTAMP_TYPES = (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME)


class BatchHeader(NamedTuple):
    """One record batch's header, with where it sits in its file.

    A NamedTuple (immutable, hashable) because a segment walk builds one per batch: it is created
    straight from the ``struct`` unpack, 5x cheaper than a frozen dataclass.
    """

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
        return _TIMESTAMP_TYPES[(self.attributes & _TIMESTAMP_TYPE_MASK) >> 3]

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
    length = data.nbytes if isinstance(data, memoryview) else len(data)
    remaining = length if available is None else available
    if length >= RECORD_BATCH_OVERHEAD and remaining >= RECORD_BATCH_OVERHEAD:
        # Fast path: one unpack, and every check passes. Anything else is re-examined below, in
        # the order that picks the most telling error.
        fields = _unpack_header(data)
        if (
            fields[3] == _CURRENT_MAGIC
            and _MIN_BATCH_LENGTH <= fields[1] <= remaining - LOG_OVERHEAD
            and fields[5] & _CODEC_MASK < _CODEC_COUNT
            and fields[12] >= 0  # recordsCount
            and fields[6] >= 0  # lastOffsetDelta
        ):
            return _new_header(BatchHeader, (position, *fields))
    return _parse_batch_header_checked(data, position=position, path=path, remaining=remaining)


def _parse_batch_header_checked(
    data: Buffer, *, position: int, path: str | None, remaining: int
) -> BatchHeader:
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
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
    header = _new_header(BatchHeader, (position, *_unpack_header(view)))
    codec = header.attributes & _CODEC_MASK
    if codec >= _CODEC_COUNT:
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


_unpack_header = BATCH_HEADER.unpack_from
_new_header = tuple.__new__  # BatchHeader(...) without NamedTuple's Python-level __new__
_CODEC_COUNT = len(_COMPRESSIONS)


class _Source:
    """Random access to either a buffer or an open binary file, by absolute file position.

    A file is read through one window of up to ``_CRC_CHUNK`` bytes, so a walk over small batches
    costs one ``read`` per MiB rather than two per batch. What :meth:`read` returns is only valid
    until the next call (it may be a view of the window).
    """

    __slots__ = (
        "_fh",
        "_origin",
        "_scratch",
        "_view",
        "_window",
        "_window_start",
        "end",
        "on_read",
        "path",
    )

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
        self._window = memoryview(b"")
        self._window_start = 0
        self._scratch: bytearray | None = None
        self.end = end
        self.path = path
        #: called with (file position, bytes) for every window read from a file
        self.on_read: Callable[[int, Buffer], None] | None = None

    def reuse_window(self) -> None:
        """Read every window into one buffer, overwritten by the next read: for walks whose
        caller keeps nothing the source returned (a fresh 1 MiB ``bytes`` per window costs page
        faults and zeroing that dominate a CRC walk)."""
        if self._fh is not None:
            self._scratch = bytearray(_CRC_CHUNK)

    def read(self, position: int, size: int) -> Buffer:
        size = max(0, min(size, self.end - position))
        if self._view is not None:
            start = position - self._origin
            return self._view[start : start + size]
        offset = position - self._window_start
        if offset >= 0 and offset + size <= len(self._window):
            return self._window[offset : offset + size]
        if self._fh is None:  # pragma: no cover - one of the two is always set
            raise TypeError("_Source needs a buffer or a file")
        want = max(size, min(_CRC_CHUNK, self.end - position))
        self._window = memoryview(b"")  # drop the old window before reading the next
        data: Buffer
        if self._scratch is not None:
            data = self._read_into_scratch(position, want)
        else:
            data = read_at(self._fh, position, want, path=self.path or "<file>")
        if len(data) < size:
            raise TruncatedFileError(
                f"file shrank while being read: wanted {size} bytes, got {len(data)}",
                path=self.path,
                position=position + len(data),
            )
        if self.on_read is not None:
            self.on_read(position, data)
        self._window = memoryview(data)
        self._window_start = position
        return self._window[:size]

    def _read_into_scratch(self, position: int, want: int) -> memoryview:
        if self._fh is None or self._scratch is None:  # pragma: no cover - checked by the caller
            raise TypeError("no file to read into the window")
        if len(self._scratch) < want:
            self._scratch = bytearray(want)
        target = memoryview(self._scratch)[:want]
        done = 0
        try:
            self._fh.seek(position)
            while done < want:
                count = self._fh.readinto(target[done:])  # type: ignore[attr-defined]
                if not count:
                    break
                done += count
        except OSError as exc:
            raise unreadable(self.path or "<file>", exc, position=position) from exc
        return target[:done]

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
    on_read: Callable[[int, Buffer], None] | None = None,
) -> Iterator[BatchHeader]:
    """Walk the batch headers of a ``.log`` segment, a slice of one, or a ranged GET of one.

    ``source`` is a buffer, an open binary file or a path (opened with the ``.deleted`` fallback and
    read only up to its size at open time). ``start``/``end`` bound the walk by absolute position;
    for a buffer, ``origin`` is the file position of its first byte, so headers and errors carry
    file positions. With ``verify_crc`` every batch's CRC-32C is checked (1 MiB at a time).

    A zero-padded tail (a preallocated, untrimmed file) raises ``CorruptRecordError`` and a batch
    cut off by end of file raises ``TruncatedFileError``; with ``tolerate_tail`` (a segment the
    broker may still be appending to) either one just ends the walk, as the broker's reader does.

    ``on_read(position, data)`` sees the bytes of a file source as they are read (in file order,
    windows may overlap; with ``verify_crc`` a walk to the end reads every byte), so a caller can
    hash them without reading the file again; ``data`` is only valid during the call.
    """
    with _open_source(source, start=start, end=end, path=path, origin=origin) as (src, first):
        src.on_read = on_read
        src.reuse_window()  # only headers (plain values) leave the walk
        yield from _walk(src, start=first, verify_crc=verify_crc, tolerate_tail=tolerate_tail)


def decode_batches(
    source: Buffer | BinaryIO | Path,
    *,
    verify_crc: bool = True,
    tolerate_tail: bool = False,
    start: int = 0,
    end: int | None = None,
    path: str | None = None,
    origin: int = 0,
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BATCH_BYTES,
) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """Walk a segment like :func:`iter_batches` and decode every batch's records on the way.

    The fast path for reading many records: each batch's bytes are read once, its CRC is checked
    once (with ``verify_crc``), and the same bytes go to the compiled decoder, without copies for
    a buffer source. Arguments and errors are those of :func:`iter_batches` and
    :func:`decode_records`; errors carry file positions.
    """
    with _open_source(source, start=start, end=end, path=path, origin=origin) as (src, first):
        for header in _walk(src, start=first, verify_crc=False, tolerate_tail=tolerate_tail):
            try:
                data = src.read(header.position, header.size)
            except TruncatedFileError:
                if tolerate_tail:  # truncated under the walk, inside this batch
                    return
                raise
            if verify_crc:
                _check_crc(data, header, path=src.path)
            yield header, _decode(data, header, path=src.path, limit=max_decompressed_bytes)


@contextlib.contextmanager
def _open_source(
    source: Buffer | BinaryIO | Path,
    *,
    start: int,
    end: int | None,
    path: str | None,
    origin: int,
) -> Iterator[tuple[_Source, int]]:
    """A :class:`_Source` for any supported source and the position to walk from; a file opened
    here (from a ``Path``) is closed on exit."""
    if isinstance(source, Path):
        fh, opened = open_with_deleted_fallback(source)
        with fh:
            try:
                size = os.fstat(fh.fileno()).st_size
            except OSError as exc:
                raise unreadable(opened, exc) from exc
            limit = size if end is None else min(end, size)
            yield _Source(None, fh, origin=0, end=limit, path=path or str(opened)), start
        return
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        limit = origin + len(view)
        reader = _Source(
            view, None, origin=origin, end=limit if end is None else min(end, limit), path=path
        )
        yield reader, max(start, origin)
        return
    name = path if path is not None else str(getattr(source, "name", "<file>"))
    if end is None:
        try:
            end = source.seek(0, 2)
        except OSError as exc:
            raise unreadable(name, exc) from exc
    yield _Source(None, source, origin=0, end=end, path=name), start


def _walk(
    src: _Source, *, start: int, verify_crc: bool, tolerate_tail: bool
) -> Iterator[BatchHeader]:
    position = start
    end = src.end
    while position < end:
        remaining = end - position
        try:
            head = src.read(position, RECORD_BATCH_OVERHEAD)
        except TruncatedFileError:
            if tolerate_tail:  # an active segment truncated under the walk (a follower's)
                return
            raise
        try:
            header = parse_batch_header(head, position=position, path=src.path, available=remaining)
        except (TruncatedFileError, CorruptRecordError) as exc:
            if tolerate_tail and _is_tail(exc, head):
                return
            raise
        if verify_crc:
            try:
                computed = src.crc(
                    position + _CRC_START, header.batch_length + LOG_OVERHEAD - _CRC_START
                )
            except TruncatedFileError:
                if tolerate_tail:  # truncated under the walk, inside this batch
                    return
                raise
            if computed != header.crc:
                raise _crc_error(header, computed, path=src.path)
        yield header
        position += header.batch_length + LOG_OVERHEAD


def _crc_error(header: BatchHeader, computed: int, *, path: str | None) -> CorruptRecordError:
    return CorruptRecordError(
        f"record batch at offset {header.base_offset} is corrupt: stored crc "
        f"{header.crc:#010x}, computed crc {computed:#010x}",
        path=path,
        position=header.position,
    )


def _check_crc(data: Buffer, header: BatchHeader, *, path: str | None) -> None:
    computed = int(crc32c.crc32c(memoryview(data)[_CRC_START : header.size]))
    if computed != header.crc:
        raise _crc_error(header, computed, path=path)


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
    batch: Buffer,
    *,
    verify_crc: bool = True,
    path: str | None = None,
    position: int = 0,
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BATCH_BYTES,
) -> list[Record]:
    """Decode every record of one batch (``batch`` starts at the batch; extra bytes are ignored).

    Handles every codec (gzip, snappy with or without the Java client's xerial framing, lz4, zstd),
    control batches (``Record.control_type``), headers and LogAppendTime (every record gets the
    batch's maxTimestamp). ``position`` is the batch's file position, for error messages. Keep
    ``verify_crc`` on for bytes that were not checked already: the compiled decoder trusts lengths.
    To decode a whole segment or range, :func:`decode_batches` is faster.

    A compressed batch that would expand to more than ``max_decompressed_bytes`` (a decompression
    bomb: zstd expands up to 32,000 times) is a ``CorruptRecordError``; no more than that is ever
    allocated, and sizes the stream states are checked before decompressing (see
    ``sidecar.kafka._codecs``).

    Raises ``CorruptRecordError`` for anything undecodable, and ``MissingToolError`` when the codec
    library is missing (snappy, lz4 and zstd need the ``cramjam`` package).
    """
    header = parse_batch_header(batch, position=position, path=path)
    if verify_crc:
        _check_crc(batch, header, path=path)
    return _decode(batch, header, path=path, limit=max_decompressed_bytes)


_AIOKAFKA_IMPORT = threading.Lock()


def prepare_decoder() -> None:
    """Import the record decoder now. The first decode imports it otherwise, in whichever
    thread makes it; a server whose worker threads decode calls this before it serves, so no
    import runs in two threads at once (Python's import locks can then hand one of them a
    partially initialized module)."""
    _aiokafka()


@functools.cache
def _aiokafka() -> tuple[Callable[[Buffer], Iterable[_DecodedRecord]], type[Exception]]:
    # Imported on first use so header walks and CRC checks never import aiokafka (see the module
    # docstring); cached because an import statement costs more than decoding a small batch.
    # Under a lock: two worker threads importing aiokafka's record package for the first time
    # at once can see it partially initialized ("cannot import name 'MemoryRecords'"), and the
    # cache does not keep a second caller from running the import meanwhile.
    with _AIOKAFKA_IMPORT:
        from aiokafka.errors import UnsupportedCodecError
        from aiokafka.record.default_records import DefaultRecordBatch

    return DefaultRecordBatch, UnsupportedCodecError


def _decode(data: Buffer, header: BatchHeader, *, path: str | None, limit: int) -> list[Record]:
    """The records of the batch ``header`` describes; ``data`` starts at the batch and its first
    ``header.size`` bytes are the batch (checked by ``parse_batch_header``)."""
    view = memoryview(data)
    if len(view) != header.size:
        view = view[: header.size]
    batch_type, unsupported = _aiokafka()
    try:
        batch = _bounded(view, header, limit) if header.attributes & _CODEC_MASK else view
        if header.attributes & _CONTROL_MASK:
            return _decode_control(batch_type(batch), header, path=path)
        timestamp_type = _TIMESTAMP_TYPES[(header.attributes & _TIMESTAMP_TYPE_MASK) >> 3]
        new = tuple.__new__  # skips NamedTuple's Python-level __new__: a third of the cost
        decoded = [
            new(Record, (r.offset, r.timestamp, timestamp_type, r.key, r.value, r.headers, None))
            for r in batch_type(batch)
        ]
    except (unsupported, ImportError) as exc:
        raise _missing_codec(header, exc) from exc
    except CorruptRecordError:
        raise  # a control record's key, already named at the batch
    except UnicodeDecodeError:
        # a header key that is not UTF-8 (not from a Java producer): read as Java's consumer
        # reads it, the bad bytes replaced
        decoded = _decode_leniently(view, header, path=path, limit=limit)
    except Exception as exc:
        raise _undecodable(header, exc, path=path) from exc
    if header.base_timestamp < 0 or header.max_timestamp < 0:
        # aiokafka reports Kafka's NO_TIMESTAMP (-1) as None; keep Kafka's -1
        decoded = [r._replace(timestamp=-1) if r.timestamp is None else r for r in decoded]
    return decoded


def _decode_leniently(
    view: memoryview, header: BatchHeader, *, path: str | None, limit: int
) -> list[Record]:
    """The batch's records walked in Python (:mod:`sidecar.kafka._lenient`), header keys that
    are not UTF-8 decoded with U+FFFD; only after the compiled decoder refused one."""
    codec = header.attributes & _CODEC_MASK
    payload: Buffer = view[RECORD_BATCH_OVERHEAD:]
    try:
        if codec:
            inflated = inflate(codec, view[RECORD_BATCH_OVERHEAD:], limit)
            # None: the compiled decoder decompressed it within the limit a moment ago
            payload = inflated if inflated is not None else _decompress(codec, bytes(payload))
        raw = walk_records(payload, header.record_count)
    except Exception as exc:
        raise _undecodable(header, exc, path=path) from exc
    control = header.attributes & _CONTROL_MASK
    timestamp_type = header.timestamp_type
    no_timestamp = header.base_timestamp < 0 or header.max_timestamp < 0
    found: list[Record] = []
    for r in raw:
        if no_timestamp:
            timestamp = -1
        elif timestamp_type is TimestampType.LOG_APPEND_TIME:
            timestamp = header.max_timestamp
        else:
            timestamp = header.base_timestamp + r.timestamp_delta
        kind = _control_type(r.key, path=path, position=header.position) if control else None
        offset = header.base_offset + r.offset_delta
        found.append(Record(offset, timestamp, timestamp_type, r.key, r.value, r.headers, kind))
    return found


def _decompress(codec: int, payload: bytes) -> bytes:
    """``payload`` decompressed by aiokafka's codec functions (the compiled decoder's own)."""
    from aiokafka import codec as codecs

    decode = {
        1: codecs.gzip_decode,
        2: codecs.snappy_decode,
        3: codecs.lz4_decode,
        4: codecs.zstd_decode,
    }[codec]
    return bytes(decode(payload))


def _bounded(view: memoryview, header: BatchHeader, limit: int) -> Buffer:
    """The batch as the compiled decoder may take it: as is when its payload provably expands to
    at most ``limit`` bytes, else with the payload inflated here (bounded) and the codec cleared.
    Raises ``BatchTooLargeError`` beyond the limit."""
    inflated = inflate(header.attributes & _CODEC_MASK, view[RECORD_BATCH_OVERHEAD:], limit)
    if inflated is None:
        return view
    batch = bytearray(view[:RECORD_BATCH_OVERHEAD])
    batch[_CRC_START + 1] &= ~_CODEC_MASK & 0xFF  # attributes' low byte: codec none
    batch += inflated
    return batch


def _decode_control(
    records: Iterable[_DecodedRecord], header: BatchHeader, *, path: str | None
) -> list[Record]:
    timestamp_type = header.timestamp_type
    return [
        Record(
            r.offset,
            -1 if r.timestamp is None else r.timestamp,
            timestamp_type,
            r.key,
            r.value,
            r.headers,
            _control_type(r.key, path=path, position=header.position),
        )
        for r in records
    ]


def _missing_codec(header: BatchHeader, exc: Exception) -> MissingToolError:
    return MissingToolError(
        f"cannot decode a {header.compression.name.lower()} record batch: {exc}; "
        "install cramjam (pip install 'aiokafka[snappy,lz4,zstd]')"
    )


def _undecodable(header: BatchHeader, exc: Exception, *, path: str | None) -> CorruptRecordError:
    # aiokafka raises CorruptRecordException, the codecs raise their own errors (OSError,
    # EOFError, zlib.error, cramjam.DecompressionError), the lenient walk raises ValueError,
    # a decompression bomb raises BatchTooLargeError: all mean the same thing here.
    return CorruptRecordError(
        f"cannot decode record batch at offset {header.base_offset} "
        f"({header.compression.name.lower()}): {type(exc).__name__}: {exc}",
        path=path,
        position=header.position,
    )


class _DecodedRecord(Protocol):
    """The attributes we use of aiokafka's ``DefaultRecord``."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int | None:
        """``None`` for Kafka's NO_TIMESTAMP (-1)."""

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
