"""An async Python client of the read socket (the API in ``openapi.yaml``), used by the CLI's
``sidecar read`` and by tests. Over the Unix socket by default, or a loopback URL::

    async with ReadClient(socket_path="/var/lib/kafka-tiered-sidecar/read.sock") as client:
        async for record in client.iter_records("orders", 0, offset=0, count=10):
            print(record.offset, record.key, record.value)

Server errors are raised as :mod:`sidecar.readserver.errors` classes (``OffsetOutOfRangeError``
carries the tiered range in ``details["available"]``); a refused connection is
``ServerUnreachableError`` and a body cut short is ``TruncatedResponseError``. Records are
decoded here from raw record batches (:func:`sidecar.kafka.records.decode_batches`, CRC-checked),
control records skipped; :meth:`ReadClient.records_json` asks the server for JSON instead.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from os import PathLike
from types import TracebackType
from typing import Any, Self

import aiohttp

from sidecar.kafka.records import Record, TimestampType, decode_batches
from sidecar.readserver._txn import (
    ABORTED_TRANSACTIONS_HEADER,
    AbortedTransaction,
    CommittedFilter,
    IsolationLevel,
    parse_aborted,
)
from sidecar.readserver.errors import (
    ReadError,
    ServerUnreachableError,
    TruncatedResponseError,
    error_for,
)

__all__ = ["ReadClient", "RecordBatches", "RecordsPage"]

_BASE_FOR_SOCKET = "http://localhost"


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class RecordBatches:
    """One raw records response: the batches as the broker wrote them and, for read_committed,
    the aborted transactions that overlap them (Kafka's FetchResponse; filter with
    :class:`CommittedFilter`)."""

    data: bytes
    aborted: list[AbortedTransaction]
    isolation: IsolationLevel


@dataclass(frozen=True, slots=True)
class RecordsPage:
    """One records response: the records (control records left out) and where to go on."""

    records: list[Record]
    next_offset: int
    tiered: Mapping[str, int] | None


def _record_from_json(item: Mapping[str, Any]) -> Record:
    def raw(value: str | None) -> bytes | None:
        return None if value is None else base64.b64decode(value)

    return Record(
        offset=int(item["offset"]),
        timestamp=int(item["timestamp"]),
        timestamp_type=TimestampType[str(item["timestamp_type"])],
        key=raw(item["key"]),
        value=raw(item["value"]),
        headers=[(str(h["key"]), raw(h["value"])) for h in item["headers"]],
    )


class ReadClient:
    """A client of one read server; use it as an async context manager or :meth:`aclose` it
    (idempotent). Keyword-only options; ``socket_path`` or ``url``, not both."""

    def __init__(
        self,
        *,
        socket_path: str | PathLike[str] | None = None,
        url: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        if (socket_path is None) == (url is None):
            raise ValueError("give exactly one of socket_path and url")
        self._socket_path = None if socket_path is None else str(socket_path)
        self._base = _BASE_FOR_SOCKET if url is None else url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=timeout_s, sock_read=timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        self._state = _State.UNOPENED

    async def __aenter__(self) -> Self:
        self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections; idempotent."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._state is _State.CLOSED:
            raise RuntimeError("ReadClient is closed")
        if self._session is None:
            connector: aiohttp.BaseConnector
            if self._socket_path is not None:
                connector = aiohttp.UnixConnector(path=self._socket_path)
            else:
                connector = aiohttp.TCPConnector()
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=False
            )
            self._state = _State.OPENED
        return self._session

    # -- transport -----------------------------------------------------------------------

    async def _get(self, path: str, params: Mapping[str, Any] | None = None) -> bytes:
        chunks = [piece async for piece in self._stream(path, params)]
        return b"".join(chunks)

    async def _get_with_headers(
        self, path: str, params: Mapping[str, Any] | None = None
    ) -> tuple[bytes, Mapping[str, str]]:
        headers: dict[str, str] = {}
        chunks = [piece async for piece in self._stream(path, params, headers=headers)]
        return b"".join(chunks), headers

    async def _get_json(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return json.loads(await self._get(path, params))

    async def _stream(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        piece_bytes: int = 1 << 20,
        headers: dict[str, str] | None = None,
    ) -> AsyncIterator[bytes]:
        """The response body of a GET, piece by piece (the response headers into ``headers``
        when given); errors raised as ``ReadError``s."""
        session = self._open()
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        where = f"{self._socket_path or self._base}{path}"
        try:
            async with session.get(self._base + path, params=query) as response:
                if response.status >= 400:
                    body = await response.read()
                    try:
                        document = json.loads(body)
                    except ValueError:
                        document = {"message": body.decode(errors="replace")[:500]}
                    raise error_for(response.status, document)
                if headers is not None:
                    headers.update(response.headers)
                async for piece in response.content.iter_chunked(piece_bytes):
                    yield piece
        except aiohttp.ClientConnectionError as exc:
            if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
                raise TruncatedResponseError(f"{where}: the response ended early: {exc}") from exc
            raise ServerUnreachableError(f"cannot reach the read server at {where}: {exc}") from exc
        except aiohttp.ClientPayloadError as exc:
            raise TruncatedResponseError(f"{where}: the response ended early: {exc}") from exc

    @staticmethod
    def _partition(topic: str, partition: int) -> str:
        return f"/v1/topics/{topic}/partitions/{partition}"

    # -- the API -------------------------------------------------------------------------

    #: ListOffsets' special timestamps
    LATEST = -1
    EARLIEST = -2
    MAX_TIMESTAMP = -3

    async def version(self) -> dict[str, Any]:
        """The API version and the sidecar's version."""
        found: dict[str, Any] = await self._get_json("/v1/version")
        return found

    async def topics(self) -> list[dict[str, Any]]:
        """Topics with tiered partitions: name, topic id, partitions."""
        found: list[dict[str, Any]] = (await self._get_json("/v1/topics"))["topics"]
        return found

    async def partition(self, topic: str, partition: int) -> dict[str, Any]:
        """The partition's topic id, tiered range (or None), segment count and bytes."""
        found: dict[str, Any] = await self._get_json(self._partition(topic, partition))
        return found

    async def segments(
        self, topic: str, partition: int, *, states: Iterable[str] | None = None
    ) -> dict[str, Any]:
        """The partition's remote segments with their states and the offsets each serves."""
        params = {"state": ",".join(states)} if states is not None else None
        found: dict[str, Any] = await self._get_json(
            self._partition(topic, partition) + "/segments", params
        )
        return found

    async def offset_for_timestamp(
        self, topic: str, partition: int, timestamp: int
    ) -> dict[str, Any]:
        """``{"offset", "timestamp", "leader_epoch", ...}`` of the first record at or after
        ``timestamp``; the values are None when no tiered record is that late. As in Kafka's
        ListOffsets, ``-2`` (:attr:`EARLIEST`) answers the first tiered offset, ``-1``
        (:attr:`LATEST`) the last tiered offset + 1, ``-3`` (:attr:`MAX_TIMESTAMP`) the first
        record with the largest timestamp."""
        found: dict[str, Any] = await self._get_json(
            self._partition(topic, partition) + "/offsets", {"timestamp": timestamp}
        )
        return found

    async def record_batches(
        self, topic: str, partition: int, offset: int, *, max_bytes: int | None = None
    ) -> bytes:
        """Raw record batches from the batch holding ``offset``, up to ``max_bytes``."""
        return await self._get(
            self._partition(topic, partition) + "/records",
            {"offset": offset, "max_bytes": max_bytes},
        )

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int | None = None,
        isolation: IsolationLevel | str = IsolationLevel.READ_UNCOMMITTED,
    ) -> RecordBatches:
        """Raw record batches as :meth:`record_batches`, with the aborted transactions that
        overlap them when ``isolation`` is read_committed (a Kafka fetch)."""
        level = IsolationLevel(isolation)
        data, headers = await self._get_with_headers(
            self._partition(topic, partition) + "/records",
            {"offset": offset, "max_bytes": max_bytes, "isolation": level.value},
        )
        aborted: list[AbortedTransaction] = []
        if level is IsolationLevel.READ_COMMITTED:
            listed = headers.get(ABORTED_TRANSACTIONS_HEADER)
            if listed is None:
                raise ReadError(
                    f"the read server sent no {ABORTED_TRANSACTIONS_HEADER} header for a"
                    " read_committed fetch (an older server?)"
                )
            aborted = parse_aborted(listed)
        return RecordBatches(data, aborted, level)

    async def records_json(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int | None = None,
        max_records: int | None = None,
        isolation: IsolationLevel | str = IsolationLevel.READ_UNCOMMITTED,
    ) -> RecordsPage:
        """Records from ``offset`` decoded by the server (``format=json``); read_committed
        leaves out the records of aborted transactions."""
        document = await self._get_json(
            self._partition(topic, partition) + "/records",
            {
                "offset": offset,
                "max_bytes": max_bytes,
                "max_records": max_records,
                "format": "json",
                "isolation": IsolationLevel(isolation).value,
            },
        )
        return RecordsPage(
            [_record_from_json(item) for item in document["records"]],
            int(document["next_offset"]),
            document.get("tiered"),
        )

    async def records(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int | None = None,
        isolation: IsolationLevel | str = IsolationLevel.READ_UNCOMMITTED,
    ) -> RecordsPage:
        """Records from ``offset``, decoded here from raw batches (CRC-checked); control
        records and records before ``offset`` are left out, and with read_committed the
        records of aborted transactions (as a Kafka consumer filters a fetch)."""
        fetched = await self.fetch(
            topic, partition, offset, max_bytes=max_bytes, isolation=isolation
        )
        committed = None
        if fetched.isolation is IsolationLevel.READ_COMMITTED:
            committed = CommittedFilter(fetched.aborted)
        records: list[Record] = []
        next_offset = offset
        for header, decoded in decode_batches(fetched.data):
            next_offset = max(next_offset, header.next_offset)
            if committed is not None:
                control = decoded[0].control_type if header.is_control and decoded else None
                if not committed.accept(header, control):
                    continue
            if not header.is_control:
                records.extend(r for r in decoded if r.offset >= offset)
        return RecordsPage(records, next_offset, None)

    async def iter_records(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        count: int | None = None,
        max_bytes: int | None = None,
        isolation: IsolationLevel | str = IsolationLevel.READ_UNCOMMITTED,
    ) -> AsyncIterator[Record]:
        """Records from ``offset`` to the end of the tiered data (or ``count`` records, 0 or
        more: a negative count is a ValueError, not an empty answer)."""
        if count is not None and count < 0:
            raise ValueError(f"count must be 0 or more (None: to the end), not {count}")
        seen = 0
        while count is None or seen < count:
            try:
                page = await self.records(
                    topic, partition, offset, max_bytes=max_bytes, isolation=isolation
                )
            except ReadError as exc:
                if exc.code == "offset_out_of_range" and seen:
                    return  # read to the end of the tiered range
                raise
            for record in page.records:
                yield record
                seen += 1
                if count is not None and seen >= count:
                    return
            if page.next_offset <= offset:
                return
            offset = page.next_offset

    async def segment_log(
        self, topic: str, partition: int, segment_id: str, *, start: int = 0, end: int | None = None
    ) -> bytes:
        """Bytes ``start..end`` (inclusive; None = to the end) of a segment's ``.log``."""
        return await self._get(
            self._partition(topic, partition) + f"/segments/{segment_id}/log",
            {"start": start, "end": end},
        )

    def stream_segment_log(
        self, topic: str, partition: int, segment_id: str, *, start: int = 0, end: int | None = None
    ) -> AsyncIterator[bytes]:
        """Like :meth:`segment_log`, piece by piece."""
        return self._stream(
            self._partition(topic, partition) + f"/segments/{segment_id}/log",
            {"start": start, "end": end},
        )

    async def index(self, topic: str, partition: int, segment_id: str, index_type: str) -> bytes:
        """One index of a segment: offset, timestamp, transaction, producer_snapshot or
        leader_epoch (``IndexNotFoundError`` for an absent transaction index)."""
        return await self._get(
            self._partition(topic, partition) + f"/segments/{segment_id}/indexes/{index_type}"
        )
