"""Whose last stable offset frees this broker's segments: only this broker's own, answered as
the partition's leader. Another broker's LSO says nothing about this broker's log: past a
leadership move its tail may hold records the new leader never had, which this broker
truncates as a follower. The watcher's Kafka clients are faked with aiokafka's own ListOffsets
request and response classes; the engine test runs the real engine and uploader."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.offset import OffsetResponse_v3
from structlog.testing import capture_logs

from sidecar.tiering.cluster import ClusterWatcher, TopicSelector

ME, OTHER = 1, 2

#: Kafka error codes
NOT_LEADER_OR_FOLLOWER = 6
TOPIC_AUTHORIZATION_FAILED = 29


class Brokers:
    """The brokers' answers to ListOffsets, as the watcher's consumer sees them.

    ``send`` is aiokafka's client sending to one node: that node answers, for each partition
    it leads now (``leader``), its LSO from ``lsos``, and ``refuse`` (NOT_LEADER_OR_FOLLOWER
    by default) for the others. ``end_offsets`` is aiokafka's consumer: it asks whichever
    broker leads now (after a NOT_LEADER it refreshes its metadata and asks the new leader)."""

    def __init__(self, lsos: dict[tuple[str, int], int], leader: int = ME) -> None:
        self.lsos = lsos
        self.leader = leader
        self.refuse = NOT_LEADER_OR_FOLLOWER
        self.down = False
        #: (node, isolation level, [(topic, partition, timestamp)]) of each ListOffsets sent
        self.asked: list[tuple[int, int, list[tuple[str, int, int]]]] = []
        self._topics: set[str] = set()

    @property
    def _client(self) -> Brokers:
        return self

    def set_topics(self, topics: list[str]) -> None:
        self._topics = set(topics)

    async def send(self, node_id: int, request: Any) -> Any:
        if self.down:
            raise KafkaConnectionError(f"node {node_id} unreachable")
        struct = request.prepare({2: (1, 9)})  # the ListOffsets versions of Kafka 3.9 and 4.x
        sent = struct.to_object()
        self.asked.append(
            (
                node_id,
                sent["isolation_level"],
                [
                    (t["topic"], p["partition"], p["timestamp"])
                    for t in sent["topics"]
                    for p in t["partitions"]
                ],
            )
        )
        topics = []
        for t in sent["topics"]:
            answers = []
            for p in t["partitions"]:
                lso = self.lsos.get((t["topic"], p["partition"]))
                if node_id == self.leader and lso is not None:
                    answers.append((p["partition"], 0, -1, lso))
                else:
                    answers.append((p["partition"], self.refuse, -1, -1))
            topics.append((t["topic"], answers))
        # through the wire format, as aiokafka's connection decodes it
        return OffsetResponse_v3.decode(OffsetResponse_v3(0, topics).encode())

    async def end_offsets(self, partitions: list[Any]) -> dict[Any, int]:
        return {tp: self.lsos[(tp.topic, tp.partition)] for tp in partitions}


class _Response:
    def __init__(self, obj: dict[str, Any]) -> None:
        self._obj = obj

    def to_object(self) -> dict[str, Any]:
        return self._obj


class Admin:
    """Answers Metadata (``leader`` leads ``orders-0`` and ``orders-1``) and DescribeConfigs
    (plain topics, tiered by the sidecar)."""

    def __init__(self, leader: int = ME) -> None:
        self.leader = leader

    async def _get_cluster_metadata(self, topics: object) -> _Response:
        partitions = [{"partition": p, "leader": self.leader} for p in (0, 1)]
        topic = {"topic": "orders", "error_code": 0, "partitions": partitions}
        return _Response({"brokers": [{"node_id": ME}, {"node_id": OTHER}], "topics": [topic]})

    async def describe_configs(self, resources: list[Any]) -> list[_Response]:
        answers = [
            {"error_code": 0, "resource_name": r.name, "config_entries": []} for r in resources
        ]
        return [_Response({"resources": answers})]


def watcher_with(
    brokers: Brokers, monkeypatch: pytest.MonkeyPatch, admin: Admin | None = None
) -> ClusterWatcher:
    """Broker ME's watcher, tiering every topic, on the faked clients."""
    watcher = ClusterWatcher(
        bootstrap_servers=["127.0.0.1:1"], broker_id=ME, selector=TopicSelector(include=[".*"])
    )
    answering = admin or Admin()

    async def clients() -> tuple[Any, Any]:
        return answering, brokers

    monkeypatch.setattr(watcher, "_clients", clients)
    return watcher


