"""The sidecar's /metrics as Prometheus sees it, on the real broker and a private SeaweedFS: every
series the README documents is served and parses with prometheus_client's parser; the series move
as segments are tiered (copies, bytes, upload time, S3 requests by operation, metadata publishes,
the metadata store lag back at 0) and as records are read through the socket (requests, bytes,
cache lookups, fetches); label values stay bounded; /readyz turns false when S3 stops and true
when it is back. The configured S3 credentials never appear in the logs, /metrics or
`sidecar status`."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.readserver import ReadClient
from tests.conftest import stack
from tests.e2e._support import Sidecar, delete_topic, readyz, write_config
from tests.helpers import create_topic, produce
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

PREFIX = "kafka_tiered_sidecar_"
README = Path(__file__).resolve().parents[2] / "README.md"
SEGMENTS = 2  # 1 MiB segments: 2,300 records of 1 kB roll two
#: the most distinct values one label may take in this run (topics, fixed sets)
MAX_LABEL_VALUES = 16
#: label values that would mean unbounded cardinality: offsets, ids, keys, paths, UUIDs
UNBOUNDED_VALUE = re.compile(
    r"^\d{4,}$|[0-9a-f]{8}-[0-9a-f]{4}-|^(?=.*\d)(?=.*[A-Z])[A-Za-z0-9_-]{22}$"
    r"|/|\.log$|\.indexes$|^\d+-\d+$"
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def documented_families() -> set[str]:
    """The metric names of the README's metrics table (families, as the parser names them)."""
    text = README.read_text()
    table = text[
        text.index("<!-- metrics-reference:start -->") : text.index("metrics-reference:end")
    ]
    names = set(re.findall(r"^\| `(kafka_tiered_sidecar_\w+)`", table, flags=re.M))
    assert len(names) > 30, "the README's metrics table is missing"
    return {name.removesuffix("_total") for name in names}  # the parser names counters so


async def scrape(port: int) -> tuple[str, dict[str, Any], Samples]:
    """(raw text, families by name, samples) of one /metrics scrape."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families.values()
        for s in family.samples
    }
    return text, families, samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(
        value
        for (sample_name, sample_labels), value in samples.items()
        if sample_name == PREFIX + name and labels.items() <= dict(sample_labels).items()
    )


async def until(
    check: Callable[[], Awaitable[bool]], *, timeout: float, what: str, sidecar: Sidecar
) -> None:
    """Poll an HTTP-observable condition (no event announces it) until it holds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if sidecar.exited:
            raise AssertionError(f"sidecar exited before {what}\n{sidecar.tail(60)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s\n{sidecar.tail()}")
        await asyncio.sleep(0.25)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """How much ``name`` grew between two scrapes (asserting it did)."""
    delta = total(after, name, **labels) - total(before, name, **labels)
    assert delta > 0, f"{name}{labels} did not move: {total(before, name, **labels)}"
    return delta


def assert_bounded(families: Mapping[str, Any]) -> None:
    """No label value looks like an offset, an id, a key or a path, and no label takes more
    values than fixed sets and the run's one topic can explain."""
    for family in families.values():
        values: dict[str, set[str]] = {}
        for s in family.samples:
            for label, value in s.labels.items():
                if label == "le":
                    continue
                values.setdefault(label, set()).add(value)
                assert not UNBOUNDED_VALUE.search(value), (family.name, label, value)
        for label, seen in values.items():
            assert len(seen) <= MAX_LABEL_VALUES, (family.name, label, sorted(seen))


