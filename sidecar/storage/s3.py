"""The S3 backend of :class:`~sidecar.storage.base.ObjectStore`, on aiobotocore.

* Integrity: every upload carries a CRC-32C we compute (``x-amz-checksum-crc32c``), which a
  store that supports it verifies; botocore adds no checksum of its own (``when_required``), and
  by default the payload is not SHA-256 signed either (the signed checksum header protects it
  for a fraction of the CPU). Each part's echoed checksum and the multipart object's composite
  checksum (CRC-32C of the part CRCs, ``-N``) are compared with ours; the whole-file CRC-32C we
  return is combined from the part CRCs. Full-object checksums returned by ``get`` are verified.
  A store may store an upload without echoing the checksum (it may not have checked it at all).
  Then ``checksum_echo`` decides: ``"verify"`` (default) asks for the stored object's checksum
  with a HEAD (``ChecksumMode=ENABLED``) and, when that has none either, checks the stored size
  and reads back the last part (a single PUT: the whole object) to compare its CRC-32C, so a
  multipart upload's earlier parts are then covered only by the size and the transport's own
  checks; ``"refuse"`` fails the upload (:class:`~sidecar.errors.ChecksumNotEchoedError`) and
  deletes what was stored. Each case is counted in ``s3_unechoed_uploads_total``.
* Errors are translated here and nowhere else, always ``from`` the original: see
  :mod:`sidecar.storage.base`. Messages name the operation and the key, never a credential.
* Every request attempt has a timeout; transient failures are retried by the one policy in
  :mod:`sidecar.storage._retry` (botocore's own retries are off). A failed multipart upload is
  aborted best-effort; the orphan scrub removes whatever an abort could not.
* With an upload throttle (:class:`~sidecar.storage.throttle.TokenBucket`, the daemon's
  bandwidth cap), every upload body is charged to it before it is read or sent: each part of a
  multipart upload, each single PUT. The wait is outside the per-attempt timeout, and a retried
  attempt is not charged again. Copies inside the store and reads are never charged.
* Ranged GETs (the read path) on a plain ``http://`` endpoint without a proxy go through
  :mod:`sidecar.storage._rawget` (``raw_range_gets``): presigned by botocore, each body received
  straight into its buffer, without botocore's and aiohttp's per-request work and copies. A
  response that client does not take sends this store back to botocore for good (logged once).
* Every request attempt goes through :meth:`S3ObjectStore._call`, which also measures it: the
  ``s3_requests_total``, ``s3_request_errors_total`` and ``s3_request_seconds`` metrics by S3
  operation (a fixed set, ``S3_OPERATIONS``) and, for errors, a reason from a fixed set.

This module never imports :mod:`sidecar.config`; :meth:`S3ObjectStore.from_config` accepts any
object with the fields of ``S3Config``. The key prefix is the caller's business (``keys.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import os
import re
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal, Protocol, Self, TypeVar
from urllib.parse import SplitResult, urlsplit

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore import handlers as botocore_handlers
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    FlexibleChecksumError,
    HTTPClientError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from sidecar.errors import (
    ChecksumMismatchError,
    ChecksumNotEchoedError,
    ConditionalWriteUnsupportedError,
    InvalidRangeError,
    KeyNotFoundError,
    ObjectTooLargeError,
    StorageAccessError,
    StorageError,
)
from sidecar.observability.logging import get_logger
from sidecar.observability.metrics import Metrics
from sidecar.storage import _payload  # noqa: F401  (aiohttp sends part bodies without copies)
from sidecar.storage._body import read_body
from sidecar.storage._crc import composite_checksum, decode_checksum, encode_checksum
from sidecar.storage._parts import (
    FilePart,
    FilePartBody,
    PartBody,
    PartChangedError,
    PartReader,
    batches,
    check_page_size,
    check_range,
    check_upload_args,
    combine_parts,
    crc32c_off_loop,
    open_parts,
    plan_parts,
)
from sidecar.storage._rawget import (
    BodyHook,
    RangeGetter,
    RawResponse,
    UnsupportedResponseError,
)
from sidecar.storage._retry import RetryPolicy, retrying
from sidecar.storage.base import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PAGE_SIZE,
    DEFAULT_PART_SIZE,
    DELETE_BATCH_SIZE,
    Arrivals,
    MultipartUpload,
    ObjectInfo,
    abort_uploads_of,
)
from sidecar.storage.throttle import TokenBucket

__all__ = ["ChecksumEcho", "S3ObjectStore", "S3Settings"]

#: what to do with an upload the store answered without its CRC-32C echo (see the docstring)
ChecksumEcho = Literal["verify", "refuse"]

T = TypeVar("T")

log = get_logger(__name__)

#: what one request attempt can raise from the client and its HTTP stack
_CLIENT_ERRORS = (ClientError, BotoCoreError, aiohttp.ClientError, OSError)  # OSError ⊃ Timeout
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_BAD_RANGE_CODES = frozenset({"InvalidRange", "416"})
_BAD_CHECKSUM_CODES = frozenset({"BadDigest", "XAmzContentChecksumMismatch", "InvalidDigest"})
_ACCESS_CODES = frozenset(
    {"AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId", "NoSuchBucket", "403"}
)
#: error codes worth another attempt, whatever their HTTP status
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        *_BAD_CHECKSUM_CODES,  # our checksum was computed from the bytes we send: transit damage
    }
)
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
#: an S3 error body's code and message
_ERROR_CODE = re.compile(rb"<Code>([^<]{1,128})</Code>")
_ERROR_MESSAGE = re.compile(rb"<Message>([^<]{0,1024})</Message>")
#: how long a presigned ranged GET stays valid (it is sent at once; retries presign anew)
_PRESIGN_EXPIRES_S = 900
#: how long an upload cancelled mid-way may spend aborting its multipart upload
_ABORT_WHEN_CANCELLED_S = 5.0
#: the slowest rate an upload attempt's deadline allows for its body (1 Mbit/s: a few Mbit/s
#: of uplink shared by the uploads in flight); a stalled send ends sooner, at the sendfile
#: stall check. Reads keep the plain request timeout: a reader waits on them
_SLOWEST_LINK_BYTES_PER_S = 128 * 1024
#: our operation names (error messages) → the ``operation`` label (the S3 API's names)
_OPERATION_LABELS: dict[str, str] = {
    "put": "put_object",
    "create_multipart_upload": "create_multipart_upload",
    "upload_part": "upload_part",
    "complete_multipart_upload": "complete_multipart_upload",
    "abort_multipart_upload": "abort_multipart_upload",
    "list_multipart_uploads": "list_multipart_uploads",
    "get": "get_object",
    "get_range": "get_object",
    "head": "head_object",
    "copy": "copy_object",
    "list": "list_objects",
    "delete": "delete_objects",
}
#: operations whose ``key`` is a prefix (may be empty); every other one names an object
_PREFIX_OPERATIONS = frozenset({"list", "list_multipart_uploads"})
_THROTTLE_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded"}
)


class _Secret(Protocol):
    def get_secret_value(self) -> str: ...


class S3Settings(Protocol):
    """The fields :meth:`S3ObjectStore.from_config` reads (``sidecar.config.S3Config``)."""

    @property
    def bucket(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def endpoint_url(self) -> str | None: ...
    @property
    def access_key_id(self) -> _Secret | None: ...
    @property
    def secret_access_key(self) -> _Secret | None: ...
    @property
    def path_style(self) -> bool: ...
    @property
    def request_timeout_s(self) -> float: ...
    @property
    def max_concurrency(self) -> int: ...
    @property
    def checksum_echo(self) -> ChecksumEcho: ...
    @property
    def sendfile_uploads(self) -> bool: ...
    @property
    def raw_range_gets(self) -> bool: ...


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class _UploadedPart:
    number: int
    etag: str
    crc32c: int
    length: int


def _error_code(exc: BaseException | None) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _http_status(exc: ClientError) -> int | None:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


async def _read_at_most(stream: Any, limit: int) -> bytes:
    """The body of ``stream`` up to its end or ``limit`` bytes, whichever comes first: a
    ``read(n)`` returns what has arrived, up to ``n`` bytes, so one read may stop anywhere in
    the body."""
    pieces: list[bytes] = []
    taken = 0
    while taken < limit:
        piece: bytes = await stream.read(limit - taken)
        if not piece:
            break
        pieces.append(piece)
        taken += len(piece)
    return b"".join(pieces)


def _is_transient(exc: BaseException) -> bool:
    """Whether another attempt may succeed: server trouble, throttling, timeouts, broken
    connections, damaged bytes. Never a missing key, a bad range, a refused signature or
    a malformed request."""
    if not isinstance(exc, StorageError) or not exc.retriable:
        return False
    cause = exc.__cause__
    if cause is None:  # our own verification of a response
        return True
    if isinstance(cause, ClientError):
        status = _http_status(cause) or 0
        if status == 501 or _error_code(cause) == "NotImplemented":
            return False  # a store that lacks a feature lacks it on the next attempt too
        return _error_code(cause) in _TRANSIENT_CODES or status >= 500 or status in (408, 429)
    if isinstance(cause, BotoCoreError):
        return isinstance(cause, BotoConnectionError | HTTPClientError)
    return isinstance(cause, aiohttp.ClientError | OSError)


def _error_reason(exc: BaseException) -> str:
    """The ``reason`` label (``S3_ERROR_REASONS``) of a failed request attempt."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, KeyNotFoundError):
        return "not_found"
    if isinstance(exc, InvalidRangeError):
        return "invalid_range"
    if isinstance(exc, ChecksumMismatchError):
        return "checksum_mismatch"
    if isinstance(exc, StorageAccessError):
        return "access_denied"
    if not isinstance(exc, StorageError):
        return "other"
    cause = exc.__cause__
    if isinstance(cause, ClientError):
        status = _http_status(cause) or 0
        if _error_code(cause) in _THROTTLE_CODES or status in (429, 503):
            return "throttled"
        return "server_error" if status >= 500 else "client_error"
    if isinstance(cause, TimeoutError | ReadTimeoutError | ConnectTimeoutError):
        return "timeout"
    if isinstance(cause, BotoConnectionError | HTTPClientError | aiohttp.ClientError | OSError):
        return "connection"
    return "other"


