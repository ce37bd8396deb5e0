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
UNAVAILABLE, TIMEOUT = (503, "storage_unavailable"), (504, "storage_timeout")
PERSISTENT = {
    "internal_error": {UNAVAILABLE},
    "slow_down": {UNAVAILABLE},
    "request_timeout": {UNAVAILABLE},
    "truncate": {UNAVAILABLE},
    "reset": {UNAVAILABLE},
    # each request times out; the retries give up (503) or the read's deadline passes (504)
    "blackhole": {UNAVAILABLE, TIMEOUT},
}
#: one S3 request, and one read's S3 calls with their retries; the request timeout stays far
#: above the latency fault's 0.3 s, so that fault never turns into a timeout and a retry
REQUEST_TIMEOUT_S, FETCH_TIMEOUT_S = 3.0, 20.0


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
    segments = await backlog_topic(kafka, topic_name, records=4700)
    run = sidecar_config(
        tmp_path,
        kafka,
        s3_proxied,
        topic_name,
        s3_prefix,
        s3_options={"request_timeout_s": REQUEST_TIMEOUT_S},
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
        # two offsets a fault, in chunks no other read touches: 130 records (~130 KiB, two
        # 64 KiB chunks) apart, none in a segment's first chunk (read first, for its index)
        bases = [s.base_offset for s in segments]
        offsets = [
            o
            for o in range(0, segments[-1].end_offset, 130)
            if not any(b <= o < b + 130 for b in bases)
        ]
        assert len(offsets) >= 2 * len(FAULTS)
        async with aiohttp.ClientSession(connector=connector) as http:
            for segment in segments:  # manifests and offset indexes cached: only .log GETs
                status, _, document = await _read(http, topic_name, segment.base_offset)
                assert status == 200, document
                _check_record(segment.base_offset, document)
            outcomes = {}
            for k, fault in enumerate(FAULTS):
                transient, persistent = offsets[2 * k], offsets[2 * k + 1]
                rule: dict[str, Any] = {"fault": fault, "op": "GetObject", "key": r"\.log$"}
                if fault == "latency":
                    rule["delay_s"] = 0.3
                if fault == "bandwidth":
                    rule["rate_bps"] = 256 * 1024
                fault_proxy.set({**rule, "count": 2})
                status, _, document = await _read(http, topic_name, transient)
                assert status == 200, (fault, document)
                _check_record(transient, document)
                # a failing fault fires on the attempt and its retry; a slow one on the one GET
                fired = 2 if fault in PERSISTENT else 1
                assert fault_proxy.stats()["injected"].get(fault) == fired, fault

                fault_proxy.set({**rule, "count": None})
                status, retry_after, document = await _read(http, topic_name, persistent)
                if fault in PERSISTENT:
                    assert (status, document["code"]) in PERSISTENT[fault], (fault, document)
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
