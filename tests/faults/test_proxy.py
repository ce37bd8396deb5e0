"""The fault proxy itself, against the session's SeaweedFS: signatures pass through it (the
client signs for the proxy's host:port, the proxy forwards that Host unchanged and SeaweedFS
accepts it), and each fault reaches the sidecar's S3 client as the failure it stands for,
which the client's retry policy rides out (one firing) without ever returning wrong bytes."""

from __future__ import annotations

import os

import pytest
import structlog.testing
from prometheus_client import CollectorRegistry

from sidecar.errors import StorageError
from sidecar.observability.metrics import Metrics
from tests.faults._harness import proxied_store
from tests.faults.proxy import FAULTS, s3_operation

pytestmark = pytest.mark.faults

#: the sidecar's ``reason`` label each fault is counted under
REASONS = {
    "internal_error": "server_error",
    "slow_down": "throttled",
    "request_timeout": "client_error",
    "truncate": "connection",
    "reset": "connection",
    "blackhole": "timeout",
}


def _errors(metrics: Metrics, reason: str) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name.endswith("s3_request_errors_total") and s.labels.get("reason") == reason
    )


def test_operations_are_named_from_path_style_requests() -> None:
    assert s3_operation("PUT", "/b/k/x.log?partNumber=2&uploadId=u") == ("UploadPart", "k/x.log")
    assert s3_operation("PUT", "/b/k") == ("PutObject", "k")
    assert s3_operation("POST", "/b/k?uploads") == ("CreateMultipartUpload", "k")
    assert s3_operation("POST", "/b/k?uploadId=u") == ("CompleteMultipartUpload", "k")
    assert s3_operation("DELETE", "/b/k?uploadId=u") == ("AbortMultipartUpload", "k")
    assert s3_operation("POST", "/b?delete") == ("DeleteObjects", "")
    assert s3_operation("GET", "/b?list-type=2&prefix=p") == ("ListObjects", "")
    assert s3_operation("GET", "/b/k%20x") == ("GetObject", "k x")


async def test_signed_requests_pass_through_unchanged(s3, fault_proxy, s3_prefix):
    """PUT, multipart, ranged GET, list and delete through the proxy: SeaweedFS checks the
    SigV4 signature over the Host the client signed (the proxy's), and accepts it."""
    body = os.urandom(11 * 1024 * 1024 + 123)  # over twice the part size: multipart
    async with proxied_store(s3, fault_proxy) as store:
        await store.put(s3_prefix + "small", b"hello")
        path = fault_proxy.log_path.parent / "big"
        path.write_bytes(body)
        await store.put_file(s3_prefix + "big", path, part_size=5 * 1024 * 1024)
        assert await store.get(s3_prefix + "small") == b"hello"
        assert (
            await store.get_range(s3_prefix + "big", 100, 5 * 1024 * 1024 + 99)
            == body[100 : 5 * 1024 * 1024 + 100]
        )
        listed = [o.key async for o in store.list(s3_prefix)]
        assert sorted(listed) == [s3_prefix + "big", s3_prefix + "small"]
        await store.delete([s3_prefix + "small", s3_prefix + "big"])
    ops = fault_proxy.stats()["requests"]
    assert ops.get("CreateMultipartUpload") == 1
    assert ops.get("UploadPart") == 3
    assert ops.get("CompleteMultipartUpload") == 1


@pytest.mark.parametrize("fault", [f for f in FAULTS if f not in ("latency", "bandwidth")])
async def test_one_fault_is_retried_and_counted(s3, fault_proxy, s3_prefix, fault):
    """Each failing fault, fired once on a GET and once on a PUT: the operation still
    succeeds with the right bytes, and the failed attempt is counted under its reason."""
    metrics = Metrics(CollectorRegistry())
    body = os.urandom(200_000)
    # only a blackhole needs the client to give up early; any other request keeps the default
    # timeout, so a slow answer from a loaded machine is not an extra failure to retry
    timeout = 5.0 if fault == "blackhole" else 30.0
    async with proxied_store(s3, fault_proxy, metrics=metrics, request_timeout_s=timeout) as store:
        fault_proxy.set({"fault": fault, "op": "PutObject", "key": "obj$"})
        await store.put(s3_prefix + "obj", body)
        fault_proxy.set({"fault": fault, "op": "GetObject", "key": "obj$"})
        assert await store.get(s3_prefix + "obj") == body
        assert await store.get_range(s3_prefix + "obj", 10, 99_999) == body[10:100_000]
        await store.delete([s3_prefix + "obj"])
    stats = fault_proxy.stats()
    assert stats["injected"] == {fault: 2}, stats
    # the PUT's fault hit the upload (truncate and reset act on the response, which S3
    # answers after storing the object: the repeated PUT overwrites it with the same bytes)
    assert _errors(metrics, REASONS[fault]) >= 1


