"""The broker plugin's routes (``/v1/rsm/...``): Kafka's ``RemoteStorageManager`` calls, each a
POST with a JSON body that carries the broker's ``RemoteLogSegmentMetadata``.

* ``copy``: the broker's files and leader-epoch checkpoint → the copier uploads them;
  answers ``{"custom_metadata": null}`` (nothing to add to Kafka's metadata).
* ``fetch-segment``: bytes ``start..end`` (inclusive; no end = to the end) of the ``.log``,
  streamed through the chunk cache with a Content-Length; read-ahead stays below
  ``readahead_end`` (inclusive; default ``end``), the end of the range the window belongs to.
  With ``"files": true`` (a plugin on this host, or in this pod with the cache volume mounted)
  a range whose chunks are all in written cache files is answered with where they are,
  ``{"files": [{"path", "offset", "length"}, ...]}`` as JSON, and the plugin reads them itself:
  no ``sendfile``, one copy less per byte. The files are named from the cache's index, not
  opened here. Paths are as the broker sees the cache directory (:class:`CacheFileOffer`). A
  file may be evicted before the plugin opens it: the plugin then asks again without
  ``files``.
* ``fetch-index``: one index, byte-exact; a missing one is 404 (the plugin's
  ``RemoteResourceNotFoundException``).
* ``delete``: every object of the segment; idempotent.

The segment's object keys follow from the metadata in the request alone, so a fetch does not
wait for the metadata tailer to have seen the broker's COPY_SEGMENT_FINISHED. Nothing here
publishes a metadata event: in broker-driven mode the broker's RLMM does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import re
import uuid
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from sidecar.brokerapi import (
    FILE_SUFFIXES,
    BrokerCopyRequest,
    BrokerPathError,
    SegmentCopier,
)
from sidecar.brokerapi import SegmentNotCopyableError as NotCopyable
from sidecar.errors import KeyNotFoundError, SidecarError
from sidecar.kafka.checkpoints import decode_kafka_uuid
from sidecar.metadata.errors import InvalidMetadataEventError
from sidecar.metadata.events import (
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    TopicIdPartition,
)
from sidecar.observability.logging import get_logger
from sidecar.readserver.errors import (
    BadRequestError,
    BrokerCopyUnavailableError,
    CopyInterruptedError,
    IndexNotFoundError,
    RangeNotSatisfiableError,
    RemoteObjectNotFoundError,
    SegmentNotCopyableError,
)
from sidecar.readserver.routes import (
    METRICS_KEY,
    RSM_ROUTE_PREFIX,
    SERVICE_KEY,
    _pieces,
    _send,
    _send_plan,
)
from sidecar.readserver.service import NamedFiles, Plan
from sidecar.storage.manifest import IndexKind

__all__ = ["CACHE_FILES_KEY", "COPIER_KEY", "CacheFileOffer", "add_rsm_routes", "segment_metadata"]

log = get_logger(__name__)


class CacheFileOffer:
    """Where the broker finds the chunk cache's files: ``directory`` (the cache, as this process
    sees it) is ``broker_directory`` for the broker (default: the same path; a pod may mount the
    shared volume elsewhere in the broker's container)."""

    def __init__(self, directory: Path, broker_directory: Path | None = None) -> None:
        self._directory = Path(directory).absolute()
        self._broker_directory = (
            self._directory if broker_directory is None else Path(broker_directory)
        )

    def broker_path(self, path: Path) -> str | None:
        """The file ``path`` of the cache as the broker sees it; None for a file outside the
        cache or a path that is not plain printable ASCII without ``"`` and a backslash (the
        plugin's parser reads no JSON escapes)."""
        try:
            relative = Path(path).absolute().relative_to(self._directory)
        except ValueError:
            return None
        text = str(self._broker_directory / relative)
        return text if _PLAIN_PATH.fullmatch(text) else None

    @property
    def usable(self) -> bool:
        """Whether the cache's files can be named to the broker at all (a directory whose
        path the plugin cannot take makes every answer None)."""
        return self.broker_path(self._directory / "00" / "0-0-0.chunk") is not None

    def answer(self, named: NamedFiles) -> bytes | None:
        """The ``{"files": [...]}`` answer naming ``named``'s ranges as the broker sees them;
        None when a file cannot be named."""
        files: list[dict[str, Any]] = []
        for piece in named.ranges:
            path = self.broker_path(piece.path)
            if path is None:
                return None
            files.append({"path": path, "offset": piece.offset, "length": piece.length})
        return json.dumps({"files": files}, separators=(",", ":")).encode()


COPIER_KEY: Final = web.AppKey("broker_copier", SegmentCopier)
CACHE_FILES_KEY: Final = web.AppKey("cache_files", CacheFileOffer)
#: what a path offered to the plugin may hold: printable ASCII but ``"`` and a backslash
_PLAIN_PATH: Final = re.compile(r"[ !#-\[\]-~]+")
_PREFIX: Final = RSM_ROUTE_PREFIX
#: Kafka's RemoteStorageManager.IndexType → the manifest's index kinds
_INDEX_TYPES: Final = {
    "OFFSET": IndexKind.OFFSET_INDEX,
    "TIMESTAMP": IndexKind.TIME_INDEX,
    "TRANSACTION": IndexKind.TXN_INDEX,
    "PRODUCER_SNAPSHOT": IndexKind.PRODUCER_SNAPSHOT,
    "LEADER_EPOCH": IndexKind.LEADER_EPOCH_CHECKPOINT,
}
#: how often a copy in progress checks that the broker still waits for it
_DISCONNECT_CHECK_S: Final = 1.0
_MAX_INT64: Final = 2**63 - 1
_MAX_INT32: Final = 2**31 - 1


def add_rsm_routes(app: web.Application) -> None:
    app.router.add_post("/v1/rsm/copy", _copy, name=_PREFIX + "copy")
    app.router.add_post("/v1/rsm/fetch-segment", _fetch_segment, name=_PREFIX + "fetch_segment")
    app.router.add_post("/v1/rsm/fetch-index", _fetch_index, name=_PREFIX + "fetch_index")
    app.router.add_post("/v1/rsm/delete", _delete, name=_PREFIX + "delete")


# ---------------------------------------------------------------------------------------------
# request bodies


async def _body(request: web.Request) -> dict[str, Any]:
    length = request.content_length or 0
    raw = await request.content.readexactly(length) if length else b""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"the request body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    return body


def _int(body: dict[str, Any], name: str, low: int, high: int, *, optional: bool = False) -> Any:
    value = body.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequestError(f"{name} must be an integer in [{low}, {high}]")
    return value


def _str(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise BadRequestError(f"{name} must be a non-empty string")
    return value


def _uuid(body: dict[str, Any], name: str) -> uuid.UUID:
    try:
        return decode_kafka_uuid(_str(body, name))
    except ValueError as exc:
        raise BadRequestError(f"{name} is not a Kafka Uuid: {exc}") from exc


def segment_metadata(body: dict[str, Any]) -> SegmentMetadata:
    """The broker's ``RemoteLogSegmentMetadata`` from a request body."""
    epochs = body.get("segment_leader_epochs")
    if (
        not isinstance(epochs, list)
        or not epochs
        or not all(
            isinstance(e, list)
            and len(e) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in e)
            for e in epochs
        )
    ):
        raise BadRequestError("segment_leader_epochs must be a non-empty list of [epoch, offset]")
    txn_index_empty = body.get("txn_index_empty", False)
    if not isinstance(txn_index_empty, bool):
        raise BadRequestError("txn_index_empty must be a boolean")
    try:
        tip = TopicIdPartition(
            _uuid(body, "topic_id"), _str(body, "topic"), _int(body, "partition", 0, _MAX_INT32)
        )
        return SegmentMetadata(
            segment_id=RemoteLogSegmentId(tip, _uuid(body, "segment_id")),
            start_offset=_int(body, "start_offset", 0, _MAX_INT64),
            end_offset=_int(body, "end_offset", 0, _MAX_INT64),
            broker_id=_int(body, "broker_id", 0, _MAX_INT32),
            max_timestamp_ms=_int(body, "max_timestamp_ms", -1, _MAX_INT64),
            event_timestamp_ms=_int(body, "event_timestamp_ms", 0, _MAX_INT64),
            segment_leader_epochs=tuple((int(e[0]), int(e[1])) for e in epochs),
            segment_size_in_bytes=_int(body, "segment_size_in_bytes", 0, _MAX_INT32),
            state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
            txn_index_empty=txn_index_empty,
        )
    except InvalidMetadataEventError as exc:
        raise BadRequestError(f"invalid segment metadata: {exc}") from exc


def _copy_request(body: dict[str, Any]) -> BrokerCopyRequest:
    files = body.get("files")
    if not isinstance(files, dict) or set(files) - set(FILE_SUFFIXES):
        raise BadRequestError(f"files must be an object with keys among {sorted(FILE_SUFFIXES)}")
    paths: dict[str, Path | None] = {}
    for kind in FILE_SUFFIXES:
        value = files.get(kind)
        if value is None and kind == "txn_index":
            paths[kind] = None
        elif isinstance(value, str) and value and "\x00" not in value:
            paths[kind] = Path(value)
        else:
            raise BadRequestError(f"files.{kind} must be a path")
    encoded = body.get("leader_epoch_index", "")
    if not isinstance(encoded, str):
        raise BadRequestError("leader_epoch_index must be base64 text")
    try:
        epochs = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequestError(f"leader_epoch_index is not base64: {exc}") from exc
    return BrokerCopyRequest(segment_metadata(body), paths, epochs)


# ---------------------------------------------------------------------------------------------
# handlers


async def _copy(request: web.Request) -> web.StreamResponse:
    copy = _copy_request(await _body(request))
    copier = request.app.get(COPIER_KEY)
    if copier is None:
        raise BrokerCopyUnavailableError("this read server was started without the copier")
    segment = copy.metadata
    try:
        await _copy_while_connected(request, copier, copy)
    except (BrokerPathError, NotCopyable, SidecarError) as exc:
        log.warning(
            "broker_copy_refused"
            if isinstance(exc, BrokerPathError | NotCopyable)
            else "broker_copy_failed",
            topic=segment.segment_id.topic_id_partition.topic,
            partition=segment.segment_id.topic_id_partition.partition,
            base_offset=segment.start_offset,
            segment_id=str(segment.segment_id.id),
            error=str(exc),
            error_type=type(exc).__name__,
        )
        if isinstance(exc, BrokerPathError):
            raise BadRequestError(str(exc)) from exc
        if isinstance(exc, NotCopyable):
            raise SegmentNotCopyableError(str(exc)) from exc
        if getattr(exc, "retriable", False) and not isinstance(exc, KeyNotFoundError):
            raise CopyInterruptedError(str(exc)) from exc
        raise
    return web.json_response({"custom_metadata": None})


async def _copy_while_connected(
    request: web.Request, copier: SegmentCopier, copy: BrokerCopyRequest
) -> None:
    """Run the copy while the broker waits for it. A broker that closed the connection (its
    copy timeout, a shutdown, a lost leadership) has given up on this segment id and writes no
    COPY_SEGMENT_FINISHED for it: the copy is cancelled and the copier deletes what it wrote,
    rather than leaving objects that no metadata names. A copy that finished after the broker
    closed (between two looks) is deleted the same way. The broker may still give up after
    the answer is on its way; the orphan scrub removes such a copy once the broker has copied
    its offsets again (it stays at COPY_SEGMENT_STARTED, superseded)."""
    task = asyncio.create_task(copier.copy(copy), name="broker copy")
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_CHECK_S)
            if done:
                task.result()
                if _connected(request):
                    return
                await asyncio.shield(_delete_abandoned(copier, copy.metadata))
                break
            if not _connected(request):
                break
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    segment = copy.metadata
    log.warning(
        "broker_copy_abandoned",
        topic=segment.segment_id.topic_id_partition.topic,
        partition=segment.segment_id.topic_id_partition.partition,
        base_offset=segment.start_offset,
        segment_id=str(segment.segment_id.id),
        reason="the broker closed the connection",
    )
    raise CopyInterruptedError(
        f"the broker closed the connection during the copy of segment {segment.segment_id.id}"
    )


