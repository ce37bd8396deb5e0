"""The read socket's HTTP API, version 1: parse the request → call :class:`ReadService` → write the
response. Described in ``openapi.yaml`` beside this module (served at ``/v1/openapi.yaml``).

Every error is JSON, ``{"code": ..., "message": ..., **details}``, with the status and code from
one table (:func:`error_response`): the read errors of :mod:`sidecar.readserver.errors`, the
router's 404/405, the limits below, and the storage, format and metadata errors of the layers
below. Nothing else becomes a 5xx but ``internal_error``, which is logged with its traceback.

Limits, checked before a handler runs (:func:`limits_middleware`): requests served at once (429),
request target length (414), header bytes (431), a request body (413: the API has none). Record
responses are bounded by ``max_bytes`` (clamped to the server's maximum) and ``max_records``.
Every write of a body has a stall deadline (``send_stall_s``): a client that takes no bytes for
that long has its connection aborted, which frees its slot and the chunk files its response holds.

Responses stream: a handler writes batches or byte ranges as they come from the chunk cache,
with backpressure from the socket, so a response holds one cache window (1 MiB) at a time. The
first piece is read before the status line goes out, so early failures are proper errors; a
failure after that closes the connection without finishing the body (the client sees a
truncated response, never a wrong one). A client that closes the connection mid-body is not a
server error: the request is counted under status 499 (``CLIENT_CLOSED_STATUS``). Warm
responses (raw records over verified batches, raw segment ranges, all in cached chunks) are
planned instead: their length is known, and file pieces go out with ``os.sendfile`` in worker
threads, never read into this process.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import os
import re
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter

from sidecar import __version__
from sidecar._sendfile import (
    ShortFileError,
    flushed,
    plain_socket,
    progressing,
    send_file_range,
)
from sidecar.errors import (
    ChecksumMismatchError,
    FormatError,
    InvalidRangeError,
    KeyNotFoundError,
    SidecarError,
    StorageError,
)
from sidecar.kafka.checkpoints import decode_kafka_uuid, encode_kafka_uuid
from sidecar.kafka.records import Record
from sidecar.metadata.errors import MetadataStoreError
from sidecar.metadata.events import RemoteLogSegmentState, SegmentMetadata, TopicIdPartition
from sidecar.metadata.store import RemoteSegmentStore, SegmentSpan
from sidecar.observability.logging import get_logger
from sidecar.observability.metrics import Metrics
from sidecar.readserver._txn import (
    ABORTED_TRANSACTIONS_HEADER,
    CommittedFilter,
    IsolationLevel,
    format_aborted,
)
from sidecar.readserver.errors import (
    BadRequestError,
    MetadataUnavailableError,
    ReadError,
    RemoteDataError,
    StorageTimeoutError,
    StorageUnavailableError,
    UnknownSegmentError,
    UnknownTopicError,
)
from sidecar.readserver.service import (
    MAX_TIMESTAMP,
    Batch,
    BatchStream,
    ByteStream,
    FileRange,
    Plan,
    ReadService,
    RunStream,
    decode_batch,
)
from sidecar.storage.manifest import IndexKind

__all__ = [
    "LIMITS_KEY",
    "METRICS_KEY",
    "OPENAPI_PATH",
    "SERVICE_KEY",
    "ReadLimits",
    "add_routes",
    "error_response",
    "limits_middleware",
]

log = get_logger(__name__)

#: the OpenAPI document of this API
OPENAPI_PATH: Final = Path(__file__).with_name("openapi.yaml")
RECORD_BATCHES_TYPE: Final = "application/vnd.apache.kafka.record-batches"

_TOPIC: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}\Z")
_INT: Final = re.compile(r"-?[0-9]{1,19}\Z")
_MAX_INT64: Final = 2**63 - 1
_MAX_INT32: Final = 2**31 - 1
_WRITE_BYTES: Final = 256 * 1024
#: file ranges smaller than this are read and written (a thread hop either way)
_SENDFILE_MIN_BYTES: Final = 256 * 1024
_SEND_BUFFER_BYTES: Final = 4 * 1024 * 1024
_INDEX_TYPES: Final = {
    "offset": IndexKind.OFFSET_INDEX,
    "timestamp": IndexKind.TIME_INDEX,
    "transaction": IndexKind.TXN_INDEX,
    "producer_snapshot": IndexKind.PRODUCER_SNAPSHOT,
    "leader_epoch": IndexKind.LEADER_EPOCH_CHECKPOINT,
}
_STATES: Final = {state.name: state for state in RemoteSegmentStore.LIVE_STATES}
#: the names of the broker plugin's routes start with this (``sidecar.readserver.rsm``)
RSM_ROUTE_PREFIX: Final = "rsm_"
#: the largest body of a plugin request (a copy's leader-epoch checkpoint is its largest part)
RSM_MAX_BODY_BYTES: Final = 1024 * 1024
#: the version of the plugin's requests this server speaks; the plugin sends its own in this
#: header (the broker's jar and the sidecar are upgraded apart)
RSM_PROTOCOL: Final = 1
RSM_PROTOCOL_HEADER: Final = "X-Sidecar-Rsm-Protocol"


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Request and response bounds (``sidecar.config.ReadServerConfig``)."""

    default_response_bytes: int = 1024 * 1024
    max_response_bytes: int = 64 * 1024 * 1024
    max_records: int = 100_000
    max_url_bytes: int = 4096
    max_header_bytes: int = 8192
    max_concurrent_requests: int = 256
    #: a client that takes no bytes of its response for this long has its connection aborted
    #: (the request's slot and the chunk files it holds are released)
    send_stall_s: float = 60.0