async def test_slow_faults_only_delay(s3, fault_proxy, s3_prefix):
    """Latency and a bandwidth cap slow a GET down and change nothing else."""
    body = os.urandom(300_000)
    async with proxied_store(s3, fault_proxy) as store:
        await store.put(s3_prefix + "obj", body)
        fault_proxy.set(
            {"fault": "latency", "op": "GetObject", "delay_s": 0.3},
            {"fault": "bandwidth", "op": "GetObject", "rate_bps": 1_000_000},
        )
        assert await store.get(s3_prefix + "obj") == body
        assert await store.get(s3_prefix + "obj") == body
        await store.delete([s3_prefix + "obj"])
    assert fault_proxy.stats()["injected"] == {"latency": 1, "bandwidth": 1}


async def test_faults_beyond_the_retry_budget_surface_as_errors(s3, fault_proxy, s3_prefix):
    """A fault that keeps firing exhausts the bounded retries: a StorageError, no hang."""
    async with proxied_store(s3, fault_proxy, max_attempts=3) as store:
        fault_proxy.set({"fault": "slow_down", "op": "PutObject", "count": None})
        with pytest.raises(StorageError, match="SlowDown"):
            await store.put(s3_prefix + "obj", b"x")
    assert fault_proxy.stats()["injected"] == {"slow_down": 3}


@pytest.mark.parametrize("fault", ["truncate", "reset"])
async def test_a_completion_whose_answer_is_lost_is_not_uploaded_again(
    s3, fault_proxy, s3_prefix, fault
):
    """The store completes the upload but its answer never arrives: the repeated completion
    finds no such upload. The object at the key is the one the parts make (its multipart
    ETag and composite checksum say so), so the upload counts as done, once."""
    metrics = Metrics(CollectorRegistry())
    body = os.urandom(11 * 1024 * 1024 + 123)
    path = fault_proxy.log_path.parent / "big"
    path.write_bytes(body)
    async with proxied_store(s3, fault_proxy, metrics=metrics) as store:
        fault_proxy.set({"fault": fault, "op": "CompleteMultipartUpload"})
        info = await store.put_file(s3_prefix + "big", path, part_size=5 * 1024 * 1024)
        assert info.size == len(body)
        assert await store.get(s3_prefix + "big") == body
        assert [u async for u in store.list_multipart_uploads(s3_prefix)] == []
        await store.delete([s3_prefix + "big"])
    stats = fault_proxy.stats()
    assert stats["injected"] == {fault: 1}, stats
    ops = stats["requests"]
    assert ops.get("CreateMultipartUpload") == 1, ops
    assert ops.get("UploadPart") == 3, ops


@pytest.mark.parametrize("fault", ["truncate", "reset"])
async def test_an_upload_started_by_a_lost_creation_is_aborted(s3, fault_proxy, s3_prefix, fault):
    """The store starts a multipart upload but its answer never arrives, so the creation is
    sent again and a second upload starts. The first, which nobody would ever complete, is
    aborted at once instead of waiting for the orphan scrub."""
    body = os.urandom(11 * 1024 * 1024 + 123)
    path = fault_proxy.log_path.parent / "big"
    path.write_bytes(body)
    async with proxied_store(s3, fault_proxy) as store:
        fault_proxy.set({"fault": fault, "op": "CreateMultipartUpload"})
        with structlog.testing.capture_logs() as logs:
            await store.put_file(s3_prefix + "big", path, part_size=5 * 1024 * 1024)
        assert await store.get(s3_prefix + "big") == body
        assert [u async for u in store.list_multipart_uploads(s3_prefix)] == []
        await store.delete([s3_prefix + "big"])
    stats = fault_proxy.stats()
    assert stats["injected"] == {fault: 1}, stats
    ops = stats["requests"]
    assert ops.get("CreateMultipartUpload") == 2, ops
    assert ops.get("AbortMultipartUpload") == 1, ops
    aborted = [e for e in logs if e["event"] == "multipart_upload_aborted"]
    assert [e["key"] for e in aborted] == [s3_prefix + "big"]


async def test_an_upload_goes_on_when_the_lost_creation_cannot_be_aborted(
    s3, fault_proxy, s3_prefix
):
    """When the store will not list the open uploads, the first upload stays for the orphan
    scrub, with a warning; the object is still uploaded, once."""
    body = os.urandom(11 * 1024 * 1024 + 123)
    path = fault_proxy.log_path.parent / "big"
    path.write_bytes(body)
    async with proxied_store(s3, fault_proxy, max_attempts=2) as store:
        fault_proxy.set(
            {"fault": "truncate", "op": "CreateMultipartUpload"},
            {"fault": "internal_error", "op": "ListMultipartUploads", "count": None},
        )
        with structlog.testing.capture_logs() as logs:
            await store.put_file(s3_prefix + "big", path, part_size=5 * 1024 * 1024)
        fault_proxy.clear()
        assert await store.get(s3_prefix + "big") == body
        left = [u async for u in store.list_multipart_uploads(s3_prefix)]
        assert [u.key for u in left] == [s3_prefix + "big"]
        for upload in left:
            await store.abort_multipart_upload(upload.key, upload.upload_id)
        await store.delete([s3_prefix + "big"])
    warned = [e for e in logs if e["event"] == "multipart_abort_failed"]
    assert len(warned) == 1, warned
    assert "InternalError" in warned[0]["error"], warned
    assert fault_proxy.stats()["requests"].get("CompleteMultipartUpload") == 1
