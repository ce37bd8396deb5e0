"""One sidecar per cluster runs the cluster-wide duties, elected through a Kafka consumer group.

With selective metadata tailing each sidecar reads only the metadata partitions of the user
partitions its broker hosts, so no ordinary sidecar sees the whole cluster. The duties that
need every partition (deletion of deleted topics and partitions, and the orphan scrub, which
compares the whole bucket prefix with the metadata) go to one sidecar that reads every metadata
partition: the **coordinator**.

The election is a consumer group (``remote_log_metadata.coordinator_group``) that every sidecar
of the cluster joins, subscribed to the metadata topic, with an assignor of its own
(:class:`CoordinatorAssignor`). Nobody consumes through the group: every member gets an empty
assignment whose user data names the coordinator. Kafka's group protocol gives what the duties
need:

* one answer per generation, the same for every member;
* a sidecar that stops (or whose process hangs past ``session_timeout_ms``) leaves the group,
  and the others rebalance without it;
* a rebalance revokes the role from every member before the new generation names the next
  coordinator, so two members of one generation never both hold it.

The assignor keeps the current coordinator while it is a member (a rebalance because a sidecar
joins or restarts moves nothing), else picks the member with the lowest broker id. A member
that the group dropped without knowing it keeps believing until its consumer notices: its next
heartbeat fails when the group coordinator answers it, but while that broker cannot be reached
at all aiokafka waits for it and revokes nothing, so the old coordinator holds the role for as
long as the cut lasts. The duties tolerate that overlap, because each of their steps is
idempotent (a deletion republishes DELETE_SEGMENT_STARTED and deletes objects already gone; the
scrub deletes only what no metadata references, after a grace period, and only once it has read
every metadata partition to its end offset just before listing, which a sidecar cut off from
the metadata topic's leaders cannot).

Kafka errors (the group coordinator unreachable, a missing Read ACL on the group) do not end
``run``: the role is dropped, the error logged once and reported, and the election retried with
backoff. The sidecar's other work goes on meanwhile; only the cluster duties wait.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import KafkaError

from sidecar._aio import wait_any
from sidecar.metadata.publisher import client_id
from sidecar.metadata.tailer import FETCHER_WAKE_MS
from sidecar.observability.logging import get_logger

__all__ = ["CoordinatorAssignor", "CoordinatorElection", "Member", "choose_coordinator"]

log = get_logger(__name__)

#: the group protocol's name; every member of the group must offer it
PROTOCOL: Final = "sidecar-coordinator"
_POLL_TIMEOUT_MS: Final = 1000


class Member:
    """What a member tells the group about itself (the protocol's user data)."""

    __slots__ = ("broker_id", "claims", "instance")

    def __init__(self, broker_id: int, instance: str, *, claims: bool) -> None:
        self.broker_id = broker_id
        #: random per process: tells two processes with one broker id apart
        self.instance = instance
        #: whether the last generation it saw named it (the assignor keeps the role there; a
        #: rebalance's revocation does not clear it)
        self.claims = claims

    def encode(self) -> bytes:
        return json.dumps(
            {"v": 1, "broker_id": self.broker_id, "instance": self.instance, "claims": self.claims}
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Member | None:
        """None for user data this version does not understand."""
        try:
            fields = json.loads(data)
            broker_id, instance, claims = fields["broker_id"], fields["instance"], fields["claims"]
        except (ValueError, TypeError, KeyError):
            return None
        if not (isinstance(broker_id, int) and isinstance(instance, str)):
            return None
        return cls(broker_id, instance, claims=bool(claims))

    def __repr__(self) -> str:
        return f"Member({self.broker_id}, {self.instance!r}, claims={self.claims})"


def choose_coordinator(members: Iterable[Member]) -> Member | None:
    """The member that keeps or takes the role: among those claiming it (normally one; more
    after a partition healed) the lowest broker id, else the lowest broker id of all. Ties
    (one broker id, two processes) go by instance, so every group leader picks the same."""
    candidates = list(members)
    claiming = [m for m in candidates if m.claims]
    pool = claiming or candidates
    return min(pool, key=lambda m: (m.broker_id, m.instance), default=None)


class CoordinatorAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """The group's assignor: no partition for anyone, the chosen coordinator in the user data.

    aiokafka calls ``metadata`` when joining, ``assign`` on the group's leader, and
    ``on_assignment`` on every member; an instance carries this member's identity."""

    name = PROTOCOL
    version = 1

    def __init__(self, broker_id: int, instance: str) -> None:
        self.me = Member(broker_id, instance, claims=False)
        #: whether this member holds the role now: from the assignment naming it to the next
        #: revocation
        self.holds = False
        #: the coordinator named by the last assignment (None before the first, or unreadable)
        self.elected: Member | None = None
        self.on_elected: Callable[[Member | None], None] = lambda _: None

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), self.me.encode())

    def assign(
        self,
        cluster: ClusterMetadata,
        members: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        known = [m for m in (Member.decode(meta.user_data) for meta in members.values()) if m]
        chosen = choose_coordinator(known)
        data = b"" if chosen is None else chosen.encode()
        return {
            member_id: ConsumerProtocolMemberAssignment(self.version, [], data)
            for member_id in members
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self.elected = Member.decode(assignment.user_data) if assignment.user_data else None
        self.on_elected(self.elected)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, revoked: Callable[[], None]) -> None:
        self._revoked = revoked

    def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        self._revoked()  # a rebalance starts: nobody holds the role until it ends

    def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        return None  # the assignor's on_assignment already named the coordinator


class CoordinatorElection:
    """Membership in the coordinator group; ``is_coordinator`` says whether this sidecar runs
    the cluster duties now. ``run(stopping)`` is its root task."""

    def __init__(
        self,
        *,
        bootstrap_servers: str | Sequence[str],
        broker_id: int,
        topic: str,
        group_id: str,
        client_kwargs: Mapping[str, Any] | None = None,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        on_error: Callable[[BaseException], None] | None = None,
        on_change: Callable[[bool], None] | None = None,
        retry_backoff_s: tuple[float, float] = (1.0, 30.0),
    ) -> None:
        self.topic = topic
        self.group_id = group_id
        self.broker_id = broker_id
        self._bootstrap = (
            bootstrap_servers if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
        )
        self._client_kwargs = dict(client_kwargs or {})
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._on_error = on_error
        self._on_change = on_change
        self._backoff_initial_s, self._backoff_max_s = retry_backoff_s
        self._assignor = CoordinatorAssignor(broker_id, uuid.uuid4().hex)
        self._assignor.on_elected = self._elected
        #: broker id of the coordinator the last generation named (None: none known now)
        self.coordinator: int | None = None
        #: how many times this sidecar took the role (since start)
        self.terms = 0
        #: the Kafka error of the last failed attempt, None once one succeeds
        self.last_error: str | None = None
        self._changed = asyncio.Event()

    @property
    def is_coordinator(self) -> bool:
        """Whether this sidecar holds the role in the current generation."""
        return self._assignor.holds

    async def wait_changed(self) -> None:
        """Wait until the role changes hands (or is revoked for a rebalance)."""
        await self._changed.wait()

    def _set(self, elected: Member | None, *, revoked: bool = False) -> None:
        assignor = self._assignor
        holds = elected is not None and elected.instance == assignor.me.instance
        self.coordinator = None if elected is None else elected.broker_id
        if not revoked:
            assignor.me.claims = holds  # what this member says when it next joins
        if holds == assignor.holds:
            return
        assignor.holds = holds
        self._changed.set()
        self._changed = asyncio.Event()
        if self._on_change is not None:
            self._on_change(holds)
        if holds:
            self.terms += 1
            log.info("cluster_duties_taken", group=self.group_id, broker_id=self.broker_id)
        else:
            log.info(
                "cluster_duties_released",
                group=self.group_id,
                broker_id=self.broker_id,
                coordinator=self.coordinator,
            )

    def _elected(self, elected: Member | None) -> None:
        self._set(elected)
        if elected is not None and elected.instance != self._assignor.me.instance:
            log.debug(
                "cluster_coordinator_elected", group=self.group_id, coordinator=elected.broker_id
            )

    def _revoked(self) -> None:
        self._set(None, revoked=True)

    async def run(self, stopping: asyncio.Event) -> None:
        """Stay a member until ``stopping``; rejoin with backoff after a Kafka error."""
        backoff = self._backoff_initial_s
        while not stopping.is_set():
            consumer = AIOKafkaConsumer(
                **{"consumer_timeout_ms": FETCHER_WAKE_MS, **self._client_kwargs},
                bootstrap_servers=self._bootstrap,
                client_id=client_id(self.broker_id, "coordinator"),
                group_id=self.group_id,
                enable_auto_commit=False,
                partition_assignment_strategy=(self._assignor,),
                session_timeout_ms=self._session_timeout_ms,
                heartbeat_interval_ms=self._heartbeat_interval_ms,
            )
            try:
                await consumer.start()
                consumer.subscribe(topics=[self.topic], listener=_Listener(self._revoked))
                while not stopping.is_set():
                    # nothing is assigned, so nothing is fetched: the call keeps the member
                    # alive for the group (aiokafka leaves a group it is not polled for)
                    await _poll(consumer, stopping)
                    if self.last_error is not None:
                        log.info("coordinator_election_recovered", group=self.group_id)
                        self.last_error = None
                    backoff = self._backoff_initial_s
            except KafkaError as exc:
                self._revoked()
                error = f"{type(exc).__name__}: {exc}"
                if self.last_error is None:
                    log.warning(
                        "coordinator_election_failed",
                        group=self.group_id,
                        error=error,
                        retry_in_s=backoff,
                        detail="cluster duties (topic and partition deletion, orphan scrub)"
                        " wait; the sidecar needs Read on this consumer group",
                    )
                self.last_error = error
                if self._on_error is not None:
                    self._on_error(exc)
            finally:
                self._revoked()
                await consumer.stop()  # leaves the group: the others rebalance at once
            if not stopping.is_set():
                await wait_any(stopping, within=backoff)
                backoff = min(backoff * 2, self._backoff_max_s)


async def _poll(consumer: AIOKafkaConsumer, stopping: asyncio.Event) -> None:
    fetch = asyncio.ensure_future(consumer.getmany(timeout_ms=_POLL_TIMEOUT_MS))
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((fetch, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (fetch, stop):
            if not task.done():
                task.cancel()
        await asyncio.gather(fetch, stop, return_exceptions=True)
    if fetch.done() and not fetch.cancelled():
        fetch.result()  # raises a group error (authorization, fatal coordinator errors)