class _InFlight:
    """Requests being served (the 429 limit)."""

    count = 0


class PluginActivity:
    """When the broker plugin last sent a request (wall-clock seconds), for ``sidecar status``:
    a broker-driven topic whose broker never calls is a broker without the plugin's
    properties."""

    def __init__(self) -> None:
        self.last_request_at: float | None = None


class _ProtocolsLogged:
    """Plugin protocol versions already logged as unsupported: one line each, not one per
    request of a broker that retries."""

    def __init__(self) -> None:
        self.seen: set[str] = set()


SERVICE_KEY: Final = web.AppKey("read_service", ReadService)
LIMITS_KEY: Final = web.AppKey("read_limits", ReadLimits)
METRICS_KEY: Final = web.AppKey("read_metrics", Metrics)
_IN_FLIGHT_KEY: Final = web.AppKey("read_in_flight", _InFlight)
_PROTOCOLS_LOGGED_KEY: Final = web.AppKey("rsm_protocols_logged", _ProtocolsLogged)
PLUGIN_ACTIVITY_KEY: Final = web.AppKey("rsm_plugin_activity", PluginActivity)
#: where a response keeps its error code (StreamResponse is a mapping for such state)
_CODE: Final = web.ResponseKey("sidecar_error_code", str)
#: set on a response whose client closed the connection before the whole body was sent
_CLIENT_GONE: Final = web.ResponseKey("sidecar_client_gone", bool)
#: the status such a response is counted under (nginx's "client closed request")
CLIENT_CLOSED_STATUS: Final = 499


# ---------------------------------------------------------------------------------------------
# errors


