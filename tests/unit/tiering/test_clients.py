"""The admin+consumer pair: started once however many callers race for it, and always closed."""

from __future__ import annotations

import asyncio
from typing import Any

import aiokafka
import aiokafka.admin
import pytest

from sidecar.tiering._clients import AdminAndConsumer


class Clients:
    """Stands in for both aiokafka classes; ``start`` blocks until the test releases it."""

    def __init__(self) -> None:
        self.started: list[object] = []
        self.closed: list[object] = []
        self.starting = asyncio.Event()
        self.release = asyncio.Event()

    def factory(self, **_kwargs: Any) -> object:
        owner = self

        class Client:
            async def start(self) -> None:
                owner.starting.set()
                await owner.release.wait()
                owner.started.append(self)

            async def close(self) -> None:
                owner.closed.append(self)

            stop = close

        return Client()


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> Clients:
    c = Clients()
    monkeypatch.setattr(aiokafka.admin, "AIOKafkaAdminClient", c.factory)
    monkeypatch.setattr(aiokafka, "AIOKafkaConsumer", c.factory)
    return c


def _pair() -> AdminAndConsumer:
    return AdminAndConsumer(bootstrap_servers=["b:9092"], client_id="x", request_timeout_ms=1000)


async def test_concurrent_first_use_starts_one_pair(clients: Clients) -> None:
    pair = _pair()
    getters = [asyncio.create_task(pair.get()) for _ in range(5)]
    await clients.starting.wait()
    clients.release.set()
    results = await asyncio.gather(*getters)
    assert len(clients.started) == 2  # one admin, one consumer
    assert all(r == results[0] for r in results)
    await pair.aclose()
    assert sorted(map(id, clients.closed)) == sorted(map(id, clients.started))


async def test_aclose_during_a_start_closes_the_started_pair(clients: Clients) -> None:
    pair = _pair()
    getter = asyncio.create_task(pair.get())
    await clients.starting.wait()
    closer = asyncio.create_task(pair.aclose())
    clients.release.set()
    await getter
    await closer
    assert len(clients.started) == 2
    assert sorted(map(id, clients.closed)) == sorted(map(id, clients.started))


async def test_a_cancelled_start_closes_its_clients_and_the_next_caller_starts_fresh(
    clients: Clients,
) -> None:
    pair = _pair()
    first = asyncio.create_task(pair.get())
    waiter = asyncio.create_task(pair.get())
    await clients.starting.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert len(clients.closed) == 2  # the half-started pair
    clients.release.set()
    admin, consumer = await waiter
    assert clients.started == [admin, consumer]
    await pair.aclose()
    assert clients.closed[2:] == [admin, consumer]
