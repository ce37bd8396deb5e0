"""The S3 store measures every request attempt in one place: ``s3_requests_total``,
``s3_request_errors_total`` and ``s3_request_seconds`` by operation, errors by a bounded reason.
Against loopback servers (a tiny S3 look-alike, a refusing port, a silent one), no real S3."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from sidecar.errors import StorageError
from sidecar.observability.metrics import S3_ERROR_REASONS, S3_OPERATIONS, Metrics
from sidecar.storage.s3 import _OPERATION_LABELS, S3ObjectStore, _error_reason


class FakeSleep:
    async def __call__(self, delay: float) -> None:
        return None


def _value(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(f"kafka_tiered_sidecar_{name}", labels)
    return 0.0 if value is None else value


def _store(port: int, metrics: Metrics, **kwargs: Any) -> S3ObjectStore:
    return S3ObjectStore(
        bucket="unit",
        endpoint_url=f"http://127.0.0.1:{port}",
        access_key_id="AKIAUNITTESTKEY00001",
        secret_access_key="unit-test-secret-value-0123456789",
        sleep=FakeSleep(),
        metrics=metrics,
        **kwargs,
    )


@pytest.fixture
async def fake_s3() -> AsyncIterator[int]:
    """Answers HEAD /unit/present (200, 3 bytes) and 404 for any other HEAD; 503 SlowDown for
    PUT (a throttling store)."""

    async def head(request: web.Request) -> web.Response:
        if request.match_info["key"] == "present":
            return web.Response(headers={"Content-Length": "3", "ETag": '"abc"'})
        return web.Response(status=404)

    async def put(request: web.Request) -> web.Response:
        await request.read()
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            "<Message>Reduce your request rate.</Message></Error>"
        )
        return web.Response(status=503, text=body, content_type="application/xml")

    app = web.Application()
    app.router.add_route("HEAD", "/unit/{key}", head)
    app.router.add_put("/unit/{key}", put)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    try:
        yield port
    finally:
        await runner.cleanup()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class TestLabels:
    def test_every_call_site_maps_to_a_declared_operation(self) -> None:
        """The operation label has exactly the declared values: bounded, and each one used."""
        assert set(_OPERATION_LABELS.values()) == set(S3_OPERATIONS)

    def test_series_exist_before_any_request(self) -> None:
        """Every operation's counter and histogram is exported at 0 from the start."""
        metrics = Metrics()
        for operation in S3_OPERATIONS:
            assert (
                metrics.registry.get_sample_value(
                    "kafka_tiered_sidecar_s3_requests_total", {"operation": operation}
                )
                == 0
            )
            assert (
                metrics.registry.get_sample_value(
                    "kafka_tiered_sidecar_s3_request_seconds_count", {"operation": operation}
                )
                == 0
            )

    @pytest.mark.parametrize(
        ("cause", "reason"),
        [
            (ClientError({"Error": {"Code": "NoSuchKey"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, "GetObject"), "not_found"),  # noqa: E501
            (ClientError({"Error": {"Code": "InvalidRange"}, "ResponseMetadata": {"HTTPStatusCode": 416}}, "GetObject"), "invalid_range"),  # noqa: E501
            (ClientError({"Error": {"Code": "BadDigest"}, "ResponseMetadata": {"HTTPStatusCode": 400}}, "PutObject"), "checksum_mismatch"),  # noqa: E501
            (ClientError({"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "PutObject"), "access_denied"),  # noqa: E501
            (ClientError({"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject"), "throttled"),  # noqa: E501
            (ClientError({"Error": {"Code": "InternalError"}, "ResponseMetadata": {"HTTPStatusCode": 500}}, "PutObject"), "server_error"),  # noqa: E501
            (ClientError({"Error": {"Code": "MalformedXML"}, "ResponseMetadata": {"HTTPStatusCode": 400}}, "PutObject"), "client_error"),  # noqa: E501
            (ReadTimeoutError(endpoint_url="http://x"), "timeout"),
            (TimeoutError(), "timeout"),
            (EndpointConnectionError(endpoint_url="http://x"), "connection"),
            (ConnectionResetError(), "connection"),
        ],
    )  # fmt: skip
    def test_error_reasons(self, cause: BaseException, reason: str) -> None:
        """Each failure maps to one reason of the fixed set (never the exception's text)."""
        store = S3ObjectStore(bucket="unit")
        error = store._error("get", "k", cause)
        error.__cause__ = cause
        assert _error_reason(error) == reason
        assert reason in S3_ERROR_REASONS

    def test_cancelled_and_foreign_errors(self) -> None:
        assert _error_reason(asyncio.CancelledError()) == "cancelled"
        assert _error_reason(ValueError("x")) == "other"
        assert _error_reason(StorageError("ours, no cause")) == "other"


class TestMeasured:
    async def test_success_and_not_found(self, fake_s3: int) -> None:
        """A HEAD that succeeds and one that finds nothing: two requests, one not_found error,
        both timed; other operations stay at 0."""
        metrics = Metrics()
        async with _store(fake_s3, metrics) as store:
            info = await store.head("present")
            assert info.size == 3
            with pytest.raises(StorageError):
                await store.head("absent")
        assert _value(metrics, "s3_requests_total", operation="head_object") == 2
        assert _value(metrics, "s3_request_seconds_count", operation="head_object") == 2
        assert _value(metrics, "s3_request_seconds_sum", operation="head_object") > 0
        assert (
            _value(metrics, "s3_request_errors_total", operation="head_object", reason="not_found")
            == 1
        )
        assert _value(metrics, "s3_requests_total", operation="put_object") == 0

    async def test_every_retry_is_a_request(self, fake_s3: int) -> None:
        """A throttled PUT retried three times counts three requests and three throttled errors."""
        metrics = Metrics()
        async with _store(fake_s3, metrics, max_attempts=3) as store:
            with pytest.raises(StorageError, match="SlowDown"):
                await store.put("k", b"body")
        assert _value(metrics, "s3_requests_total", operation="put_object") == 3
        assert (
            _value(metrics, "s3_request_errors_total", operation="put_object", reason="throttled")
            == 3
        )
        assert _value(metrics, "s3_request_seconds_count", operation="put_object") == 3

    async def test_refused_connection(self) -> None:
        """Connection errors are counted by operation with reason connection."""
        metrics = Metrics()
        async with _store(_closed_port(), metrics, max_attempts=2) as store:
            with pytest.raises(StorageError):
                async for _ in store.list("p/"):
                    pass
        assert _value(metrics, "s3_requests_total", operation="list_objects") == 2
        assert (
            _value(
                metrics, "s3_request_errors_total", operation="list_objects", reason="connection"
            )
            == 2
        )

    async def test_cancelled_attempt_is_counted_not_timed(self) -> None:
        """An attempt cancelled by its caller is a request with reason cancelled; its partial
        duration does not skew the latency histogram."""
        accepted = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set()
            while await reader.read(65536):
                pass
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        metrics = Metrics()
        try:
            async with _store(port, metrics) as store:
                task = asyncio.create_task(store.get("k"))
                await accepted.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        finally:
            server.close()
            await server.wait_closed()
        assert _value(metrics, "s3_requests_total", operation="get_object") == 1
        assert (
            _value(metrics, "s3_request_errors_total", operation="get_object", reason="cancelled")
            == 1
        )
        assert _value(metrics, "s3_request_seconds_count", operation="get_object") == 0

    async def test_no_metrics_no_measurement(self, fake_s3: int) -> None:
        """A store built without metrics works the same (tools, Spark)."""
        async with S3ObjectStore(
            bucket="unit",
            endpoint_url=f"http://127.0.0.1:{fake_s3}",
            access_key_id="AKIAUNITTESTKEY00001",
            secret_access_key="unit-test-secret-value-0123456789",
        ) as store:
            assert (await store.head("present")).size == 3
