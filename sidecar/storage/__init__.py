"""Object storage: the :class:`ObjectStore` protocol, its value types, and the backends.

Importing this package imports no backend client: :func:`open_store` imports the S3 backend
(aiobotocore, heavy) only when it is called, so Spark executors and unit tests stay light.
:class:`MemoryObjectStore` is the in-memory fake with fault injection for unit tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.storage._parts import PartChecksums, plan_parts
from sidecar.storage.base import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PAGE_SIZE,
    DEFAULT_PART_SIZE,
    DELETE_BATCH_SIZE,
    MAX_PARTS,
    MIN_PART_SIZE,
    MultipartUpload,
    ObjectInfo,
    ObjectStore,
)
from sidecar.storage.memory import MemoryObjectStore

if TYPE_CHECKING:
    from sidecar.observability.metrics import Metrics
    from sidecar.storage.s3 import S3Settings
    from sidecar.storage.throttle import TokenBucket

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_PART_SIZE",
    "DELETE_BATCH_SIZE",
    "MAX_PARTS",
    "MIN_PART_SIZE",
    "MemoryObjectStore",
    "MultipartUpload",
    "ObjectInfo",
    "ObjectStore",
    "PartChecksums",
    "open_store",
    "plan_parts",
]


def open_store(
    config: S3Settings,
    *,
    metrics: Metrics | None = None,
    upload_throttle: TokenBucket | None = None,
) -> ObjectStore:
    """The S3 store for ``sidecar.config.S3Config`` (imports the S3 backend on first use);
    with ``metrics``, every request is counted and timed by operation; with
    ``upload_throttle``, every upload through it shares that bandwidth cap.

    The store opens its client lazily; use it as an async context manager or ``aclose()`` it.
    """
    from sidecar.storage.s3 import S3ObjectStore  # lazy: aiobotocore is heavy

    return S3ObjectStore.from_config(config, metrics=metrics, upload_throttle=upload_throttle)