def _json(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> web.Response:
    response = web.Response(
        status=status,
        body=json.dumps(body, separators=(",", ":")).encode(),
        content_type="application/json",
        headers=headers,
    )
    if status >= 400:
        response[_CODE] = str(body.get("code", "internal_error"))
    if status in (503, 504) and "Retry-After" not in response.headers:
        response.headers["Retry-After"] = "1"  # S3 or the metadata store failed: transient
    return response


def _error(status: int, code: str, message: str, **details: Any) -> web.Response:
    return _json(status, {"code": code, "message": message, **details})


def error_response(exc: BaseException) -> web.Response:
    """The JSON error for ``exc`` (one table for every error the handlers can meet)."""
    if isinstance(exc, ReadError):
        return _json(exc.status, exc.to_json())
    if isinstance(exc, web.HTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(
            exc.status, "bad_request" if exc.status < 500 else "internal_error"
        )
        return _error(exc.status, code, exc.reason)
    mapped: ReadError
    if isinstance(exc, KeyNotFoundError | InvalidRangeError | ChecksumMismatchError):
        mapped = RemoteDataError(f"the object store cannot give what the metadata promises: {exc}")
    elif isinstance(exc, StorageError):
        mapped = StorageUnavailableError(f"the object store failed: {exc}")
    elif isinstance(exc, TimeoutError):
        mapped = StorageTimeoutError("an object-store call passed its deadline")
    elif isinstance(exc, FormatError):
        mapped = RemoteDataError(f"remote data does not parse: {exc}")
    elif isinstance(exc, MetadataStoreError):
        mapped = MetadataUnavailableError(f"the metadata store failed: {exc}")
    else:
        return _error(500, "internal_error", f"internal error ({type(exc).__name__})")
    return _json(mapped.status, mapped.to_json())


def _error_code(response: web.StreamResponse) -> str | None:
    code = response.get(_CODE)
    return None if code is None else str(code)


@web.middleware
async def limits_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Limits, JSON errors and metrics around every handler."""
    app = request.app
    limits = app[LIMITS_KEY]
    metrics = app.get(METRICS_KEY)
    in_flight = app[_IN_FLIGHT_KEY]
    route = request.match_info.route
    endpoint = route.name if route.name is not None else "unmatched"
    started = time.monotonic()
    response: web.StreamResponse
    admitted = in_flight.count < limits.max_concurrent_requests
    if admitted:
        in_flight.count += 1
        if metrics is not None:
            metrics.read_requests_in_flight.inc()
    try:
        response = await _admit(request, handler, limits, admitted)
    except asyncio.CancelledError:
        raise
    except (ReadError, web.HTTPException, SidecarError, TimeoutError) as exc:
        response = error_response(exc)
    except Exception as exc:
        log.exception("read_request_failed", endpoint=endpoint, path=request.path[:200])
        response = error_response(exc)
    finally:
        if admitted:
            in_flight.count -= 1
            if metrics is not None:
                metrics.read_requests_in_flight.dec()
    if metrics is not None:
        status = CLIENT_CLOSED_STATUS if response.get(_CLIENT_GONE) else response.status
        metrics.read_requests.labels(endpoint, str(status)).inc()
        metrics.read_request_seconds.labels(endpoint).observe(time.monotonic() - started)
        code = _error_code(response)
        if code is not None:
            metrics.read_errors.labels(code).inc()
    return response


async def _admit(
    request: web.Request,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    limits: ReadLimits,
    admitted: bool,
) -> web.StreamResponse:
    if not admitted:
        return _json(
            429,
            {"code": "too_many_requests", "message": "too many requests in flight; retry"},
            headers={"Retry-After": "1"},
        )
    if len(request.raw_path) > limits.max_url_bytes:
        return _error(
            414,
            "uri_too_long",
            f"the request target is longer than {limits.max_url_bytes} bytes",
        )
    header_bytes = sum(len(k) + len(v) + 4 for k, v in request.raw_headers)
    if header_bytes > limits.max_header_bytes:
        return _error(
            431,
            "headers_too_large",
            f"the request headers are larger than {limits.max_header_bytes} bytes",
        )
    if (request.match_info.route.name or "").startswith(RSM_ROUTE_PREFIX):
        return await _admit_rsm(request, handler)
    if request.content_length or request.headers.get("Transfer-Encoding"):
        return _error(413, "request_too_large", "requests to this API have no body")
    if request.method not in ("GET", "HEAD"):
        return _error(405, "method_not_allowed", f"{request.method} is not allowed; use GET")
    return await handler(request)


async def _admit_rsm(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The broker plugin's routes (``sidecar.readserver.rsm``): POST with a JSON body of a
    declared length, at most ``RSM_MAX_BODY_BYTES``, of a protocol version this server speaks
    (a request without the header is taken as this version)."""
    if request.method != "POST":
        return _error(405, "method_not_allowed", f"{request.method} is not allowed; use POST")
    if request.headers.get("Transfer-Encoding") or request.content_length is None:
        return _error(411, "length_required", "the request body needs a Content-Length")
    if request.content_length > RSM_MAX_BODY_BYTES:
        return _error(
            413, "request_too_large", f"the request body is larger than {RSM_MAX_BODY_BYTES} bytes"
        )
    protocol = request.headers.get(RSM_PROTOCOL_HEADER)
    if protocol is not None and protocol.strip() != str(RSM_PROTOCOL):
        shown = protocol.strip()[:16]
        logged = request.app[_PROTOCOLS_LOGGED_KEY].seen
        if shown not in logged and len(logged) < 16:
            logged.add(shown)
            log.error(
                "rsm_protocol_unsupported",
                protocol=shown,
                supported=RSM_PROTOCOL,
                sidecar_version=__version__,
            )
        return _error(
            400,
            "unsupported_protocol",
            f"the broker plugin sends requests of protocol {shown!r}; this sidecar"
            f" ({__version__}) speaks protocol {RSM_PROTOCOL}: give the broker the plugin jar"
            " of this sidecar's release (the path `sidecar broker-config` prints)",
            supported=RSM_PROTOCOL,
        )
    activity = request.app.get(PLUGIN_ACTIVITY_KEY)
    if activity is not None:
        activity.last_request_at = time.time()
    return await handler(request)


# ---------------------------------------------------------------------------------------------
# parsing


def _query(
    request: web.Request, allowed: frozenset[str], *, repeatable: frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    query = request.rel_url.query
    found: dict[str, list[str]] = {}
    for name in query:
        if name in found:
            continue
        values = query.getall(name)
        if name not in allowed:
            raise BadRequestError(f"unknown query parameter {name[:64]!r}", allowed=sorted(allowed))
        if len(values) > 1 and name not in repeatable:
            raise BadRequestError(f"query parameter {name!r} is given more than once")
        found[name] = list(values)
    return found


def _int(value: str, name: str, low: int, high: int) -> int:
    if not _INT.match(value):
        raise BadRequestError(f"{name} must be an integer, got {value[:64]!r}")
    number = int(value)
    if not low <= number <= high:
        raise BadRequestError(f"{name} must be between {low} and {high}, got {number}")
    return number


def _topic(request: web.Request) -> str:
    topic = request.match_info["topic"]
    if not _TOPIC.match(topic) or topic in {".", ".."}:
        raise BadRequestError(
            f"{topic[:64]!r} is not a Kafka topic name (1-249 of a-z A-Z 0-9 . _ -)"
        )
    return topic


def _kafka_uuid(text: str, what: str) -> uuid.UUID:
    """Kafka's 22-character base64 Uuid, or a 400 naming ``what``."""
    try:
        value = decode_kafka_uuid(text) if len(text) == 22 else None
    except ValueError:
        value = None
    if value is None:
        raise BadRequestError(f"{what} {text[:64]!r} is not Kafka's 22-character base64 Uuid")
    return value


def _segment_id(request: web.Request) -> uuid.UUID:
    return _kafka_uuid(request.match_info["segment_id"], "segment id")


_PARTITION_PARAMS: Final = frozenset({"topic_id"})


async def _partition(request: web.Request, query: dict[str, list[str]]) -> TopicIdPartition:
    topic = _topic(request)
    partition = _int(request.match_info["partition"], "partition", 0, _MAX_INT32)
    topic_id = None
    if "topic_id" in query:
        topic_id = _kafka_uuid(query["topic_id"][0], "topic_id")
    return await request.app[SERVICE_KEY].resolve(topic, partition, topic_id)


def _tiered(found: tuple[int, int] | None) -> dict[str, int] | None:
    return None if found is None else {"start_offset": found[0], "end_offset": found[1]}


def _partition_json(tp: TopicIdPartition) -> dict[str, Any]:
    return {
        "topic": tp.topic,
        "partition": tp.partition,
        "topic_id": encode_kafka_uuid(tp.topic_id),
    }


# ---------------------------------------------------------------------------------------------
# handlers


async def _version(request: web.Request) -> web.StreamResponse:
    _query(request, frozenset())
    return _json(200, {"api": "v1", "version": __version__})


async def _openapi(request: web.Request) -> web.StreamResponse:
    _query(request, frozenset())
    text = await asyncio.to_thread(OPENAPI_PATH.read_bytes)
    return web.Response(body=text, content_type="application/yaml")


async def _topics(request: web.Request) -> web.StreamResponse:
    _query(request, frozenset())
    found = await request.app[SERVICE_KEY].topics()
    return _json(
        200,
        {
            "topics": [
                {
                    "topic": t.topic,
                    "topic_id": encode_kafka_uuid(t.topic_id),
                    "partitions": list(t.partitions),
                }
                for t in found
            ]
        },
    )


async def _topic_info(request: web.Request) -> web.StreamResponse:
    """One topic of ``/v1/topics`` (one entry per topic id, as the listing has)."""
    _query(request, frozenset())
    topic = _topic(request)
    found = [t for t in await request.app[SERVICE_KEY].topics() if t.topic == topic]
    if not found:
        raise UnknownTopicError(f"no tiered data for topic {topic!r}")
    entries = [
        {
            "topic": t.topic,
            "topic_id": encode_kafka_uuid(t.topic_id),
            "partitions": list(t.partitions),
        }
        for t in found
    ]
    return _json(200, {**entries[0], "topic_ids": [e["topic_id"] for e in entries]})


async def _partition_info(request: web.Request) -> web.StreamResponse:
    query = _query(request, _PARTITION_PARAMS)
    tp = await _partition(request, query)
    service = request.app[SERVICE_KEY]
    spans = await service.spans(tp)
    segments = {s.segment.segment_id.id: s.segment for s in spans}
    return _json(
        200,
        {
            **_partition_json(tp),
            "tiered": _tiered(await service.tiered_range(tp)),
            "segments": len(segments),
            "bytes": sum(s.segment_size_in_bytes for s in segments.values()),
        },
    )


def _segment_json(
    segment: SegmentMetadata, serves: list[list[int]] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "segment_id": encode_kafka_uuid(segment.segment_id.id),
        "state": segment.state.name,
        "start_offset": segment.start_offset,
        "end_offset": segment.end_offset,
        "max_timestamp_ms": segment.max_timestamp_ms,
        "size_bytes": segment.segment_size_in_bytes,
        "leader_epochs": [list(e) for e in segment.segment_leader_epochs],
        "txn_index_empty": segment.txn_index_empty,
        "broker_id": segment.broker_id,
        "event_timestamp_ms": segment.event_timestamp_ms,
    }
    if serves is not None:
        body["serves"] = serves
    return body


def _serves(spans: list[SegmentSpan]) -> dict[uuid.UUID, list[list[int]]]:
    found: dict[uuid.UUID, list[list[int]]] = {}
    for span in spans:
        found.setdefault(span.segment.segment_id.id, []).append(
            [span.start_offset, span.end_offset]
        )
    return found


async def _segments(request: web.Request) -> web.StreamResponse:
    query = _query(request, _PARTITION_PARAMS | {"state"}, repeatable=frozenset({"state"}))
    tp = await _partition(request, query)
    states: set[RemoteLogSegmentState] = set()
    for value in query.get("state", []):
        for name in value.split(","):
            state = _STATES.get(name.strip().upper())
            if state is None:
                raise BadRequestError(
                    f"state {name[:64]!r} is not one of {', '.join(sorted(_STATES))}"
                )
            states.add(state)
    service = request.app[SERVICE_KEY]
    segments = await service.segments(tp, states or RemoteSegmentStore.LIVE_STATES)
    spans = await service.spans(tp)
    serves = _serves(spans)
    return _json(
        200,
        {
            **_partition_json(tp),
            "tiered": _tiered(await service.tiered_range(tp)),
            "segments": [_segment_json(s, serves.get(s.segment_id.id, [])) for s in segments],
        },
    )


async def _segment(request: web.Request) -> web.StreamResponse:
    query = _query(request, _PARTITION_PARAMS)
    tp = await _partition(request, query)
    segment_id = _segment_id(request)
    service = request.app[SERVICE_KEY]
    for segment in await service.segments(tp):
        if segment.segment_id.id == segment_id:
            serves = _serves(await service.spans(tp)).get(segment_id, [])
            return _json(200, {**_partition_json(tp), **_segment_json(segment, serves)})
    raise UnknownSegmentError(f"{tp.topic}-{tp.partition} has no remote segment {segment_id}")


async def _segment_log(request: web.Request) -> web.StreamResponse:
    query = _query(request, _PARTITION_PARAMS | {"start", "end"})
    tp = await _partition(request, query)
    segment_id = _segment_id(request)
    start = _int(query["start"][0], "start", 0, _MAX_INT32) if "start" in query else 0
    end = _int(query["end"][0], "end", 0, _MAX_INT32) if "end" in query else None
    stream = await request.app[SERVICE_KEY].segment_range(tp, segment_id, start, end)
    response = web.StreamResponse(
        headers={"Content-Type": "application/octet-stream", "Cache-Control": "no-store"}
    )
    response.content_length = stream.length
    if isinstance(stream, Plan):
        return await _send_plan(request, response, stream, endpoint="segment_log")
    return await _send(request, response, _pieces(stream), endpoint="segment_log")


async def _pieces(stream: ByteStream) -> AsyncGenerator[memoryview, None]:
    async for piece in stream:
        yield piece


async def _segment_index(request: web.Request) -> web.StreamResponse:
    query = _query(request, _PARTITION_PARAMS)
    tp = await _partition(request, query)
    segment_id = _segment_id(request)
    name = request.match_info["index_type"]
    kind = _INDEX_TYPES.get(name)
    if kind is None:
        raise BadRequestError(
            f"index type {name[:64]!r} is not one of {', '.join(sorted(_INDEX_TYPES))}"
        )
    data = await request.app[SERVICE_KEY].index(tp, segment_id, kind)
    return web.Response(body=data, content_type="application/octet-stream")


async def _offsets(request: web.Request) -> web.StreamResponse:
    query = _query(request, _PARTITION_PARAMS | {"timestamp"})
    tp = await _partition(request, query)
    if "timestamp" not in query:
        raise BadRequestError("timestamp (milliseconds since the epoch) is required")
    timestamp = _int(query["timestamp"][0], "timestamp", MAX_TIMESTAMP, _MAX_INT64)
    service = request.app[SERVICE_KEY]
    found = await service.list_offset(tp, timestamp)
    return _json(
        200,
        {
            **_partition_json(tp),
            "offset": None if found is None else found.offset,
            "timestamp": None if found is None else found.timestamp,
            "leader_epoch": None if found is None else found.leader_epoch,
            "tiered": _tiered(await service.tiered_range(tp)),
        },
    )


_RECORD_PARAMS: Final = _PARTITION_PARAMS | {
    "offset",
    "max_bytes",
    "max_records",
    "format",
    "isolation",
}
#: aborted transactions a raw read_committed response lists at most (beyond those already
#: open at ``offset``): the header stays a few KiB; the response stops before the next one
MAX_LISTED_ABORTS: Final = 100


async def _records(request: web.Request) -> web.StreamResponse:
    query = _query(request, _RECORD_PARAMS)
    limits = request.app[LIMITS_KEY]
    tp = await _partition(request, query)
    if "offset" not in query:
        raise BadRequestError("offset is required")
    offset = _int(query["offset"][0], "offset", 0, _MAX_INT64)
    max_bytes = limits.default_response_bytes
    if "max_bytes" in query:
        max_bytes = _int(query["max_bytes"][0], "max_bytes", 1, _MAX_INT32)
    max_bytes = min(max_bytes, limits.max_response_bytes)
    fmt = query.get("format", ["raw"])[0]
    if fmt not in ("raw", "json"):
        raise BadRequestError(f"format must be raw or json, got {fmt[:64]!r}")
    max_records = limits.max_records
    if "max_records" in query:
        max_records = min(
            _int(query["max_records"][0], "max_records", 1, _MAX_INT32), limits.max_records
        )
    isolation = IsolationLevel.READ_UNCOMMITTED
    if "isolation" in query:
        try:
            isolation = IsolationLevel(query["isolation"][0])
        except ValueError:
            raise BadRequestError(
                "isolation must be read_uncommitted or read_committed, got"
                f" {query['isolation'][0][:64]!r}"
            ) from None
    service = request.app[SERVICE_KEY]
    tiered = await service.tiered_range(tp)
    headers = {
        "X-Topic-Id": encode_kafka_uuid(tp.topic_id),
        "X-Isolation-Level": isolation.value,
        "Cache-Control": "no-store",
    }
    if tiered is not None:
        headers["X-Tiered-Start-Offset"] = str(tiered[0])
        headers["X-Tiered-End-Offset"] = str(tiered[1])
    committed: CommittedFilter | None = None
    limit: int | None = None
    if isolation is IsolationLevel.READ_COMMITTED:
        aborted, limit = await service.aborted_transactions(
            tp, offset, max_bytes, cap=MAX_LISTED_ABORTS if fmt == "raw" else None
        )
        if fmt == "raw":
            headers[ABORTED_TRANSACTIONS_HEADER] = format_aborted(aborted)
        else:
            committed = CommittedFilter(aborted)
    if fmt == "raw":
        if "max_records" in query:
            # whole batches, as a broker's fetch: those ending below offset + max_records, and
            # always the first
            cap = offset + max_records
            limit = cap if limit is None else min(limit, cap)
        headers["Content-Type"] = RECORD_BATCHES_TYPE
        response = web.StreamResponse(headers=headers)
        plan = await service.plan_records(tp, offset, max_bytes, limit_offset=limit)
        if plan is not None:  # verified before, still cached: sent without reading it
            response.content_length = plan.length
            return await _send_plan(request, response, plan, endpoint="records")
        runs = await service.runs(tp, offset, max_bytes, limit_offset=limit)
        return await _send(request, response, _raw_pieces(runs), endpoint="records")
    stream = await service.batches(tp, offset, max_bytes, limit_offset=limit)
    headers["Content-Type"] = "application/json"
    response = web.StreamResponse(headers=headers)
    head = json.dumps({**_partition_json(tp), "tiered": _tiered(tiered)}, separators=(",", ":"))
    pieces = _json_pieces(stream, head[:-1].encode(), offset, max_records, committed)
    return await _send(request, response, pieces, endpoint="records")


async def _raw_pieces(stream: RunStream) -> AsyncGenerator[memoryview, None]:
    async for run in stream:
        for piece in run.pieces:
            yield piece


def _b64_json(data: bytes | None) -> bytes:
    return b"null" if data is None else b'"' + base64.b64encode(data) + b'"'


def _record_json(record: Record, leader_epoch: int) -> bytes:
    """One record as compact JSON, formatted directly (half the CPU of building a dict for
    ``json.dumps``; the same bytes): the fields are numbers, enum names and base64, and header
    keys, the only free text, go through ``json.dumps``."""
    headers = b",".join(
        b'{"key":%s,"value":%s}' % (json.dumps(key).encode(), _b64_json(value))
        for key, value in record.headers
    )
    return (
        b'{"offset":%d,"timestamp":%d,"timestamp_type":"%s","leader_epoch":%d,'
        b'"key":%s,"value":%s,"headers":[%s]}'
        % (
            record.offset,
            record.timestamp,
            record.timestamp_type.name.encode(),
            leader_epoch,
            _b64_json(record.key),
            _b64_json(record.value),
            headers,
        )
    )


class _JsonEncoder:
    """The records of a JSON response, a chunk of batches at a time, in a worker thread: the
    decoding (decompression) and JSON encoding of a large range would hold the event loop for
    about a second. One chunk is encoded at a time, in order, so the state needs no lock."""

    def __init__(self, offset: int, max_records: int, committed: CommittedFilter | None) -> None:
        self.next_offset = offset
        self.count = 0
        self.full = False
        self._max_records = max_records
        self._committed = committed
        self._separator = b""
        #: chunks encoded (tests count them: each is one thread hop)
        self.chunks = 0

    def encode(self, batches: list[Batch]) -> bytes:
        """(thread) The JSON of the records of ``batches`` from ``next_offset`` on, each record
        preceded by its separator; stops at ``max_records``."""
        self.chunks += 1
        out: list[bytes] = []
        for batch in batches:
            header = batch.header
            records = None
            if self._committed is not None:
                control = None
                if header.is_control:
                    records = decode_batch(batch)
                    control = records[0].control_type if records else None
                if not self._committed.accept(header, control):
                    self.next_offset = max(self.next_offset, header.next_offset)
                    continue
            if header.is_control:  # transaction markers are not data
                self.next_offset = max(self.next_offset, header.next_offset)
                continue
            epoch = header.partition_leader_epoch
            for record in records if records is not None else decode_batch(batch):
                if record.offset < self.next_offset:
                    continue
                out.append(self._separator)
                out.append(_record_json(record, epoch))
                self._separator = b","
                self.next_offset = record.offset + 1
                self.count += 1
                if self.count >= self._max_records:
                    self.full = True
                    return b"".join(out)
            self.next_offset = max(self.next_offset, header.next_offset)
        return b"".join(out)


#: batch bytes handed to one encoding thread hop: bounds a chunk's decoded records and JSON
#: (zstd at 10:1 makes about 4 MiB of JSON of it) while keeping hops few for small batches
_JSON_CHUNK_BYTES: Final = 256 * 1024
#: the threads that decode and encode JSON responses: the work holds the GIL, so more threads
#: than this take it from the event loop more often without encoding faster, and a pool of its
#: own keeps them from queueing ahead of the chunk cache's file I/O in the default executor
_JSON_THREADS: Final = concurrent.futures.ThreadPoolExecutor(
    max_workers=2, thread_name_prefix="read-json"
)


async def _json_pieces(
    stream: BatchStream,
    head: bytes,
    offset: int,
    max_records: int,
    committed: CommittedFilter | None = None,
) -> AsyncGenerator[memoryview, None]:
    """``{...head, "records": [...], "next_offset": N}``, about ``_JSON_CHUNK_BYTES`` of batches
    at a time, decoded and encoded in a worker thread; with ``committed``, the batches of
    aborted transactions are left out (read_committed)."""
    yield memoryview(head + b',"records":[')
    encoder = _JsonEncoder(offset, max_records, committed)
    loop = asyncio.get_running_loop()
    pending: list[Batch] = []
    size = 0
    records = 0  # at most this many records in ``pending`` (control and aborted ones drop out)
    async for batch in stream:
        # a copy: the batch's views are of a cache window the stream moves past
        data = batch.tobytes()
        pending.append(Batch(batch.header, [memoryview(data)]))
        size += len(data)
        records += batch.header.last_offset_delta + 1
        # a chunk ends at its byte size, or once it may hold every record still wanted: a
        # small ``max_records`` must not read (and fetch from S3) far past what it returns
        if size >= _JSON_CHUNK_BYTES or records >= max_records - encoder.count:
            out = await loop.run_in_executor(_JSON_THREADS, encoder.encode, pending)
            pending, size, records = [], 0, 0
            if out:
                yield memoryview(out)
            if encoder.full:
                break
    if pending and not encoder.full:
        out = await loop.run_in_executor(_JSON_THREADS, encoder.encode, pending)
        if out:
            yield memoryview(out)
    yield memoryview(f'],"next_offset":{encoder.next_offset}}}'.encode())


async def _send(
    request: web.Request,
    response: web.StreamResponse,
    pieces: AsyncGenerator[memoryview, None],
    *,
    endpoint: str,
) -> web.StreamResponse:
    """Stream ``pieces`` (coalesced into writes of about 256 KiB) with the socket's backpressure;
    a failure after the status line closes the connection mid-body. Chunked framing is written
    around the pieces (aiohttp's writer would join each frame into a new buffer on Python
    < 3.12.9), so the bytes are copied only into the socket."""
    metrics = request.app.get(METRICS_KEY)
    stall_s = request.app[LIMITS_KEY].send_stall_s
    sent = 0
    _large_send_buffer(request)
    writer = await response.prepare(request)
    chunked = response.headers.get(hdrs.TRANSFER_ENCODING, "").lower() == "chunked"
    pending: list[memoryview] = []
    pending_bytes = 0

    async def flush() -> None:
        transport = request.transport
        if chunked and transport is not None and writer is not None:
            write = _write_chunk(transport, writer, pending, pending_bytes)
        else:
            write = response.write(pending[0] if len(pending) == 1 else b"".join(pending))
        await _to_client(write, request, stall_s)

    try:
        if request.method == "HEAD" or writer is None:
            # headers only: a body written after a HEAD response would corrupt the next
            # response on a kept-alive connection
            await pieces.aclose()
            await _to_client(response.write_eof(), request, stall_s)
            return response
        async for piece in pieces:
            pending.append(piece)
            pending_bytes += len(piece)
            if pending_bytes >= _WRITE_BYTES:
                await flush()
                sent += pending_bytes
                pending, pending_bytes = [], 0
        if pending:
            await flush()
            sent += pending_bytes
        await _to_client(response.write_eof(), request, stall_s)
    except _ClientGoneError as exc:
        _client_gone(request, response, exc, endpoint=endpoint, sent=sent)
    except asyncio.CancelledError:
        raise  # the server is stopping
    except Exception as exc:  # noqa: BLE001 - any failure mid-body ends the connection
        _abort_mid_body(request, exc, endpoint=endpoint, sent=sent)
    finally:
        await pieces.aclose()
        if metrics is not None:
            metrics.read_bytes.labels(endpoint).inc(sent)
    return response


class _ClientGoneError(Exception):
    """A write of a response body failed: the client closed its connection."""


class _ClientStalledError(TimeoutError):
    """The client took no bytes of its response for ``ReadLimits.send_stall_s``: counted as
    the deadline it is (``storage_timeout``), and its connection is aborted."""


async def _to_client(
    write: Awaitable[None], request: web.Request | None = None, stall_s: float | None = None
) -> None:
    """One write of a response body to the client. With ``request`` and ``stall_s``, a client
    that takes none of the transport's buffered bytes for ``stall_s`` fails it (a write that
    sends around the transport, ``sendfile``, has its own deadline). A closed connection
    (aiohttp's ``ClientConnectionResetError``, a broken pipe under ``sendfile``) is
    :class:`_ClientGoneError`, a stalled one :class:`_ClientStalledError`: both told apart
    from failures of the data being sent."""
    transport = request.transport if request is not None else None
    try:
        if transport is not None and stall_s is not None:
            await progressing(transport, write, stall_s)
        else:
            await write
    except ConnectionError as exc:
        raise _ClientGoneError(str(exc) or type(exc).__name__) from exc
    except TimeoutError as exc:
        raise _ClientStalledError(str(exc) or "the client took no bytes of the response") from exc


def _client_gone(
    request: web.Request,
    response: web.StreamResponse,
    exc: _ClientGoneError,
    *,
    endpoint: str,
    sent: int,
) -> None:
    """The client closed its connection before the whole body was sent (the broker plugin
    closes the reads it stops early): not a server error, and nothing more can be written.
    Counted under status ``CLIENT_CLOSED_STATUS``, logged at debug."""
    response[_CLIENT_GONE] = True
    log.debug("read_client_gone", endpoint=endpoint, sent=sent, error=str(exc))
    if request.transport is not None:
        request.transport.close()


def _abort_mid_body(request: web.Request, exc: Exception, *, endpoint: str, sent: int) -> None:
    """The status line is out, so a failure can only end the connection: the client sees a
    short body. Logged and counted like an error response."""
    code = error_response(exc)
    log.warning(
        "read_response_aborted",
        endpoint=endpoint,
        sent=sent,
        status=code.status,
        error=str(exc) or type(exc).__name__,
    )
    metrics = request.app.get(METRICS_KEY)
    if metrics is not None:
        metrics.read_errors.labels(_error_code(code) or "internal_error").inc()
    if request.transport is not None:
        if isinstance(exc, _ClientStalledError):
            request.transport.abort()  # close() would wait for the client to take the buffer
        else:
            request.transport.close()


async def _send_plan(
    request: web.Request, response: web.StreamResponse, plan: Plan, *, endpoint: str
) -> web.StreamResponse:
    """Send a planned response (its Content-Length set): pieces in memory are written, file
    ranges go with ``sendfile`` (small ones are read and written); a failure after the status
    line closes the connection mid-body, as in :func:`_send`."""
    metrics = request.app.get(METRICS_KEY)
    stall_s = request.app[LIMITS_KEY].send_stall_s
    sent = 0
    _large_send_buffer(request)
    try:
        writer = await response.prepare(request)
        if request.method == "HEAD" or writer is None:
            await _to_client(response.write_eof(), request, stall_s)
            return response
        for piece in plan.pieces:
            if not isinstance(piece, FileRange):
                await _to_client(response.write(piece), request, stall_s)
            elif piece.length < _SENDFILE_MIN_BYTES:
                data = await asyncio.to_thread(_pread_exact, piece)
                await _to_client(response.write(data), request, stall_s)
            else:
                await _to_client(_sendfile(request, writer, piece, stall_s=stall_s))
            sent += piece.length if isinstance(piece, FileRange) else len(piece)
        await _to_client(response.write_eof(), request, stall_s)
    except _ClientGoneError as exc:
        _client_gone(request, response, exc, endpoint=endpoint, sent=sent)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure mid-body ends the connection
        _abort_mid_body(request, exc, endpoint=endpoint, sent=sent)
    finally:
        plan.close()
        if metrics is not None:
            metrics.read_bytes.labels(endpoint).inc(sent)
    return response


async def _write_chunk(
    transport: asyncio.Transport,
    writer: AbstractStreamWriter,
    parts: list[memoryview],
    size: int,
) -> None:
    """One chunk of a chunked body: its size line, ``parts`` and CRLF handed to the transport
    as they are (it sends them with one writev, copying only what the socket does not take),
    then the writer's backpressure."""
    if transport.is_closing():
        raise ConnectionResetError("the client went away")
    writer.send_headers()
    transport.writelines([f"{size:x}\r\n".encode(), *parts, b"\r\n"])
    await writer.drain()


def _large_send_buffer(request: web.Request) -> None:
    """Ask for a socket send buffer of ``_SEND_BUFFER_BYTES`` (the kernel caps it at
    ``net.core.wmem_max``): a large response then goes out in a few event-loop turns instead
    of one per default-sized buffer (about 200 KiB), which on a busy host costs a wake-up
    each."""
    transport = request.transport
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < _SEND_BUFFER_BYTES:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER_BYTES)


def _pread_exact(piece: FileRange) -> bytes:
    """(thread) The bytes of a file range."""
    data = os.pread(piece.fd, piece.length, piece.offset)
    if len(data) != piece.length:
        raise RemoteDataError("a cached chunk file is shorter than it was")
    return data


async def _sendfile(
    request: web.Request, writer: AbstractStreamWriter, piece: FileRange, *, stall_s: float = 60.0
) -> None:
    """Send a file range on the request's socket with ``sendfile`` (``sidecar._sendfile``),
    after the transport's buffer is flushed. A client that reads nothing for ``stall_s`` is a
    TimeoutError, while the buffer is flushed as while the file is sent."""
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client went away")
    writer.send_headers()  # aiohttp holds them back to go with the first body write
    await flushed(transport, writer.drain, stall_s=stall_s)
    sock = plain_socket(transport)
    if sock is None:
        raise ConnectionResetError("the client went away")
    try:
        await send_file_range(sock, piece.fd, piece.offset, piece.length, stall_s=stall_s)
    except ShortFileError:
        raise RemoteDataError("a cached chunk file is shorter than it was") from None


def add_routes(app: web.Application) -> None:
    """The v1 routes (each named, for the metrics' ``endpoint`` label)."""
    base = "/v1/topics/{topic}/partitions/{partition}"
    segment = base + "/segments/{segment_id}"
    app.router.add_get("/v1/version", _version, name="version")
    app.router.add_get("/v1/openapi.yaml", _openapi, name="openapi")
    app.router.add_get("/v1/topics", _topics, name="topics")
    app.router.add_get("/v1/topics/{topic}", _topic_info, name="topic")
    app.router.add_get(base, _partition_info, name="partition")
    app.router.add_get(base + "/records", _records, name="records")
    app.router.add_get(base + "/offsets", _offsets, name="offsets")
    app.router.add_get(base + "/segments", _segments, name="segments")
    app.router.add_get(segment, _segment, name="segment")
    app.router.add_get(segment + "/log", _segment_log, name="segment_log")
    app.router.add_get(segment + "/indexes/{index_type}", _segment_index, name="segment_index")
    app[_IN_FLIGHT_KEY] = _InFlight()
    app[_PROTOCOLS_LOGGED_KEY] = _ProtocolsLogged()
