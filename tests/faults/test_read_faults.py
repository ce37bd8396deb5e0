"""Socket reads under each S3 fault: the daemon tiers a backlog (no fault), then every GET of
a segment's .log goes through a fault. A fault the retries absorb (two firings) still gives
the right record; a fault that persists gives a clear 503 storage_unavailable or 504
storage_timeout with Retry-After, never a record with wrong bytes; once the fault is gone
the same read gives the right record (no chunk cache entry was poisoned)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e._support import Sidecar, clean_prefix, delete_topic
from tests.faults._harness import FaultProxy
from tests.faults._scenario import backlog_topic, sidecar_config, wait_all_tiered
from tests.faults.proxy import FAULTS
from tests.sidecar_runner import sidecar_env

pytestmark = [pytest.mark.faults, pytest.mark.e2e]

#: the answer a persistent fault gives (latency and bandwidth only slow reads down)
PERSISTENT = {
    "internal_error": (503, "storage_unavailable"),
    "slow_down": (503, "storage_unavailable"),
    "request_timeout": (503, "storage_unavailable"),
    "truncate": (503, "storage_unavailable"),
    "reset": (503, "storage_unavailable"),
    "blackhole": (504, "storage_timeout"),
}
FETCH_TIMEOUT_S = 3.0


def _value(i: int) -> bytes:
    """What tests.helpers.produce wrote at offset ``i`` (a fresh one-partition topic)."""
    return (f"{i:08d}".encode() * 126)[:1000]


async def _read(http: aiohttp.ClientSession, topic: str, offset: int) -> tuple[int, Any, Any]:
    url = f"http://localhost/v1/topics/{topic}/partitions/0/records"
    params = {"offset": str(offset), "max_records": "1", "max_bytes": "1", "format": "json"}
    async with http.get(url, params=params) as response:
        return response.status, response.headers.get("Retry-After"), await response.json()


def _check_record(offset: int, document: Any) -> None:
    record = document["records"][0]
    assert record["offset"] == offset
    assert base64.b64decode(record["value"]) == _value(offset), f"wrong bytes at {offset}"


async def test_reads_under_s3_faults_are_right_or_refused(
    kafka, s3, s3_proxied, fault_proxy: FaultProxy, topic_name, s3_prefix, tmp_path: Path
):
    bootstrap = kafka.bootstrap_servers
    segments = await backlog_topic(kafka, topic_name)
    run = sidecar_config(
        tmp_path,
        kafka,
        s3_proxied,
        topic_name,
        s3_prefix,
        read_server={
            "chunk_size_bytes": 64 * 1024,
            "prefetch_chunks": 0,
            "fetch_timeout_s": FETCH_TIMEOUT_S,
        },
    )
    sidecar = await Sidecar.start(run.config, sidecar_env(s3), tmp_path / "sidecar.log")
    connector = aiohttp.UnixConnector(path=str(run.state_dir / "read.sock"))
    try:
        await wait_all_tiered([sidecar], segments, timeout=120)
        last = segments[-1].end_offset
        slot = last // (2 * len(FAULTS) + 1)  # two fresh chunks a fault
        assert slot > 70  # more than a 64 KiB chunk of 1 KB records apart
        async with aiohttp.ClientSession(connector=connector) as http:
            for segment in segments:  # manifests and offset indexes cached: only .log GETs
                status, _, document = await _read(http, topic_name, segment.base_offset)
                assert status == 200, document
                _check_record(segment.base_offset, document)
            outcomes = {}
            for k, fault in enumerate(FAULTS):
                transient = slot * (2 * k + 1)
                persistent = transient + slot
                rule: dict[str, Any] = {"fault": fault, "op": "GetObject", "key": r"\.log$"}
                if fault == "latency":
                    rule["delay_s"] = 0.3
                if fault == "bandwidth":
                    rule["rate_bps"] = 256 * 1024
                fault_proxy.set({**rule, "count": 2})
                status, _, document = await _read(http, topic_name, transient)
                assert status == 200, (fault, document)
                _check_record(transient, document)
                assert fault_proxy.stats()["injected"].get(fault) == 2, fault

                fault_proxy.set({**rule, "count": None})
                status, retry_after, document = await _read(http, topic_name, persistent)
                if fault in PERSISTENT:
                    assert (status, document["code"]) == PERSISTENT[fault], (fault, document)
                    assert retry_after is not None, fault
                    assert int(retry_after) >= 1
                    assert "records" not in document
                else:
                    assert status == 200, (fault, document)
                    _check_record(persistent, document)
                outcomes[fault] = status
                fault_proxy.clear()
                status, _, document = await _read(http, topic_name, persistent)
                assert status == 200, (fault, document)
                _check_record(persistent, document)
        assert not sidecar.exited
        assert await sidecar.stop() == 0
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        clean_prefix(s3, s3_prefix)
        await delete_topic(bootstrap, topic_name)