def _plain_http_without_proxy(endpoint_url: str | None) -> bool:
    """Whether requests to ``endpoint_url`` go over plain HTTP and not through a proxy
    (botocore takes proxies from the environment: ``HTTP_PROXY``, ``NO_PROXY``)."""
    if endpoint_url is None:
        return False  # AWS: https
    parts = urlsplit(endpoint_url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    proxies = urllib.request.getproxies_environment()
    if not ("http" in proxies or "all" in proxies):
        return True
    return bool(urllib.request.proxy_bypass(parts.hostname))


def _signed_host(parts: SplitResult) -> str:
    """The ``Host`` header a presigned URL was signed with: botocore signs the host in lower
    case, without userinfo and without the scheme's default port, not the URL's netloc as
    written (a store checks the signature against the Host header it receives)."""
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    default = {"http": 80, "https": 443}.get(parts.scheme)
    if parts.port is not None and parts.port != default:
        host = f"{host}:{parts.port}"
    return host


def _client_error(response: RawResponse, operation: str) -> ClientError:
    """The ``ClientError`` botocore would raise for an error response of the raw client (its
    code and message from the S3 error body; the HTTP status when the body has none)."""
    body = bytes(response.body[:65536])
    code = _ERROR_CODE.search(body)
    message = _ERROR_MESSAGE.search(body)
    error = {
        "Code": code[1].decode("utf-8", "replace") if code else str(response.status),
        "Message": message[1].decode("utf-8", "replace") if message else "",
    }
    return ClientError(
        {"Error": error, "ResponseMetadata": {"HTTPStatusCode": response.status}},
        operation,
    )


def _utc(value: object) -> datetime | None:
    """botocore's timestamps (dateutil tzutc or tzlocal) as ``datetime.UTC`` values."""
    return value.astimezone(UTC) if isinstance(value, datetime) else None


def _etag(response: dict[str, Any]) -> str | None:
    etag = response.get("ETag")
    return str(etag).strip('"') if etag else None


def _multipart_etag(part_etags: Sequence[str]) -> str | None:
    """The entity tag S3 gives a multipart object: the MD5 of its parts' MD5s, then ``-N``;
    None when a part's tag is not an MD5 (encrypted objects on some stores)."""
    try:
        digests = b"".join(bytes.fromhex(e.strip('"')) for e in part_etags)
    except ValueError:
        return None
    if len(digests) != 16 * len(part_etags):
        return None
    return f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(part_etags)}"


