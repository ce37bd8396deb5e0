"""The coordinator election on the real broker's group coordinator: one holder per cluster,
kept while it is a member, handed over when it leaves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from sidecar.retention.election import CoordinatorElection
from tests.helpers import create_topic

pytestmark = pytest.mark.integration


class _Running:
    def __init__(self, election: CoordinatorElection) -> None:
        self.election = election
        self.stopping = asyncio.Event()
        self.task = asyncio.create_task(election.run(self.stopping))

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.wait_for(self.task, 60)


@contextlib.asynccontextmanager
async def _members(
    bootstrap: str, topic: str, group: str, broker_ids: list[int]
) -> AsyncIterator[dict[int, _Running]]:
    running = {
        b: _Running(
            CoordinatorElection(
                bootstrap_servers=bootstrap,
                broker_id=b,
                topic=topic,
                group_id=group,
                # members leave with LeaveGroup here; a long session keeps a member that a
                # loaded machine slows down in the generation rather than dropping it
                session_timeout_ms=30000,
                heartbeat_interval_ms=500,
            )
        )
        for b in broker_ids
    }
    try:
        yield running
    finally:
        for member in running.values():
            if not member.task.done():
                await member.stop()


async def _settled(
    members: dict[int, _Running], *, holder: int | None = None, timeout: float = 60
) -> int:
    """Wait until one member holds the role and every running member names it (``holder``
    when given); return the holder's broker id."""

    def agreed() -> int | None:
        live = {b: m for b, m in members.items() if not m.task.done()}
        holders = [b for b, m in live.items() if m.election.is_coordinator]
        if len(holders) != 1 or (holder is not None and holders != [holder]):
            return None
        if all(m.election.coordinator == holders[0] for m in live.values()):
            return holders[0]
        return None

    async with asyncio.timeout(timeout):
        while (found := agreed()) is None:
            waits = [
                asyncio.ensure_future(m.election.wait_changed())
                for m in members.values()
                if not m.task.done()
            ]
            # a member that already settled does not change again: bound the wait, re-check
            await asyncio.wait(waits, timeout=0.5)
            for w in waits:
                w.cancel()
    return found


class TestCoordinatorElection:
    async def test_one_holder_kept_while_member_then_handed_over(self, kafka, topic_name):
        """Three members settle on one holder, and nobody else ever holds the role; a member
        with a lower id joining later does not take it over; the holder leaving hands it to
        the lowest remaining id.

        Which of the three gets the role first depends on which joins the group's first
        generation (the broker's initial rebalance delay is 0 here): the lowest id of that
        generation, kept afterwards. A holder may be revoked and re-granted by the
        rebalances of the later joiners, so its term count is not asserted, only that no
        other member ever took the role."""
        await create_topic(kafka.bootstrap_servers, topic_name, partitions=3)
        group = f"{topic_name}.coordinator"
        async with _members(kafka.bootstrap_servers, topic_name, group, [5, 3, 7]) as members:
            first = await _settled(members)
            assert members[first].election.terms >= 1
            assert all(m.election.terms == 0 for b, m in members.items() if b != first)
            async with _members(kafka.bootstrap_servers, topic_name, group, [1]) as late:
                everyone = {**members, **late}
                # the rebalance revokes and re-grants: the holder keeps it (sticky)
                await _settled(everyone, holder=first)
                assert late[1].election.terms == 0
                await members[first].stop()
                await _settled(everyone, holder=1)
                assert late[1].election.terms >= 1
                assert all(m.election.terms == 0 for b, m in members.items() if b != first)
                assert sum(m.election.is_coordinator for m in everyone.values()) == 1

    async def test_unreachable_kafka_holds_no_role_and_reports(self):
        """No group coordinator to reach: the member holds no role, reports the error and
        keeps retrying (run does not end)."""
        from tests.conftest import stack

        errors: list[BaseException] = []
        election = CoordinatorElection(
            bootstrap_servers=f"127.0.0.1:{stack.free_port()}",
            broker_id=1,
            topic="t",
            group_id="g",
            on_error=errors.append,
            retry_backoff_s=(0.05, 0.1),
            client_kwargs={"request_timeout_ms": 1000},
        )
        running = _Running(election)
        try:
            async with asyncio.timeout(60):
                while len(errors) < 2:  # a retry happened: run is still going
                    await asyncio.sleep(0.05)
            assert not running.task.done()
            assert not election.is_coordinator
            assert election.last_error is not None
        finally:
            await running.stop()
