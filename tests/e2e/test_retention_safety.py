"""Local-retention safety on the real broker: the sidecar cannot tier (its S3 endpoint has nothing
listening, so uploads are paused) while the broker's own retention closes in on the untiered
segments. First they show in the at-risk gauge and as warnings; then the broker deletes them and
each is reported as lost (counter + an error line). Expected sets come from the log dir (the
segments' max timestamps, and which base offsets the broker removed) and the topic config."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import stack
from tests.e2e._support import (
    Sidecar,
    bucket_keys,
    delete_topic,
    metric_samples,
    partition_scan,
    write_config,
)
from tests.e2e.test_retention import HOUR_MS, METRIC, _alter, _produce
from tests.helpers import create_topic
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

FRACTION = 0.8
#: 2 h old records are 0.9 of it: at risk, not yet deleted
LOCAL_RETENTION_MS = 2 * HOUR_MS + HOUR_MS // 5


def _at_risk_now(log_dir: Path, topic: str) -> set[int]:
    """Rolled segments whose age is past FRACTION of the local retention.ms (none tiered)."""
    now = time.time() * 1000
    return {
        s.base_offset
        for s in partition_scan(log_dir, topic, 0).segments
        if s.end_offset is not None
        and s.max_timestamp_ms is not None
        and now - s.max_timestamp_ms >= FRACTION * LOCAL_RETENTION_MS
    }


async def _gauge(port: int, name: str, topic: str) -> float | None:
    samples = await metric_samples(port)
    return samples.get((f"{METRIC}{name}", (("topic", topic),)))


async def _poll(what: str, check: Any, sidecar: Sidecar, timeout: float = 60) -> None:
    """Re-check an external condition after every sidecar log line, until a deadline."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"no {what}\n{sidecar.tail()}"
        count = len(sidecar.events)
        await sidecar.wait_until(
            lambda count=count: len(sidecar.events) > count, timeout=timeout, what=what
        )


class TestLocalRetentionSafety:
    async def test_untiered_segments_at_risk_then_lost(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, configs={"retention.ms": str(LOCAL_RETENTION_MS)})
        old = int(time.time() * 1000) - 2 * HOUR_MS
        await _produce(bootstrap, topic_name, count=3000, timestamp_ms=old)
        await _produce(bootstrap, topic_name, count=1500)
        port = stack.free_port()
        config = write_config(
            tmp_path / "sidecar.toml",
            state_dir=tmp_path / "state",
            log_dir=kafka.log_dir,
            bootstrap=bootstrap,
            s3=s3,
            metrics_port=port,
            metadata_topic=f"__rlm_{topic_name}",
            include_topics=[topic_name],
            prefix=s3_prefix,
            tiering={"drain_timeout_s": 1.0},
            retention={
                "interval_s": 1.0,
                "scrub_enabled": False,
                "at_risk_fraction": FRACTION,
            },
        )
        env = {
            **sidecar_env(s3),
            # nothing listens there: the readiness probe pauses tiering, nothing is uploaded
            "SIDECAR_S3__ENDPOINT_URL": f"http://127.0.0.1:{stack.free_port()}",
        }
        sidecar = await Sidecar.start(config, env, tmp_path / "sidecar.log")
        try:
            await sidecar.wait_for("s3_unreachable", timeout=60)
            expected_risk = _at_risk_now(kafka.log_dir, topic_name)
            assert expected_risk  # the old segments

            async def gauge_shows_them() -> bool:
                return await _gauge(port, "segments_at_risk", topic_name) == len(expected_risk)

            await _poll("at-risk gauge", gauge_shows_them, sidecar)
            warned = {e["base_offset"] for e in sidecar.matching("segment_at_risk")}
            assert warned == expected_risk
            assert sidecar.matching("segment_tiered") == []

            # the broker's retention now deletes them: never tiered, so lost
            before = partition_scan(kafka.log_dir, topic_name, 0)
            await _alter(bootstrap, topic_name, {"retention.ms": str(HOUR_MS)})
            gone: set[int] = set()

            async def broker_deleted() -> bool:
                nonlocal gone
                now = {s.base_offset for s in partition_scan(kafka.log_dir, topic_name, 0).segments}
                gone = {s.base_offset for s in before.segments if s.base_offset not in now}
                return expected_risk <= gone

            await _poll("local deletion by the broker", broker_deleted, sidecar)
            # only rolled segments can be lost; the broker deleted exactly the old ones
            assert gone == expected_risk
            lost = await sidecar.wait_for(
                "segment_lost_untiered", count=len(gone), timeout=60, topic=topic_name
            )
            assert {e["base_offset"] for e in lost} == gone
            assert all(e["level"] == "error" for e in lost)
            samples = await metric_samples(port)
            lost_total = samples.get((f"{METRIC}segments_lost_total", (("topic", topic_name),)))
            assert lost_total == len(gone)

            async def gauge_cleared() -> bool:
                return await _gauge(port, "segments_at_risk", topic_name) == 0

            await _poll("at-risk gauge back to 0", gauge_cleared, sidecar)
            assert bucket_keys(s3, s3_prefix) == []  # nothing reached the bucket
            assert await sidecar.stop() == 0
        finally:
            if sidecar.proc.returncode is None:
                await sidecar.kill()
            await delete_topic(bootstrap, topic_name)
