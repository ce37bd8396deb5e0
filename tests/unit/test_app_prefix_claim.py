"""The bucket prefix's claim holds every upload until it succeeds. A store that lists (so the
S3 probe passes) but refuses the ownership marker's GET must show in /readyz and in the
dependency-error counter, not only in a retry log line."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.app import Daemon
from sidecar.config import load_config
from sidecar.errors import StorageAccessError
from sidecar.storage.memory import MemoryObjectStore

pytestmark = pytest.mark.timeout(60)


class _RefusingMarker(MemoryObjectStore):
    """Refuses the first GET (as an IAM policy without s3:GetObject would); at the second
    GET it records what the daemon showed meanwhile, then answers."""

    def __init__(self, daemon: Daemon) -> None:
        super().__init__()
        self.daemon = daemon
        self.gets = 0
        self.seen: dict[str, Any] = {}

    async def get(self, key: str) -> bytes:
        self.gets += 1
        if self.gets == 1:
            raise StorageAccessError(f"get s3://bucket/{key} refused: AccessDenied (HTTP 403)")
        if self.gets == 2:  # the first refusal was handled before this retry
            daemon = self.daemon
            self.seen = {
                "checks": daemon.readiness.snapshot(),
                "failing": daemon.readiness.failing(),
                "counted": daemon.metrics.registry.get_sample_value(
                    "kafka_tiered_sidecar_dependency_errors_total",
                    {"dependency": "s3", "component": "prefix_claim"},
                ),
                "paused": daemon._prefix_owner is None,
            }
        return await super().get(key)


class _Kafka:
    async def cluster_id(self) -> str:
        return "cluster-1"


async def test_a_refused_claim_is_not_ready_until_it_succeeds() -> None:
    daemon = Daemon(load_config(None, environ={}, overrides={"broker.broker_id": "1"}))
    objects = _RefusingMarker(daemon)
    assert daemon.readiness.snapshot()["prefix_owner"] is False  # not claimed yet

    await daemon._claim_prefix(objects, _Kafka())  # type: ignore[arg-type]

    assert objects.seen["checks"]["prefix_owner"] is False
    assert "AccessDenied" in objects.seen["failing"]["prefix_owner"]
    assert objects.seen["counted"] == 1.0
    assert objects.seen["paused"]
    assert daemon.readiness.snapshot()["prefix_owner"] is True
    assert "prefix_owner" not in daemon.readiness.failing()
    assert daemon._prefix_owner is not None
    assert (
        daemon.metrics.registry.get_sample_value(
            "kafka_tiered_sidecar_readiness_check", {"check": "prefix_owner"}
        )
        == 1.0
    )