def _trim_per_request_hooks(client: Any) -> None:
    """Remove two botocore handlers that cost CPU on every request and guard nothing here.

    * ``add_expect_header`` sends ``Expect: 100-continue`` with every body that has ``read``
      (our part bodies): each part then waits a round trip for ``100 Continue`` before its body
      is written. It only saves bandwidth when a request is refused, which is rare and which
      our retry policy handles either way.
    * The user-agent rebuild re-renders the whole ``User-Agent`` string before every request
      (to add feature ids for AWS's telemetry), and every call renders it once more: the string
      rendered at client creation is kept and reused.

    Signing, checksum headers and response parsing are untouched.
    """
    events = client.meta.events
    events.unregister("before-call.s3", botocore_handlers.add_expect_header)
    service_id = client.meta.service_model.service_id.hyphenize()
    creator = getattr(client, "_user_agent_creator", None)
    if creator is not None:
        events.unregister(
            f"request-created.{service_id}", creator.rebuild_and_replace_user_agent_handler
        )
        user_agent = creator.to_string()
        creator.to_string = lambda: user_agent


async def _sending(body: PartBody | FilePartBody, call: Awaitable[T]) -> T:
    """One request attempt that sends ``body``: from its first byte, and, when a part streamed
    from its file failed (it shrank, or its bytes changed since their CRC-32C), with that error
    rather than the connection error the HTTP client makes of it."""
    body.seek(0)  # every attempt sends the whole body
    if isinstance(body, PartBody):
        return await call
    body.failure = None
    try:
        return await call
    except _CLIENT_ERRORS as exc:
        if body.failure is not None:
            raise body.failure from None
        if (
            body.sent_zero_copy
            and isinstance(exc, ClientError)
            and _error_code(exc) in _BAD_CHECKSUM_CODES
            and not await body.matches()
        ):
            raise PartChangedError(
                f"{body.path}: bytes {body.offset}-{body.offset + body.length - 1} changed"
                " since their CRC-32C was computed; the store refused them"
            ) from None
        raise


def _spans(content_range: str, start: int, length: int) -> bool:
    """Whether a ``Content-Range`` says its body is the ``length`` bytes from ``start``."""
    match = _CONTENT_RANGE.fullmatch(content_range)
    return match is not None and int(match[1]) == start and int(match[2]) - start + 1 == length


def _arrivals_hook(start: int, arrivals: Arrivals) -> BodyHook:
    """The raw client's body hook that tells ``arrivals`` of a ranged GET's bytes: only of a
    206 answer whose ``Content-Range`` starts at ``start`` and spans the body (what
    :meth:`S3ObjectStore._ranged` would accept); any other answer is told of not at all."""

    def hook(
        status: int, headers: dict[str, str], body: memoryview
    ) -> Callable[[int], None] | None:
        if status != 206 or not _spans(headers.get("content-range", ""), start, len(body)):
            return None
        arrivals.receiving(body)
        return arrivals.arrived

    return hook