class TestOwnLso:
    async def test_this_broker_is_asked_for_its_read_committed_lso(self, monkeypatch):
        """The refresh sends one ListOffsets (latest, read_committed) for the partitions this
        broker leads to this broker itself; ``fetch_lso`` asks it again for one partition
        and merges a higher answer into the view."""
        brokers = Brokers({("orders", 0): 42, ("orders", 1): 7})
        watcher = watcher_with(brokers, monkeypatch)
        view = await watcher.refresh()
        assert brokers.asked == [(ME, 1, [("orders", 0, -1), ("orders", 1, -1)])]
        assert view.last_stable_offsets == {("orders", 0): 42, ("orders", 1): 7}
        brokers.lsos[("orders", 0)] = 50
        assert await watcher.fetch_lso("orders", 0) == 50
        assert brokers.asked[-1] == (ME, 1, [("orders", 0, -1)])
        assert watcher.view.lso("orders", 0) == 50
        assert watcher.view.leaders is view.leaders

    async def test_an_lso_answered_by_another_leader_is_never_taken(self, monkeypatch):
        """Leadership moved to another broker and the view does not know yet: this broker
        answers NOT_LEADER_OR_FOLLOWER, so the partition has no LSO, however far the new
        leader's has gone, and ``fetch_lso`` asks for a refresh of the leaders."""
        brokers = Brokers({("orders", 0): 42, ("orders", 1): 7})
        watcher = watcher_with(brokers, monkeypatch)
        await watcher.refresh()
        brokers.leader = OTHER
        brokers.lsos[("orders", 0)] = 5000
        view = await watcher.refresh()  # the Metadata still names this broker
        assert view.leads("orders", 0)
        assert view.lso("orders", 0) is None
        assert {node for node, _, _ in brokers.asked} == {ME}
        watcher._wake.clear()
        assert await watcher.fetch_lso("orders", 0) is None
        assert watcher.view.lso("orders", 0) is None
        assert watcher._wake.is_set()  # a refresh is asked for

    async def test_a_partition_refused_for_another_reason_is_logged_once(self, monkeypatch):
        """An error that is not about leadership (an authorizer's, say) leaves the partition
        without an LSO, keeps the others and the refresh, and is logged once as a warning."""
        brokers = Brokers({("orders", 0): 42})
        brokers.refuse = TOPIC_AUTHORIZATION_FAILED
        watcher = watcher_with(brokers, monkeypatch)
        with capture_logs() as logs:
            view = await watcher.refresh()
            await watcher.refresh()
        assert view.last_stable_offsets == {("orders", 0): 42}
        refused = [e for e in logs if e["event"] == "lso_refused"]
        assert [(e["partitions"], e["error_codes"]) for e in refused] == [
            ([("orders", 1)], [TOPIC_AUTHORIZATION_FAILED])
        ]
        watcher._wake.clear()
        assert await watcher.fetch_lso("orders", 1) is None
        assert not watcher._wake.is_set()  # leadership is not in doubt

    async def test_an_unreachable_broker_gives_no_lso(self, monkeypatch):
        """``fetch_lso`` answers None when the request fails; the view keeps what it had."""
        brokers = Brokers({("orders", 0): 42})
        watcher = watcher_with(brokers, monkeypatch)
        await watcher.refresh()
        brokers.down = True
        with capture_logs() as logs:
            assert await watcher.fetch_lso("orders", 0) is None
        assert watcher.view.lso("orders", 0) == 42
        assert [e["event"] for e in logs] == ["lso_fetch_failed"]

    async def test_a_watcher_without_a_broker_id_asks_nothing(self, monkeypatch):
        brokers = Brokers({("orders", 0): 42})
        watcher = ClusterWatcher(
            bootstrap_servers=["127.0.0.1:1"], broker_id=None, selector=TopicSelector()
        )

        async def clients() -> tuple[Any, Any]:
            return Admin(), brokers

        monkeypatch.setattr(watcher, "_clients", clients)
        assert await watcher.fetch_lso("orders", 0) is None
        assert brokers.asked == []


async def test_an_lso_answered_by_another_leader_does_not_free_this_brokers_segments(
    rig, monkeypatch
):
    """This broker rolled its third segment and waits for the LSO to pass it; leadership has
    moved and the new leader's LSO is past it, but the view still says this broker leads. The
    engine asks for the LSO now: the answer is not this broker's, so the third segment is not
    tiered (its tail may be records the new leader never had)."""
    r = rig()
    first, second, third = r.rolled
    own_lso = third.base_offset
    r.cluster.lso = own_lso
    r.cluster.set_leader(ME)
    brokers = Brokers({("orders", 0): third.end_offset + 1000}, leader=OTHER)
    watcher = watcher_with(brokers, monkeypatch)
    watcher.view = r.cluster.view
    asked = asyncio.Event()

    async def fetch_lso(topic: str, partition: int) -> int | None:
        try:
            return await watcher.fetch_lso(topic, partition)
        finally:
            asked.set()

    r.cluster.fetch_lso = fetch_lso
    worked = asyncio.Event()
    work_partition = r.engine._work_partition

    async def work(key: Any) -> bool:
        busy = await work_partition(key)
        if asked.is_set():
            worked.set()  # the pass that asked for the LSO is over
        return busy

    monkeypatch.setattr(r.engine, "_work_partition", work)
    r.start()
    async with asyncio.timeout(30):
        await worked.wait()
    await r.stop()
    assert r.finished() == [
        (first.base_offset, first.end_offset),
        (second.base_offset, second.end_offset),
    ]
    assert {node for node, _, _ in brokers.asked} == {ME}
    assert watcher._wake.is_set()  # a refresh of the leaders is asked for
