"""Early reads of the chunk cache on the real object store: SeaweedFS through the fault proxy,
which slows or cuts the GETs. A reader of a chunk's first bytes has them while the chunk's GET
is still on its way, and the bytes are right even when that GET is cut and made again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sidecar.observability.metrics import Metrics
from sidecar.readserver.cache import ChunkCache, ObjectRef
from sidecar.storage.s3 import S3ObjectStore
from tests.faults._harness import proxied_store

pytestmark = pytest.mark.faults

MiB = 1024 * 1024


def _cache(store: S3ObjectStore, directory: Path, metrics: Metrics) -> ChunkCache:
    return ChunkCache(
        objects=store,
        directory=directory,
        max_bytes=8 * MiB,
        chunk_size=MiB,
        readahead_chunks=0,
        fetch_timeout_s=30.0,
        metrics=metrics,
    )


def _fetched(metrics: Metrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "kafka_tiered_sidecar_read_fetches_total", {"kind": "demand", "outcome": outcome}
    )
    return value or 0.0


async def test_a_chunks_first_bytes_come_before_its_get_ends(s3, fault_proxy, s3_prefix, tmp_path):
    """With the GET held to 1 MB/s, a read of the chunk's first 64 KiB returns while the GET
    is still in flight (no demand GET ended, nothing cached), with the object's bytes; the
    rest of the chunk then comes from the same GET, which is cached whole."""
    body = os.urandom(2 * MiB)
    key = s3_prefix + "early"
    metrics = Metrics(CollectorRegistry())
    async with proxied_store(s3, fault_proxy, request_timeout_s=10.0) as store:
        await store.put(key, body)
        fault_proxy.set(
            {"fault": "bandwidth", "op": "GetObject", "rate_bps": 1_000_000, "count": None}
        )
        async with _cache(store, tmp_path / "cache", metrics) as cache:
            obj = ObjectRef(key, len(body))
            first = await cache.read(obj, 0, 64 * 1024, early=True)
            assert _fetched(metrics, "ok") == 0
            assert not cache.is_cached(obj, 0)
            assert bytes(first) == body[: 64 * 1024]
            assert metrics.read_early_bytes._value.get() == 64 * 1024
            rest = await cache.read(obj, 64 * 1024, MiB - 64 * 1024)
            assert bytes(rest) == body[64 * 1024 : MiB]
            await cache.idle()
            assert cache.is_cached(obj, 0)
            assert _fetched(metrics, "ok") == 1
        await store.delete([key])
    assert fault_proxy.stats()["injected"] == {"bandwidth": 1}


async def test_early_reads_of_a_get_that_is_cut_are_right(s3, fault_proxy, s3_prefix, tmp_path):
    """The first GET of the chunk is cut halfway (the store's client makes it again): early
    readers of its start and of its end both get the object's bytes, and the chunk cached is
    the whole of it."""
    body = os.urandom(MiB)
    key = s3_prefix + "cut"
    metrics = Metrics(CollectorRegistry())
    async with proxied_store(s3, fault_proxy, request_timeout_s=10.0) as store:
        await store.put(key, body)
        fault_proxy.set({"fault": "truncate", "op": "GetObject", "fraction": 0.5})
        async with _cache(store, tmp_path / "cache", metrics) as cache:
            obj = ObjectRef(key, len(body))
            start = await cache.read(obj, 0, 256 * 1024, early=True)
            end = await cache.read(obj, MiB - 256 * 1024, 256 * 1024, early=True)
            assert bytes(start) == body[: 256 * 1024]
            assert bytes(end) == body[MiB - 256 * 1024 :]
            await cache.idle()
            assert bytes(await cache.read(obj, 0, MiB)) == body
            assert _fetched(metrics, "ok") == 1
        await store.delete([key])
    assert fault_proxy.stats()["injected"] == {"truncate": 1}