class S3ObjectStore:
    """An S3 bucket (AWS or compatible: SeaweedFS, MinIO) as an :class:`ObjectStore`.

    ``S3ObjectStore(bucket="tiered", endpoint_url="http://127.0.0.1:8333")``; credentials None
    use botocore's default chain (environment, IRSA, instance profile). The client opens on
    ``async with`` or on first use; :meth:`aclose` closes it, after which calls raise
    ``RuntimeError``. ``upload_throttle`` caps the bytes per second of every upload through
    this store (module docstring).
    """

    def __init__(
        self,
        *,
        bucket: str,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        path_style: bool = True,
        request_timeout_s: float = 30.0,
        max_attempts: int = 4,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        max_connections: int = 32,
        sign_payload: bool = False,
        checksum_echo: ChecksumEcho = "verify",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        metrics: Metrics | None = None,
        upload_throttle: TokenBucket | None = None,
        sendfile_uploads: bool = True,
        raw_range_gets: bool = True,
    ) -> None:
        if request_timeout_s <= 0:
            raise ValueError("request_timeout_s must be positive")
        if checksum_echo not in ("verify", "refuse"):
            raise ValueError(f"checksum_echo must be 'verify' or 'refuse', not {checksum_echo!r}")
        self._checksum_echo = checksum_echo
        self._sign_payload = sign_payload
        self._sendfile_uploads = sendfile_uploads
        self._range_getter = (
            RangeGetter() if raw_range_gets and _plain_http_without_proxy(endpoint_url) else None
        )
        self._bucket = bucket
        self._endpoint_url = endpoint_url
        self._timeout_s = request_timeout_s
        self._retry = RetryPolicy(
            attempts=max_attempts, base_delay_s=backoff_s, max_delay_s=max_backoff_s
        )
        self._sleep = sleep
        self._metrics = metrics
        self._throttle = upload_throttle
        self._secrets = tuple(s for s in (access_key_id, secret_access_key) if s)
        credentials: dict[str, str] = {}
        if access_key_id is not None and secret_access_key is not None:
            credentials = {
                "aws_access_key_id": access_key_id,
                "aws_secret_access_key": secret_access_key,
            }
        self._client_args: dict[str, Any] = {
            "region_name": region,
            "endpoint_url": endpoint_url,
            **credentials,
            "config": AioConfig(
                signature_version="s3v4",
                s3={
                    "addressing_style": "path" if path_style else "virtual",
                    "payload_signing_enabled": sign_payload,
                },
                retries={"total_max_attempts": 1},  # retried by our policy, once
                connect_timeout=min(request_timeout_s, 10.0),
                read_timeout=request_timeout_s,
                max_pool_connections=max_connections,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                tcp_keepalive=True,
                # our calls are fixed in code and the store validates what it receives:
                # botocore's client-side schema walk is pure per-request CPU
                parameter_validation=False,
            ),
        }
        self._session = get_session()
        self._state = _State.UNOPENED
        self._client: Any = None
        self._exit_stack = contextlib.AsyncExitStack()
        self._open_lock = asyncio.Lock()

    @classmethod
    def from_config(cls, config: S3Settings, **overrides: Any) -> S3ObjectStore:
        """A store for ``sidecar.config.S3Config`` (secrets unwrapped here, and only here)."""

        def reveal(secret: _Secret | None) -> str | None:
            return None if secret is None else secret.get_secret_value()

        arguments: dict[str, Any] = {
            "bucket": config.bucket,
            "endpoint_url": config.endpoint_url,
            "region": config.region,
            "access_key_id": reveal(config.access_key_id),
            "secret_access_key": reveal(config.secret_access_key),
            "path_style": config.path_style,
            "request_timeout_s": config.request_timeout_s,
            "max_connections": max(32, 2 * config.max_concurrency),
            "checksum_echo": config.checksum_echo,
            "sendfile_uploads": config.sendfile_uploads,
            "raw_range_gets": config.raw_range_gets,
        }
        arguments.update(overrides)
        return cls(**arguments)

    def __repr__(self) -> str:
        return f"S3ObjectStore(endpoint_url={self._endpoint_url!r}, bucket={self._bucket!r})"

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._ensure_client()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client and its connection pool; idempotent."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        self._client = None
        if self._range_getter is not None:
            self._range_getter.close()
        await self._exit_stack.aclose()

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise RuntimeError("S3ObjectStore is closed")

    async def _ensure_client(self) -> Any:
        self._check_open()
        if self._client is None:
            async with self._open_lock:
                self._check_open()  # closed while we waited for the lock
                if self._client is None:
                    creator = self._session.create_client("s3", **self._client_args)
                    client = await self._exit_stack.enter_async_context(creator)
                    _trim_per_request_hooks(client)
                    self._client = client
                    self._state = _State.OPENED
        return self._client

    # -- the request boundary ------------------------------------------------------------

    async def _call(
        self,
        op: str,
        key: str | None,
        request: Callable[[Any], Awaitable[T]],
        *,
        body_bytes: int = 0,
    ) -> T:
        """One logical operation: attempts with a timeout each, errors mapped, retried. An
        attempt that sends ``body_bytes`` (a part, a single PUT) gets longer: the request
        timeout plus the time the body takes at :data:`_SLOWEST_LINK_BYTES_PER_S`, so a slow
        or crowded link is not retried into failure while a stalled one still ends."""
        if not key and op not in _PREFIX_OPERATIONS:
            # botocore's parameter validation is off: an empty key would address the bucket
            raise StorageError(f"{self._where(op, key)}: the object key is empty")
        client = await self._ensure_client()
        operation = _OPERATION_LABELS[op]
        timeout_s = self._timeout_s + body_bytes / _SLOWEST_LINK_BYTES_PER_S

        async def attempt() -> T:
            started = time.perf_counter()
            try:
                try:
                    async with asyncio.timeout(timeout_s):
                        result = await request(client)
                except _CLIENT_ERRORS as exc:
                    raise self._error(op, key, exc, timeout_s=timeout_s) from exc
            except BaseException as exc:
                self._measure(operation, started, exc)
                raise
            self._measure(operation, started, None)
            return result

        return await retrying(
            attempt, policy=self._retry, is_transient=_is_transient, what=op, sleep=self._sleep
        )

    def _measure(self, operation: str, started: float, error: BaseException | None) -> None:
        """Count and time one request attempt (the only place S3 requests are measured)."""
        metrics = self._metrics
        if metrics is None:
            return
        metrics.s3_requests.labels(operation).inc()
        if error is None or not isinstance(error, asyncio.CancelledError):
            metrics.s3_request_seconds.labels(operation).observe(time.perf_counter() - started)
        if error is not None:
            metrics.s3_request_errors.labels(operation, _error_reason(error)).inc()

    async def _request(self, op: str, key: str | None, method: str, **params: Any) -> Any:
        """A plain client call (``method`` of the aiobotocore client) through :meth:`_call`."""

        async def request(client: Any) -> Any:
            return await getattr(client, method)(Bucket=self._bucket, **params)

        return await self._call(op, key, request)

    def _where(self, op: str, key: str | None) -> str:
        return f"{op} s3://{self._bucket}/{key or ''}"

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "**********")
        return text

    def _error(
        self, op: str, key: str | None, exc: BaseException, *, timeout_s: float | None = None
    ) -> StorageError:
        """The sidecar error for a client failure (the caller chains it ``from exc``)."""
        where = self._where(op, key)
        if isinstance(exc, ClientError):
            code = _error_code(exc)
            status = _http_status(exc)
            message = self._redact(str(exc.response.get("Error", {}).get("Message", "") or ""))
            detail = f"{code or 'error'} (HTTP {status})" + (f": {message}" if message else "")
            if code == "NoSuchUpload":
                return StorageError(f"{where}: {detail}")
            if code in _NOT_FOUND_CODES or (status == 404 and not code):
                return KeyNotFoundError(f"{where}: no such key")
            if code in _BAD_RANGE_CODES or status == 416:
                return InvalidRangeError(f"{where}: range not satisfiable: {detail}")
            if code in _BAD_CHECKSUM_CODES:
                return ChecksumMismatchError(f"{where}: the store rejected the checksum: {detail}")
            if code in _ACCESS_CODES or status == 403:
                return StorageAccessError(f"{where} refused: {detail}")
            return StorageError(f"{where} failed: {detail}")
        if isinstance(exc, FlexibleChecksumError):
            return ChecksumMismatchError(f"{where}: {self._redact(str(exc))}")
        if isinstance(exc, TimeoutError) and not isinstance(exc, BotoCoreError):
            return StorageError(f"{where} timed out after {timeout_s or self._timeout_s:.3g} s")
        if isinstance(exc, ReadTimeoutError):  # the client's: no byte of the answer in time
            return StorageError(f"{where} timed out: no answer for {self._timeout_s:.3g} s")
        return StorageError(f"{where} failed: {type(exc).__name__}: {self._redact(str(exc))}")

    # -- ObjectStore ---------------------------------------------------------------------

    async def put(self, key: str, body: bytes) -> ObjectInfo:
        """Store ``body`` under ``key`` with one PUT carrying its CRC-32C."""
        body = bytes(body)
        await self._charge(len(body))
        return await self._put_object(key, body, len(body), await crc32c_off_loop(body))

    async def put_if_absent(self, key: str, body: bytes) -> bool:
        """One PUT with ``If-None-Match: *``: True when it wrote, False when the store says an
        object is there (412; also the answer to a repeated PUT whose first answer was lost,
        so the caller reads the object to learn whose it is). A store that does not
        implement the condition (501) raises :class:`ConditionalWriteUnsupportedError`."""
        body = bytes(body)
        await self._charge(len(body))
        crc = await crc32c_off_loop(body)
        try:
            await self._put_object(key, body, len(body), crc, if_absent=True)
        except StorageError as exc:
            cause = exc.__cause__
            status = _http_status(cause) if isinstance(cause, ClientError) else None
            if _error_code(cause) in {"PreconditionFailed", "ConditionalRequestConflict"} or (
                status in (409, 412)
            ):
                return False
            if _error_code(cause) == "NotImplemented" or status == 501:
                raise ConditionalWriteUnsupportedError(
                    f"{self._where('put', key)}: the store does not implement If-None-Match"
                ) from exc
            raise
        return True

    async def _charge(self, size: int) -> None:
        """Wait for the upload throttle to let ``size`` more bytes go (before they are read)."""
        if self._throttle is not None:
            await self._throttle.acquire(size)

    async def _put_object(
        self,
        key: str,
        body: bytes | PartBody | FilePartBody,
        size: int,
        crc: int,
        *,
        if_absent: bool = False,
    ) -> ObjectInfo:
        """One PUT carrying the body's CRC-32C, its echo checked; with ``if_absent`` it
        carries ``If-None-Match: *`` too."""
        checksum = encode_checksum(crc)
        condition = {"IfNoneMatch": "*"} if if_absent else {}

        async def request(client: Any) -> Any:
            call = client.put_object(
                Bucket=self._bucket, Key=key, Body=body, ChecksumCRC32C=checksum, **condition
            )
            return await (call if isinstance(body, bytes) else _sending(body, call))

        response = await self._call("put", key, request, body_bytes=size)
        returned = response.get("ChecksumCRC32C")
        if returned is None:
            await self._unechoed(key, size, whole=crc, parts=[(0, size, crc)])
        elif returned != checksum:
            raise ChecksumMismatchError(
                f"{self._where('put', key)}: the store answered CRC-32C {returned}, "
                f"we sent {checksum}"
            )
        return ObjectInfo(key, size, crc, _etag(response), None)

    async def put_file(
        self,
        key: str,
        path: str | os.PathLike[str],
        *,
        part_size: int = DEFAULT_PART_SIZE,
        concurrency: int = DEFAULT_CONCURRENCY,
        part_crcs: Sequence[int] | None = None,
    ) -> ObjectInfo:
        """Upload a local file: one PUT up to twice ``part_size`` (``plan_parts``), a multipart
        upload above it.

        A single PUT is streamed from the file: its CRC-32C is computed first (a read in a
        thread, :data:`CHUNK_BYTES` at a time) unless ``part_crcs`` has it (``PartChecksums``,
        one per part of ``plan_parts(size, part_size)``; ignored when their count does not
        match). On a plain-HTTP connection (``sendfile_uploads``) the body then goes with
        ``sendfile``, never read into the process: the store checks it against the CRC-32C
        header, and a refusal is a :class:`PartChangedError` when the file no longer matches
        (else retried). Otherwise it is sent a chunk at a time and fails before its last byte
        if its bytes no longer match that CRC; memory is two chunks, and no buffer is allocated
        (and page-faulted) per upload. The parts of a multipart upload go the same way when
        ``part_crcs`` has their CRC-32Cs. Without them each part is read whole into a pooled
        buffer (one read and one CRC pass per part; memory stays near
        ``concurrency * part_size``). With SHA-256 payload signing (which reads the body on the
        event loop) every body is read whole into a buffer. With an upload throttle, a worker
        waits for it before it reads or sends its part.
        """
        check_upload_args(part_size, concurrency)
        async with open_parts(path) as reader:
            parts = plan_parts(reader.size, part_size)
            known = None if part_crcs is None or len(part_crcs) != len(parts) else part_crcs
            if len(parts) <= 1:
                await self._charge(reader.size)
                if self._sign_payload:
                    buffer, crc = await reader.read(0, reader.size)
                    try:
                        return await self._put_object(key, buffer, reader.size, crc)
                    finally:
                        buffer.release()
                crc = known[0] if known else await reader.checksum(0, reader.size)
                body = FilePartBody(reader, 0, reader.size, crc, zero_copy=self._sendfile_uploads)
                return await self._put_object(key, body, reader.size, crc)
            upload_id = await self._create_multipart_upload(key)
            try:
                uploaded = await self._upload_parts(
                    key, upload_id, reader, parts, concurrency, known
                )
                response = await self._complete_multipart_upload(
                    key, upload_id, uploaded, reader.size
                )
            except BaseException as exc:
                await self._abort_quietly(
                    key, upload_id, hurry=isinstance(exc, asyncio.CancelledError)
                )
                raise
        whole = combine_parts([(p.crc32c, p.length) for p in uploaded])
        returned = response.get("ChecksumCRC32C")
        if returned is None:
            offsets = {p.number: p.offset for p in parts}
            await self._unechoed(
                key,
                reader.size,
                whole=whole,
                parts=[(offsets[p.number], p.length, p.crc32c) for p in uploaded],
            )
        else:
            matches = (
                returned == composite_checksum(p.crc32c for p in uploaded)
                if "-" in returned
                else decode_checksum(returned) == whole
            )
            if not matches:
                await self._delete_quietly(key)
                raise ChecksumMismatchError(
                    f"{self._where('put_file', key)}: the store's checksum {returned} of the "
                    f"completed upload does not match the parts we sent"
                )
        return ObjectInfo(key, reader.size, whole, _etag(response), None)

    async def _complete_multipart_upload(
        self, key: str, upload_id: str, uploaded: Sequence[_UploadedPart], size: int
    ) -> dict[str, Any]:
        """Complete the upload. A store may complete it and lose the answer; the repeated
        request then finds no such upload (MinIO and others; SeaweedFS and Amazon S3 answer
        it again). The object at ``key`` is then checked: when it has our size and the
        multipart checksum or entity tag that our parts make, it is our upload, done once,
        not an error that would upload the segment again."""
        try:
            response: dict[str, Any] = await self._request(
                "complete_multipart_upload",
                key,
                "complete_multipart_upload",
                Key=key,
                UploadId=upload_id,
                MultipartUpload={
                    "Parts": [
                        {
                            "PartNumber": p.number,
                            "ETag": p.etag,
                            "ChecksumCRC32C": encode_checksum(p.crc32c),
                        }
                        for p in uploaded
                    ]
                },
            )
        except StorageError as exc:
            if _error_code(exc.__cause__) != "NoSuchUpload":
                raise
            stored = await self._stored_upload(key, uploaded, size)
            if stored is None:
                raise
            log.info(
                "multipart_completed_unanswered",
                key=key,
                upload_id=upload_id,
                detail="the completion's answer was lost; the stored object is this upload's",
            )
            return stored
        return response

    async def _stored_upload(
        self, key: str, uploaded: Sequence[_UploadedPart], size: int
    ) -> dict[str, Any] | None:
        """The object at ``key`` as a completion's answer, if it is the one ``uploaded`` make:
        our size, and the composite CRC-32C or the MD5-of-MD5s entity tag of our parts."""
        try:
            head = await self._request("head", key, "head_object", Key=key, ChecksumMode="ENABLED")
        except KeyNotFoundError:
            return None
        stored = head.get("ChecksumCRC32C")
        etag = _etag(head)
        ours = stored == composite_checksum(p.crc32c for p in uploaded) or (
            etag is not None and etag == _multipart_etag([p.etag for p in uploaded])
        )
        if int(head["ContentLength"]) != size or not ours:
            return None
        return {"ETag": head.get("ETag"), "ChecksumCRC32C": stored}

    async def _create_multipart_upload(self, key: str) -> str:
        """Start a multipart upload and return its id. When the request had to be sent more
        than once, the store may have started an upload for an attempt whose answer was lost;
        those are aborted here (:meth:`_abort_unanswered`), since nobody would ever use them."""
        attempts = 0

        async def request(client: Any) -> Any:
            nonlocal attempts
            attempts += 1
            return await client.create_multipart_upload(
                Bucket=self._bucket, Key=key, ChecksumAlgorithm="CRC32C"
            )

        response = await self._call("create_multipart_upload", key, request)
        upload_id = str(response["UploadId"])
        if attempts > 1:
            try:
                await self._abort_unanswered(key, upload_id)
            except BaseException as exc:
                await self._abort_quietly(
                    key, upload_id, hurry=isinstance(exc, asyncio.CancelledError)
                )
                raise
        return upload_id

    async def _abort_unanswered(self, key: str, upload_id: str) -> None:
        """Abort the open uploads of ``key`` other than ``upload_id``, after a repeated
        CreateMultipartUpload. A segment key holds its segment id, so its only uploader is
        this one. A staged key names its content, and two sidecars may stage one segment at
        the same moment (around a leadership move): the other's upload then fails, and it
        finds the staged object or uploads again; nothing is lost. A failure here is logged
        and the upload goes on: the orphan scrub aborts what is left after
        ``retention.multipart_grace_s``."""
        try:
            for aborted in await abort_uploads_of(self, key, keep=upload_id):
                log.info(
                    "multipart_upload_aborted",
                    key=key,
                    upload_id=aborted,
                    detail="started by a CreateMultipartUpload whose answer was lost",
                )
        except (StorageError, RuntimeError, TimeoutError) as exc:
            log.warning(
                "multipart_abort_failed",
                key=key,
                error=str(exc) or type(exc).__name__,
                detail="the orphan scrub aborts it after retention.multipart_grace_s",
            )

    async def _upload_parts(
        self,
        key: str,
        upload_id: str,
        reader: PartReader,
        parts: Sequence[FilePart],
        concurrency: int,
        part_crcs: Sequence[int] | None,
    ) -> Sequence[_UploadedPart]:
        """Upload every part with ``concurrency`` workers; the first failure cancels the rest
        and propagates on its own (not in an exception group)."""
        uploaded: dict[int, _UploadedPart] = {}
        pending = iter(parts)

        async def worker() -> None:
            for part in pending:
                await self._charge(part.length)
                if part_crcs is not None and not self._sign_payload:  # no buffer
                    crc = part_crcs[part.number - 1]
                    body = FilePartBody(
                        reader, part.offset, part.length, crc, zero_copy=self._sendfile_uploads
                    )
                    etag = await self._upload_part(key, upload_id, part.number, body, crc)
                    uploaded[part.number] = _UploadedPart(part.number, etag, crc, part.length)
                    continue
                buffer, crc = await reader.read(part.offset, part.length)
                try:
                    if part_crcs is not None and part_crcs[part.number - 1] != crc:
                        raise PartChangedError(
                            f"{self._where('upload_part', key)}: part {part.number} no longer "
                            "matches the CRC-32C computed when the file was checked; not sent"
                        )
                    etag = await self._upload_part(key, upload_id, part.number, buffer, crc)
                finally:
                    buffer.release()  # before reading the next part: one part per worker
                uploaded[part.number] = _UploadedPart(part.number, etag, crc, part.length)

        try:
            async with asyncio.TaskGroup() as group:
                for n in range(min(concurrency, len(parts))):
                    group.create_task(worker(), name=f"upload {key} worker {n}")
        except BaseExceptionGroup as failures:
            first = failures.exceptions[0]
            raise first from first.__cause__
        return [uploaded[p.number] for p in parts]

    async def _upload_part(
        self, key: str, upload_id: str, number: int, body: PartBody | FilePartBody, crc: int
    ) -> str:
        checksum = encode_checksum(crc)

        async def request(client: Any) -> Any:
            return await _sending(
                body,
                client.upload_part(
                    Bucket=self._bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=body,
                    ChecksumCRC32C=checksum,
                ),
            )

        response = await self._call("upload_part", key, request, body_bytes=len(body))
        returned = response.get("ChecksumCRC32C")
        if returned is None and self._checksum_echo == "refuse":
            self._count_unechoed("refused")
            raise ChecksumNotEchoedError(
                f"{self._where('upload_part', key)}: part {number}: the store did not echo its "
                "CRC-32C (s3.checksum_echo = refuse)"
            )
        # None otherwise: the completed object is verified (see _unechoed)
        if returned is not None and returned != checksum:
            raise ChecksumMismatchError(
                f"{self._where('upload_part', key)}: part {number}: the store answered CRC-32C "
                f"{returned}, we sent {checksum}"
            )
        etag = _etag(response)
        if etag is None:
            raise StorageError(f"{self._where('upload_part', key)}: part {number} has no ETag")
        return etag

    async def _unechoed(
        self, key: str, size: int, *, whole: int, parts: Sequence[tuple[int, int, int]]
    ) -> None:
        """The store answered an upload of ``size`` bytes (CRC-32C ``whole``; ``parts`` are its
        (offset, length, CRC-32C), one for a single PUT) without echoing the checksum: refuse it,
        or verify the stored object (module docstring). A failure deletes the object."""
        where = self._where("put", key)
        if self._checksum_echo == "refuse":
            self._count_unechoed("refused")
            await self._delete_quietly(key)
            raise ChecksumNotEchoedError(
                f"{where}: the store did not echo the upload's CRC-32C (s3.checksum_echo = refuse)"
            )
        head = await self._request("head", key, "head_object", Key=key, ChecksumMode="ENABLED")
        stored = head.get("ChecksumCRC32C")
        problem: str | None = None
        if int(head["ContentLength"]) != size:
            problem = f"the stored object has {head['ContentLength']} bytes, we sent {size}"
        elif stored is not None:
            expected = (
                composite_checksum(crc for _, _, crc in parts)
                if "-" in stored
                else encode_checksum(whole)
            )
            if stored != expected:
                problem = f"the stored object's CRC-32C is {stored}, ours {expected}"
        elif size > 0:
            offset, length, crc = parts[-1]
            body = await self.get_range(key, offset, offset + length - 1)
            if await crc32c_off_loop(bytes(body)) != crc:  # one part, rarely
                problem = f"bytes {offset}-{offset + length - 1} read back do not match our CRC-32C"
        if problem is not None:
            self._count_unechoed("mismatch")
            await self._delete_quietly(key)
            raise ChecksumMismatchError(f"{where}: no CRC-32C echo, and {problem}")
        self._count_unechoed("verified_get" if stored is None and size > 0 else "verified_head")

    def _count_unechoed(self, resolution: str) -> None:
        if self._metrics is not None:
            self._metrics.s3_unechoed_uploads.labels(resolution).inc()

    async def _abort_quietly(self, key: str, upload_id: str, *, hurry: bool = False) -> None:
        """Abort an upload that failed; one that was cancelled (a stop, a forced one perhaps)
        gets :data:`_ABORT_WHEN_CANCELLED_S` at most, not the whole retry policy, so the
        daemon's stop does not wait on an unreachable store. What is left is the scrub's."""
        try:
            if hurry:
                async with asyncio.timeout(_ABORT_WHEN_CANCELLED_S):
                    await self.abort_multipart_upload(key, upload_id)
            else:
                await self.abort_multipart_upload(key, upload_id)
        except (StorageError, RuntimeError, TimeoutError) as exc:
            log.warning(
                "multipart_abort_failed",
                key=key,
                upload_id=upload_id,
                error=str(exc) or type(exc).__name__,
                detail="the orphan scrub aborts it after retention.multipart_grace_s",
            )

    async def _delete_quietly(self, key: str) -> None:
        try:
            await self.delete([key])
        except (StorageError, RuntimeError) as exc:
            log.warning("object_delete_failed", key=key, error=str(exc))

    async def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """The whole object; a full-object CRC-32C returned by the store is verified. An object
        over ``max_bytes`` is refused on the length the store announces, its body unread (or,
        with no length announced, once ``max_bytes`` + 1 bytes are read)."""

        async def request(client: Any) -> bytes:
            response = await client.get_object(Bucket=self._bucket, Key=key, ChecksumMode="ENABLED")
            async with response["Body"] as stream:
                size = response.get("ContentLength")
                announced = isinstance(size, int) and not isinstance(size, bool)
                if max_bytes is not None and announced and size > max_bytes:
                    raise self._too_large(key, str(size), max_bytes)
                if max_bytes is None or announced:
                    body: bytes = await stream.read()
                else:
                    body = await _read_at_most(stream, max_bytes + 1)
                if max_bytes is not None and len(body) > max_bytes:
                    raise self._too_large(key, f"at least {len(body)}", max_bytes)
            expected = decode_checksum(response.get("ChecksumCRC32C"))
            if expected is not None and await crc32c_off_loop(body) != expected:
                raise ChecksumMismatchError(
                    f"{self._where('get', key)}: the bytes do not match the stored CRC-32C"
                )
            return body

        return await self._call("get", key, request)

    def _too_large(self, key: str, size: str, max_bytes: int) -> ObjectTooLargeError:
        return ObjectTooLargeError(
            f"{self._where('get', key)}: the object has {size} bytes, more than the"
            f" {max_bytes} its reader takes"
        )

    async def get_range(
        self, key: str, start: int, end_inclusive: int, *, arrivals: Arrivals | None = None
    ) -> bytes | memoryview:
        """Bytes ``start..end_inclusive``, the end clamped to the last byte (as S3 does): a
        read-only view of one buffer the body was read into (:mod:`sidecar.storage._body`).
        ``arrivals`` is told of them as they come through the raw client, once the answer's
        ``Content-Range`` says they are the range asked for (botocore's GETs tell nothing)."""
        check_range(key, start, end_inclusive)
        hook = None if arrivals is None else _arrivals_hook(start, arrivals)

        async def request(client: Any) -> bytes | memoryview:
            if self._range_getter is not None:
                found = await self._raw_range(
                    self._range_getter, client, key, start, end_inclusive, hook
                )
                if found is not None:
                    return self._ranged(key, start, end_inclusive, *found)
            response = await client.get_object(
                Bucket=self._bucket, Key=key, Range=f"bytes={start}-{end_inclusive}"
            )
            async with response["Body"] as stream:
                body = await read_body(stream, response.get("ContentLength"))
            return self._ranged(key, start, end_inclusive, body, response.get("ContentRange"))

        return await self._call("get_range", key, request)

    @property
    def raw_range_gets(self) -> bool:
        """Whether ranged GETs go through the raw HTTP/1.1 client (module docstring)."""
        return self._range_getter is not None

    async def _raw_range(
        self,
        getter: RangeGetter,
        client: Any,
        key: str,
        start: int,
        end_inclusive: int,
        hook: BodyHook | None = None,
    ) -> tuple[memoryview, str | None] | None:
        """A ranged GET through the raw client: the body and its ``Content-Range``; None when
        this store has gone back to botocore (the caller then asks botocore). An error
        response is raised as botocore would raise it (``ClientError``)."""
        url = await client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self._bucket, "Key": key},
            ExpiresIn=_PRESIGN_EXPIRES_S,
        )
        if self._range_getter is not getter:
            return None  # another GET sent this store back to botocore meanwhile
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            self._raw_range_gets_off(f"the presigned URL's scheme is {parts.scheme!r}")
            return None
        target = f"{parts.path or '/'}?{parts.query}" if parts.query else parts.path or "/"
        try:
            response = await getter.get(
                parts.hostname,
                parts.port or 80,
                target,
                netloc=_signed_host(parts),
                start=start,
                end_inclusive=end_inclusive,
                hook=hook,
            )
        except UnsupportedResponseError as exc:
            self._raw_range_gets_off(str(exc))
            return None
        if response.status not in (200, 206):
            raise _client_error(response, "GetObject")
        return response.body, response.headers.get("content-range")

    def _raw_range_gets_off(self, reason: str) -> None:
        """Send this store's ranged GETs through botocore from now on."""
        if self._range_getter is None:
            return
        self._range_getter.close()
        self._range_getter = None
        log.warning(
            "s3_raw_range_gets_off",
            endpoint=self._endpoint_url,
            reason=reason,
            hint="ranged GETs go through botocore from now on; set s3.raw_range_gets=false to"
            " skip the raw client",
        )

    def _ranged(
        self,
        key: str,
        start: int,
        end_inclusive: int,
        body: bytes | memoryview,
        content_range: str | None,
    ) -> bytes | memoryview:
        """The bytes asked for, from a GET's body and its ``Content-Range``; a store that
        ignored ``Range`` sent the whole object, cut here."""
        if content_range is None:  # a store that ignored Range sent the whole object
            if start >= len(body):
                raise InvalidRangeError(
                    f"{self._where('get_range', key)}: range {start}-{end_inclusive} is "
                    f"beyond the object's {len(body)} bytes"
                )
            return body[start : end_inclusive + 1]
        if not _spans(content_range, start, len(body)):
            raise StorageError(
                f"{self._where('get_range', key)}: asked for {start}-{end_inclusive}, "
                f"got {content_range!r} with {len(body)} bytes"
            )
        return body

    async def copy(self, source_key: str, key: str) -> ObjectInfo:
        """CopyObject: the store copies the bytes (no data through this process). The size
        comes from a HEAD of the copy, the size S3 stored, not the one we expect."""
        await self._request(
            "copy",
            key,
            "copy_object",
            Key=key,
            CopySource={"Bucket": self._bucket, "Key": source_key},
        )
        info = await self.head(key)
        return ObjectInfo(key, info.size, None, info.etag, info.last_modified)

    async def head(self, key: str) -> ObjectInfo:
        """Size, entity tag and (for single-PUT objects) the CRC-32C."""
        response = await self._request("head", key, "head_object", Key=key, ChecksumMode="ENABLED")
        return ObjectInfo(
            key,
            int(response["ContentLength"]),
            decode_checksum(response.get("ChecksumCRC32C")),
            _etag(response),
            _utc(response.get("LastModified")),
        )

    async def delete(self, keys: Sequence[str]) -> None:
        """Delete with DeleteObjects, 1000 keys a request; missing keys are not errors."""
        for batch in batches(keys, DELETE_BATCH_SIZE):
            response = await self._request(
                "delete",
                batch[0],
                "delete_objects",
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
            failed = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if failed:
                first = failed[0]
                raise StorageError(
                    f"{self._where('delete', first.get('Key'))}: {len(failed)} of {len(batch)} "
                    f"keys not deleted, e.g. {first.get('Code')}: "
                    f"{self._redact(str(first.get('Message', '')))}"
                )

    async def list(
        self, prefix: str, *, page_size: int = DEFAULT_PAGE_SIZE
    ) -> AsyncIterator[ObjectInfo]:
        """Objects under ``prefix`` in key order (ListObjectsV2, ``page_size`` keys a page)."""
        check_page_size(page_size)
        params: dict[str, Any] = {"Prefix": prefix, "MaxKeys": page_size}
        while True:
            page = await self._request("list", prefix, "list_objects_v2", **params)
            for item in page.get("Contents", []):
                yield ObjectInfo(
                    str(item["Key"]),
                    int(item["Size"]),
                    None,
                    _etag(item),
                    _utc(item.get("LastModified")),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated"):
                return
            if not token:
                raise StorageError(f"{self._where('list', prefix)}: truncated page without token")
            params["ContinuationToken"] = token

    async def list_multipart_uploads(
        self, prefix: str, *, page_size: int = DEFAULT_PAGE_SIZE
    ) -> AsyncIterator[MultipartUpload]:
        """Incomplete multipart uploads under ``prefix`` (ListMultipartUploads, paginated), in
        the store's order (AWS: by key; SeaweedFS: by upload id)."""
        check_page_size(page_size)
        params: dict[str, Any] = {"Prefix": prefix, "MaxUploads": page_size}
        while True:
            page = await self._request(
                "list_multipart_uploads", prefix, "list_multipart_uploads", **params
            )
            for item in page.get("Uploads", []):
                yield MultipartUpload(
                    str(item["Key"]), str(item["UploadId"]), _utc(item.get("Initiated"))
                )
            if not page.get("IsTruncated"):
                return
            # AWS pages by NextKeyMarker + NextUploadIdMarker; SeaweedFS orders by upload id
            # and sends only NextUploadIdMarker. Send whichever markers came back.
            markers = {
                name: str(page[f"Next{name}"])
                for name in ("KeyMarker", "UploadIdMarker")
                if page.get(f"Next{name}")
            }
            previous = {n: params[n] for n in ("KeyMarker", "UploadIdMarker") if n in params}
            if not markers or markers == previous:
                raise StorageError(
                    f"{self._where('list_multipart_uploads', prefix)}: truncated page "
                    f"without a new marker"
                )
            params.pop("KeyMarker", None)
            params.pop("UploadIdMarker", None)
            params.update(markers)

    async def abort_multipart_upload(self, key: str, upload_id: str) -> None:
        """Abort an incomplete multipart upload; an upload that is already gone is fine."""
        try:
            await self._request(
                "abort_multipart_upload",
                key,
                "abort_multipart_upload",
                Key=key,
                UploadId=upload_id,
            )
        except StorageError as exc:
            if _error_code(exc.__cause__) in {"NoSuchUpload", "NoSuchKey", "404"}:
                return
            raise
