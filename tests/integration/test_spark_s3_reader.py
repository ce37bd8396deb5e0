"""The Spark source's S3 reader against the real S3 server (SeaweedFS): a whole-object GET with
a limit refuses an object over it after reading at most one byte past the limit, and returns
the object whole when it fits."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.errors import KeyNotFoundError, ObjectTooLargeError
from sidecar.spark._options import S3Location
from sidecar.spark._s3 import S3Reader

pytestmark = pytest.mark.integration


def _reader(s3: Any) -> S3Reader:
    return S3Reader(
        S3Location(
            bucket=s3.bucket,
            endpoint=s3.endpoint,
            access_key_id=s3.access_key,
            secret_access_key=s3.secret_key,
        )
    )


def test_a_whole_object_get_with_a_limit(s3: Any, s3_prefix: str) -> None:
    """An object of 4096 bytes: taken whole with a limit of 4096 or none, refused with 4095
    (ObjectTooLargeError, naming the key and the limit); a missing key is still
    KeyNotFoundError with a limit."""
    key = f"{s3_prefix}m.manifest.json"
    data = bytes(range(256)) * 16
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=data)
    reader = _reader(s3)
    assert reader.get(key) == data
    assert reader.get(key, max_bytes=len(data)) == data
    with pytest.raises(ObjectTooLargeError, match=r"more than the 4095 bytes") as info:
        reader.get(key, max_bytes=len(data) - 1)
    assert key in str(info.value)
    assert not info.value.retriable
    assert reader.get(key, max_bytes=len(data)) == data  # the client still works after it
    with pytest.raises(KeyNotFoundError):
        reader.get(f"{s3_prefix}missing.manifest.json", max_bytes=10)
