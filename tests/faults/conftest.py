"""Fixtures of the fault suite: the fault proxy in front of the session's S3 server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults._harness import FaultProxy, through


@pytest.fixture
def fault_proxy(s3: Any, tmp_path: Path) -> Iterator[FaultProxy]:
    """A fault proxy process in front of the session's S3 server, no rules set."""
    proxy = FaultProxy(s3.endpoint, tmp_path / "proxy")
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def s3_proxied(s3: Any, fault_proxy: FaultProxy) -> Any:
    """The session's S3 server as seen through ``fault_proxy`` (same bucket and credentials)."""
    return through(s3, fault_proxy)