async def test_metrics_move_with_tiering_and_reads_and_readyz_follows_s3(
    kafka: Any, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = kafka.bootstrap_servers
    s3 = stack.SeaweedS3.create(tmp_path / "s3")  # private: this test stops and starts it
    await asyncio.to_thread(s3.start)
    secrets = [s3.access_key, s3.secret_key]
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
        prefix="metrics/",
    )
    env = sidecar_env(s3)
    await create_topic(
        bootstrap, topic_name, configs={"segment.bytes": "1048576", "segment.ms": "3600000"}
    )
    sidecar = None
    s3_stopped = False
    try:
        sidecar = await Sidecar.start(config, env, tmp_path / "sidecar.log")
        await sidecar.wait_for("sidecar_ready", timeout=90)

        # -- every documented series is served, and parses
        text, families, idle = await scrape(port)
        missing = documented_families() - set(families)
        assert not missing, f"documented but not served: {sorted(missing)}"
        served = {n for n in families if n.startswith(PREFIX) and not n.endswith("_created")}
        undocumented = served - documented_families()
        assert not undocumented, f"served but not documented: {sorted(undocumented)}"
        assert total(idle, "segments_copied_total") == 0

        # -- tiering moves the upload, S3 and metadata series
        await produce(bootstrap, topic_name, count=2300, partition=0)
        await sidecar.wait_for("segment_tiered", count=SEGMENTS, timeout=120, topic=topic_name)
        _, _, tiered = await scrape(port)
        assert moved(idle, tiered, "segments_copied_total", topic=topic_name) >= SEGMENTS
        assert moved(idle, tiered, "copied_bytes_total", topic=topic_name) > SEGMENTS * 1_000_000
        assert moved(idle, tiered, "segment_upload_seconds_count") >= SEGMENTS
        assert moved(idle, tiered, "segment_upload_seconds_sum") > 0
        # each segment: its .log, its indexes and its manifest, one PUT each (< part size)
        assert moved(idle, tiered, "s3_requests_total", operation="put_object") >= 3 * SEGMENTS
        assert moved(idle, tiered, "s3_request_seconds_count", operation="put_object") >= 3
        # COPY_SEGMENT_STARTED and FINISHED per segment, each acked and read back
        assert moved(idle, tiered, "metadata_publish_seconds_count", stage="acked") >= 2 * SEGMENTS
        assert (
            moved(idle, tiered, "metadata_publish_seconds_count", stage="read_back") >= 2 * SEGMENTS
        )
        assert total(tiered, "metadata_publish_errors_total") == 0
        assert total(tiered, "metadata_partitions_tracked") >= 1
        assert total(tiered, "s3_request_errors_total", reason="connection") == 0

        async def caught_up() -> bool:
            _, _, now = await scrape(port)
            return (
                total(now, "metadata_store_lag_records") == 0
                and total(now, "copy_lag_segments", topic=topic_name) == 0
                # the test's one-partition topic, which this one-node cluster leads
                and total(now, "partitions_led") == 1
            )

        await until(caught_up, timeout=60, what="metadata and copy lag at 0", sidecar=sidecar)

        # -- reads through the socket move the read series
        _, _, before_reads = await scrape(port)
        async with ReadClient(socket_path=tmp_path / "state" / "read.sock") as client:
            info = await client.partition(topic_name, 0)
            assert info["tiered"] is not None
            records = [r async for r in client.iter_records(topic_name, 0, 0, max_bytes=64 * 1024)]
        assert len(records) >= 1000
        assert [r.offset for r in records] == list(range(len(records)))
        _, families, read = await scrape(port)
        assert moved(before_reads, read, "read_requests_total") >= 2
        assert moved(before_reads, read, "read_request_seconds_count") >= 2
        assert moved(before_reads, read, "read_response_bytes_total") > 1_000_000
        assert moved(before_reads, read, "read_cache_lookups_total", result="miss") >= 1
        assert moved(before_reads, read, "read_fetches_total") >= 1
        assert moved(before_reads, read, "read_fetched_bytes_total") > 1_000_000
        assert moved(before_reads, read, "s3_requests_total", operation="get_object") >= 1
        assert total(read, "read_cache_bytes") > 0
        assert_bounded(families)

        # -- /readyz follows S3
        status, body = await readyz(port)
        assert (status, body["ready"]) == (200, True), body
        await asyncio.to_thread(s3.stop)
        s3_stopped = True

        async def s3_not_ready() -> bool:
            status, body = await readyz(port)
            return status == 503 and body["checks"]["s3"] is False

        await until(s3_not_ready, timeout=60, what="/readyz 503 for s3", sidecar=sidecar)
        _, _, outage = await scrape(port)
        assert total(outage, "readiness_check", check="s3") == 0
        assert total(outage, "readiness_check", check="kafka") == 1
        assert moved(read, outage, "s3_request_errors_total", operation="list_objects") >= 1

        await asyncio.to_thread(s3.start)
        s3_stopped = False

        async def ready() -> bool:
            status, body = await readyz(port)
            return status == 200 and body["ready"] is True

        await until(ready, timeout=60, what="/readyz 200 after S3 is back", sidecar=sidecar)
        _, _, back = await scrape(port)
        assert total(back, "readiness_check", check="s3") == 1

        # -- no credential in /metrics, `sidecar status` or the log
        text, _, _ = await scrape(port)
        status_run = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "sidecar", "status", "--config", str(config), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status_run.returncode == 0, status_run.stderr
        assert topic_name in status_run.stdout
        assert await sidecar.stop() == 0
        log_text = "".join(sidecar.raw)
        assert "segment_tiered" in log_text
        for secret in secrets:
            assert secret not in text
            assert secret not in status_run.stdout + status_run.stderr
            assert secret not in log_text
    finally:
        if sidecar is not None and sidecar.proc.returncode is None:
            await sidecar.kill()
        if s3_stopped or s3.running():
            await asyncio.to_thread(s3.stop)
        await delete_topic(bootstrap, topic_name)
