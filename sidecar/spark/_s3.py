"""Synchronous S3 access for the Spark source: ranged GETs, whole-object GETs and listings.

Why botocore (sync) rather than ``pyarrow.fs.S3FileSystem``: every read here knows the object's
size and the byte range it wants from the metadata, and botocore issues exactly one GET with a
``Range`` header for it. pyarrow's ``open_input_file`` sends a HEAD before every ranged read (its
Python API takes no known size), which doubles the requests of a pruned query. botocore is
already installed (aiobotocore pins it), is fork-safe when the client is created after the fork,
and its cost per request (signing, a urllib3 connection from the pool) is small next to decoding.

Clients are created lazily in the process that uses them and cached per process and settings
(Spark reuses Python workers), never pickled with a reader. Errors become the sidecar's storage
errors; messages name the bucket and key, never a credential.
"""

from __future__ import annotations

import threading
from typing import Any

from sidecar.errors import (
    InvalidRangeError,
    KeyNotFoundError,
    ObjectTooLargeError,
    StorageAccessError,
    StorageError,
)
from sidecar.spark._options import S3Location

__all__ = ["S3Reader"]

_CLIENTS: dict[tuple[object, ...], Any] = {}
_LOCK = threading.Lock()


def _client(location: S3Location) -> Any:
    key = (
        location.endpoint,
        location.region,
        location.path_style,
        location.access_key_id,
        location.secret_access_key,
        location.session_token,
    )
    with _LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            import botocore.config
            import botocore.session

            session = botocore.session.get_session()
            client = session.create_client(
                "s3",
                endpoint_url=location.endpoint,
                region_name=location.region,
                aws_access_key_id=location.access_key_id,
                aws_secret_access_key=location.secret_access_key,
                aws_session_token=location.session_token,
                config=botocore.config.Config(
                    s3={"addressing_style": "path" if location.path_style else "auto"},
                    retries={"max_attempts": 5, "mode": "standard"},
                    max_pool_connections=16,
                    connect_timeout=10,
                    read_timeout=60,
                    response_checksum_validation="when_required",
                ),
            )
            _CLIENTS[key] = client
        return client


class S3Reader:
    """Reads of one bucket. Cheap to create; the botocore client behind it is per process."""

    def __init__(self, location: S3Location) -> None:
        self.location = location
        self.bucket = location.bucket
        self._client = _client(location)

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """The whole object (one GET without a Range header). An object over ``max_bytes`` is
        :class:`ObjectTooLargeError`, its body read no further than ``max_bytes`` + 1 bytes (a
        corrupt or foreign object at a manifest's key cannot fill a task's memory)."""
        return self._get(key, None, max_bytes=max_bytes)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)`` of ``key`` in one ranged GET."""
        if length <= 0:
            return b""
        return self._get(key, f"bytes={start}-{start + length - 1}")

    def _get(self, key: str, byte_range: str | None, *, max_bytes: int | None = None) -> bytes:
        import botocore.exceptions

        kwargs: dict[str, str] = {"Bucket": self.bucket, "Key": key}
        if byte_range is not None:
            kwargs["Range"] = byte_range
        try:
            response = self._client.get_object(**kwargs)
            body = response["Body"]
            try:
                data = bytes(body.read()) if max_bytes is None else _read_at_most(body, max_bytes)
            finally:
                body.close()
        except botocore.exceptions.ClientError as exc:
            raise _translate(exc, "GET", self.bucket, key) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StorageError(
                f"GET s3://{self.bucket}/{key} failed: {type(exc).__name__}"
            ) from exc
        if max_bytes is not None and len(data) > max_bytes:
            raise ObjectTooLargeError(
                f"GET s3://{self.bucket}/{key}: the object has more than the {max_bytes} bytes"
                " its reader takes"
            )
        return data

    def list(self, prefix: str) -> list[tuple[str, int]]:
        """Every (key, size) under ``prefix``."""
        import botocore.exceptions

        found: list[tuple[str, int]] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for page in pages:
                found += [(item["Key"], int(item["Size"])) for item in page.get("Contents", [])]
        except botocore.exceptions.ClientError as exc:
            raise _translate(exc, "LIST", self.bucket, prefix) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StorageError(
                f"LIST s3://{self.bucket}/{prefix} failed: {type(exc).__name__}"
            ) from exc
        return found


def _read_at_most(body: Any, max_bytes: int) -> bytes:
    """The body to its end, or its first ``max_bytes`` + 1 bytes when it is longer (a read may
    return fewer bytes than asked for before the end)."""
    data = bytearray()
    while len(data) <= max_bytes:
        piece = body.read(max_bytes + 1 - len(data))
        if not piece:
            break
        data += piece
    return bytes(data)


_ACCESS_CODES = frozenset(
    {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchBucket"}
)


def _translate(exc: Any, op: str, bucket: str, key: str) -> StorageError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    where = f"{op} s3://{bucket}/{key}"
    if code in ("NoSuchKey", "404", "NotFound"):
        return KeyNotFoundError(f"{where}: no such key")
    if code in ("InvalidRange", "416"):
        return InvalidRangeError(f"{where}: invalid range")
    if code in _ACCESS_CODES:
        return StorageAccessError(f"{where}: {code}")
    return StorageError(f"{where}: {code or 'error'}")
