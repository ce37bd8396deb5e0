"""A Kafka admin client and a consumer, started together on first use and closed together.

The cluster watcher and the retention manager each own one pair (their requests must not queue
behind each other's); this is the one place that starts and closes such a pair.

Starting is single-flight: concurrent first callers (the cluster refresh and several workers'
offset look-ups after a reconnect) wait for the one start under way instead of each starting a
pair of their own, and ``aclose`` waits for that start too, so every started client is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.observability.logging import get_logger

__all__ = ["AdminAndConsumer", "close_quietly"]

log = get_logger(__name__)


class AdminAndConsumer:
    """``await pair.get()`` → (admin, consumer), started on the first call; ``aclose`` closes
    both (idempotent) so that the next ``get`` starts fresh ones (after a connection error)."""

    def __init__(
        self,
        *,
        bootstrap_servers: Sequence[str],
        client_id: str,
        request_timeout_ms: int,
        client_options: Mapping[str, Any] | None = None,
        consumer_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._bootstrap = list(bootstrap_servers)
        self._client_id = client_id
        self._timeout_ms = request_timeout_ms
        self._options = dict(client_options or {})
        self._consumer_options = dict(consumer_options or {})
        self._admin: Any = None
        self._consumer: Any = None
        # Held while a pair starts and while it closes: a second caller waits for the first
        # start instead of starting another pair that nothing would ever close.
        self._lock = asyncio.Lock()

    async def get(self) -> tuple[Any, Any]:
        """The started admin client and consumer."""
        if self._admin is not None:
            return self._admin, self._consumer
        async with self._lock:
            if self._admin is None:
                self._admin, self._consumer = await self._start()
            return self._admin, self._consumer

    async def _start(self) -> tuple[Any, Any]:
        """A fresh, started pair; on failure or cancellation nothing is left open."""
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(
            bootstrap_servers=self._bootstrap,
            request_timeout_ms=self._timeout_ms,
            client_id=f"{self._client_id}-admin",
            **self._options,
        )
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            enable_auto_commit=False,
            request_timeout_ms=self._timeout_ms,
            client_id=f"{self._client_id}-offsets",
            **self._consumer_options,
            **self._options,
        )
        try:
            await admin.start()
            await consumer.start()
        except BaseException:
            await close_quietly(admin.close(), consumer.stop())
            raise
        return admin, consumer

    async def aclose(self) -> None:
        """Close both clients; idempotent. A start under way finishes first and is closed too."""
        async with self._lock:
            admin, consumer = self._admin, self._consumer
            self._admin = self._consumer = None
            if admin is not None:
                await close_quietly(admin.close(), consumer.stop())


async def close_quietly(*closers: Any) -> None:
    """Await each closer; a failure is logged at debug level (closing is best effort)."""
    for closer in closers:
        try:
            await closer
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.debug("client_close_failed", error=str(exc))