def _connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


async def _delete_abandoned(copier: SegmentCopier, metadata: SegmentMetadata) -> None:
    """Delete a finished copy that no broker waits for any more."""
    try:
        await copier.delete(metadata)
    except SidecarError as exc:  # the orphan scrub removes it once it is superseded
        log.warning(
            "broker_copy_cleanup_failed", segment_id=str(metadata.segment_id.id), error=str(exc)
        )


async def _fetch_segment(request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    segment = segment_metadata(body)
    start = _int(body, "start", 0, _MAX_INT32)
    end = _int(body, "end", 0, _MAX_INT32, optional=True)
    size = segment.segment_size_in_bytes
    if start >= size or (end is not None and end < start):
        raise RangeNotSatisfiableError(
            f"bytes {start}-{'' if end is None else end} are not within segment"
            f" {segment.segment_id.id} ({size} bytes)",
            size=size,
        )
    # the plugin asks for one window of a longer range at a time: read ahead (the chunk
    # prefetch) into the rest of that range, so the next window's chunks are on their way
    readahead_end = _int(body, "readahead_end", 0, _MAX_INT32, optional=True)
    wants_files = body.get("files", False)
    if not isinstance(wants_files, bool):
        raise BadRequestError("files must be true or false")
    offer = request.app.get(CACHE_FILES_KEY) if wants_files else None
    service = request.app[SERVICE_KEY]
    try:
        found = await service.log_range(
            segment, start, end, readahead_end=readahead_end, files=offer is not None
        )
        if isinstance(found, NamedFiles):  # every chunk in a written file: the plugin reads them
            answer = None if offer is None else offer.answer(found)
            if answer is not None:
                metrics = request.app.get(METRICS_KEY)
                if metrics is not None:
                    metrics.read_shared_file_bytes.inc(found.length)
                return web.Response(
                    body=answer,
                    content_type="application/json",
                    headers={"Cache-Control": "no-store"},
                )
            # a path the plugin cannot take (an offer is made only for a directory it can)
            stream = await service.log_range(segment, start, end, readahead_end=readahead_end)
        else:
            stream = found
    except KeyNotFoundError as exc:
        raise RemoteObjectNotFoundError(
            f"the .log of segment {segment.segment_id.id} is not in the bucket"
        ) from exc
    response = web.StreamResponse(
        headers={"Content-Type": "application/octet-stream", "Cache-Control": "no-store"}
    )
    response.content_length = stream.length
    if isinstance(stream, Plan):  # every chunk cached: sent from the chunk files
        return await _send_plan(request, response, stream, endpoint="rsm_fetch_segment")
    return await _send(request, response, _pieces(stream), endpoint="rsm_fetch_segment")


async def _fetch_index(request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    segment = segment_metadata(body)
    name = body.get("index_type")
    kind = _INDEX_TYPES.get(name) if isinstance(name, str) else None
    if kind is None:
        raise BadRequestError(f"index_type must be one of {', '.join(_INDEX_TYPES)}")
    service = request.app[SERVICE_KEY]
    try:
        manifest = await service.manifest(segment, indexes=True)
        data = await service.index_bytes(segment, kind) if manifest is not None else None
    except KeyNotFoundError as exc:
        raise RemoteObjectNotFoundError(
            f"the indexes of segment {segment.segment_id.id} are not in the bucket"
        ) from exc
    if manifest is None:
        raise RemoteObjectNotFoundError(
            f"segment {segment.segment_id.id} has no manifest in the bucket"
        )
    if data is None:
        raise IndexNotFoundError(f"remote segment {segment.segment_id.id} has no {kind.value}")
    return web.Response(body=data, content_type="application/octet-stream")


async def _delete(request: web.Request) -> web.StreamResponse:
    segment = segment_metadata(await _body(request))
    copier = request.app.get(COPIER_KEY)
    if copier is None:
        raise BrokerCopyUnavailableError("this read server was started without the copier")
    await copier.delete(segment)
    return web.json_response({})
