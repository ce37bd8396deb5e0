"""MetadataTailer: reads ``__remote_log_metadata`` into the local RemoteSegmentStore, the way
Kafka's ``ConsumerTask`` feeds ``RemoteLogMetadataCache`` (kafka-kip405-internals.md §2.3), but
resuming from the offsets stored with the state instead of re-reading from offset 0.

* A consumer with ``assign()`` (no group, no commits, ``read_committed``) reads the metadata
  partitions the sidecar tracks (``track``/``untrack``: those that hold its user partitions'
  events). Each partition resumes at the store's consumed offset + 1, or at its beginning when
  it was never read. The consumer never resets a position itself (``auto_offset_reset=none``):
  a partition that ends before that offset was truncated or recreated, which stops the tailer
  (MetadataStoreError, below), at assignment or mid-run alike; one whose records were deleted
  before they were read (``metadata_records_expired_unread``, ``on_expired``) goes on after
  them.
* Each fetch is decoded and applied to the store in one transaction, together with the consumed
  offsets (``asyncio.to_thread``: the loop keeps serving while SQLite writes).
* A record that does not decode (MetadataFormatError, or a null value) never stops the tailer,
  unlike Kafka's ConsumerTask: it is counted (``undecodable_records``, ``on_undecodable``), logged
  with its metadata partition and offset, and skipped; its offset still counts as consumed.
  Events the store drops (invalid transitions, snapshots) are logged the same way.
* ``caught_up(p)``: everything up to the end offset seen when ``p`` was assigned is applied
  (TBRLMM's initialization rule, ``readOffset + 1 >= endOffset`` or an empty partition).
  ``wait_for_offset`` is the publisher's read-after-write (TBRLMM's waitTillConsumptionCatchesUp).
  ``sync(p)`` waits until everything published to ``p`` so far is applied: a new leader reads the
  previous leader's last events before it plans. ``lag()`` is how many records of the tracked
  partitions are not applied yet (the ``metadata_store_lag_records`` gauge), from the end offsets
  the consumer's fetches report and those of the progress check.
* **Progress check.** A metadata partition whose leader the consumer cannot reach returns no
  records and raises nothing (aiokafka retries quietly), so the lag above would keep the last
  fetch's end offset and the store would fall behind unseen. Every ``progress_check_s`` the
  tailer asks the end offsets of the partitions it reads (one ListOffsets): the lag follows
  them, and a partition behind its end whose position has not moved since the last check is
  ``stalled`` (``metadata_partition_stalled``, then ``metadata_partition_resumed``). A check
  that fails (a partition without a leader fails the whole request) is logged and counted, and
  the reading goes on. Likewise at assignment: a partition whose beginning and end offsets
  cannot be read (``metadata_partition_offsets_failed``) is left out of the consumer's
  assignment (assigned, a partition without a leader has aiokafka's fetcher ask for metadata
  back to back) and asked again beside the reading, with a backoff, until it answers
  (``metadata_partition_offsets_answered``); the others are read meanwhile, and the tailer is
  not ``healthy``.
* **Scopes** (selective tailing): ``want(partitions)`` limits what a metadata partition's
  events are applied for to the user partitions wanted (Kafka's ``ConsumerTask`` applies only
  those of its assigned partitions); the other events are read and skipped
  (``filtered_records``). A partition wanted on a metadata partition already read is caught up
  by reading that metadata partition again from its beginning, applying only the newcomer's
  events up to where the reading was, then everything of the scope: its partial state, if
  any, is dropped first, and the scope is stored only once the re-read passed that point, so a
  crash in between re-reads it again. ``caught_up`` is False meanwhile. ``want_everything``
  does the same for every user partition (the coordinator); ``narrow`` drops the partitions
  no longer wanted from the store. A metadata partition tracked with ``track`` alone is read
  whole, as are those of stores written before scopes.
* Kafka errors do not end ``run``: unlike TBRLMM (whose broker shuts down when initialization
  fails), the tailer logs ``metadata_tail_failed``, reports it (``healthy``, ``last_error``,
  ``on_error``: readiness and metrics), and retries with exponential backoff from the stored
  offsets. Waiters keep waiting (their own timeouts bound them). A store that is ahead of the
  topic (MetadataStoreError) cannot be retried away and ends ``run``; when ``run`` ends, every
  waiter fails with MetadataPublishError. A store whose disk refuses a write (full, I/O error)
  is reported and retried like a Kafka error: the transaction was rolled back, and the same
  records are fetched and applied again once the disk takes writes.

It never writes to Kafka; publishing is publisher.py.
"""

from __future__ import annotations

import asyncio
import enum
import sqlite3
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from sidecar._aio import wait_any
from sidecar.errors import MetadataPublishError
from sidecar.metadata.errors import (
    MetadataFormatError,
    MetadataNotTrackedError,
    MetadataStoreError,
    MetadataTailError,
)
from sidecar.metadata.events import RemoteLogMetadata, SegmentMetadataSnapshot, TopicIdPartition
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.publisher import DEFAULT_METADATA_TOPIC, client_id
from sidecar.metadata.serde import decode
from sidecar.metadata.store import ApplyResult, RemoteSegmentStore, Scope
from sidecar.observability.logging import get_logger

__all__ = ["MetadataTailer", "UndecodableCallback"]

log = get_logger(__name__)

#: called with (metadata partition, offset, error) for each record that does not decode
UndecodableCallback = Callable[[int, int, MetadataFormatError], None]
#: called with each Kafka error the tailer retries
_ErrorCallback = Callable[[BaseException], None]

_NULL_VALUE: Final = MetadataFormatError("the record value is null", position=0)
_POLL_TIMEOUT_MS: Final = 1000  # a broker long-poll; new records, stop and track() end it early
#: ``consumer_timeout_ms`` of the daemon's consumers: how often aiokafka's background fetch
#: routine wakes with nothing to do (its default, 200 ms, is five event-loop wake-ups a second
#: for the daemon's life); fetch responses, consumed records and assignment changes wake it at
#: once whatever this is
FETCHER_WAKE_MS: Final = 1000


_Key = tuple[uuid.UUID, int]


def _in(scope: Scope, key: _Key) -> bool:
    return scope is None or key in scope


@dataclass
class _Replay:
    """A metadata partition read again from its beginning: up to ``until`` (the last offset
    applied before) only the events of partitions in ``new`` and not in ``old`` apply."""

    until: int
    old: frozenset[_Key]
    new: Scope
    #: the last offset of this re-read handled so far
    done: int = -1

    def wanted(self, offset: int, key: _Key) -> bool:
        if offset <= self.until:
            return _in(self.new, key) and key not in self.old
        return _in(self.new, key)


class _State(enum.Enum):
    NEW = "new"
    STARTED = "started"
    CLOSED = "closed"


class _Ingested:
    """What one fetch did, computed in the worker thread."""

    __slots__ = ("consumed", "origins", "result", "undecodable")

    def __init__(
        self,
        result: ApplyResult,
        origins: list[tuple[int, int]],
        undecodable: list[tuple[int, int, MetadataFormatError]],
        consumed: dict[int, int],
    ) -> None:
        self.result = result
        self.origins = origins
        self.undecodable = undecodable
        self.consumed = consumed


class MetadataTailer:
    """Tails the tracked metadata partitions into ``store``; ``run(stopping)`` is its root task.

    Use as an async context manager (``start``/``aclose``) around ``run``. ``client_kwargs`` go to
    the aiokafka consumer (security settings); the settings Kafka forces cannot be overridden.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str | Sequence[str],
        store: RemoteSegmentStore,
        broker_id: int,
        topic: str = DEFAULT_METADATA_TOPIC,
        client_kwargs: Mapping[str, Any] | None = None,
        max_batch_records: int = 5000,
        on_undecodable: UndecodableCallback | None = None,
        on_error: _ErrorCallback | None = None,
        on_expired: Callable[[int], None] | None = None,
        on_rejected: Callable[[str], None] | None = None,
        retry_backoff_s: tuple[float, float] = (0.5, 30.0),
        num_partitions: int | None = None,
        scoped: bool = False,
        progress_check_s: float = 30.0,
    ) -> None:
        """``num_partitions``: the metadata topic's partition count, needed by ``want``;
        ``scoped``: ``want`` limits what is applied (otherwise it only tracks);
        ``on_expired(count)``: ``count`` records were deleted from the topic unread;
        ``on_rejected(reason)``: the store dropped an event, as Kafka's cache would."""
        self.topic = topic
        self._num_partitions = num_partitions
        self._scoped = scoped
        self.broker_id = broker_id
        self._bootstrap = (
            bootstrap_servers if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
        )
        self._store = store
        self._client_kwargs = dict(client_kwargs or {})
        self._max_records = max_batch_records
        self._on_undecodable = on_undecodable
        self._on_error = on_error
        self._on_expired = on_expired
        self._on_rejected = on_rejected
        self._backoff_initial_s, self._backoff_max_s = retry_backoff_s
        self._progress_check_s = progress_check_s
        self._next_progress_check = 0.0
        #: the progress check under way, beside the reading (a request to a partition without
        #: a leader waits out the request timeout: the reading must not wait with it)
        self._progress_task: asyncio.Task[None] | None = None
        #: metadata partition → end offset at the last progress check
        self._checked_ends: dict[int, int] = {}
        #: metadata partition → its position at the last progress check, while behind its end
        self._checked_positions: dict[int, int] = {}
        #: metadata partitions behind their end whose position did not move between two checks
        self.stalled: frozenset[int] = frozenset()
        #: tracked partitions whose bounds Kafka could not give: not assigned, asked again by
        #: the probe beside the reading (_bounds, _probe_bounds)
        self._unanswered: set[int] = set()
        self._bounds_backoff = self._backoff_initial_s
        self._probe_task: asyncio.Task[None] | None = None
        #: of those, the ones a scope change has to read again from their beginning
        self._restart_held: set[int] = set()
        #: partition → (beginning, end) the probe got, for the next assignment
        self._probed: dict[int, tuple[int, int]] = {}
        self._state = _State.NEW
        self._consumer: AIOKafkaConsumer | None = None
        self._tracked: set[int] = set()
        self._assigned: frozenset[int] = frozenset()
        self._changed = asyncio.Event()  # track()/untrack() since the last assignment
        self._targets: dict[int, int] = {}  # end offset seen at assignment
        self._beginnings: dict[int, int] = {}  # log start offset seen at assignment
        self._caught_up: set[int] = set()
        self._consumed: dict[int, int] = {}  # mirrors the store's committed consumed offsets
        self._scopes: dict[int, Scope] = {}  # mirrors the store's scopes (absent: read whole)
        self._pending: dict[int, Scope] = {}  # scopes wanted, applied at the next assignment
        self._narrowed: dict[int, frozenset[_Key]] = {}  # scopes to shrink to, likewise
        self._unwanted = 0  # see unwanted_count
        self._replays: dict[int, _Replay] = {}
        self._progress = asyncio.Event()  # replaced after every change that waiters look at
        self._failure: BaseException | None = None
        #: records received from the broker (since start)
        self.records_fetched = 0
        #: records whose value did not decode, skipped (since start)
        self.undecodable_records = 0
        #: decoded events the store dropped (since start; the store keeps persistent counters)
        self.rejected_events = 0
        #: decoded events skipped because their user partition is not wanted (since start)
        self.filtered_records = 0
        #: records the metadata topic deleted before they were read (see _assign)
        self.expired_records = 0
        #: the Kafka error of the last failed attempt, None once an attempt succeeds again
        self.last_error: str | None = None

    # --- lifecycle

    async def start(self) -> None:
        """Bind the store to the topic and start the consumer."""
        if self._state is not _State.NEW:
            raise RuntimeError(f"MetadataTailer cannot start: it is {self._state.value}")
        self._state = _State.STARTED
        self._store.claim_topic(self.topic)
        self._consumed = self._store.consumed_offsets()
        self._scopes = self._store.scopes()
        consumer = AIOKafkaConsumer(
            **{"consumer_timeout_ms": FETCHER_WAKE_MS, **self._client_kwargs},
            bootstrap_servers=self._bootstrap,
            client_id=client_id(self.broker_id, "consumer"),
            group_id=None,
            enable_auto_commit=False,
            # an offset out of range is raised, not reset: see _out_of_range
            auto_offset_reset="none",
            isolation_level="read_committed",
        )
        try:
            await consumer.start()
        except KafkaError as exc:
            await consumer.stop()
            self._fail(MetadataTailError(f"cannot start the metadata consumer: {exc!r}"))
            raise MetadataTailError(f"cannot start the metadata consumer: {exc!r}") from exc
        self._consumer = consumer

    async def aclose(self) -> None:
        """Stop the consumer; idempotent. Waiters fail with MetadataPublishError."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        self._fail(MetadataPublishError("the metadata tailer was closed"))
        if self._consumer is not None:
            await self._consumer.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- what is read

    @property
    def tracked(self) -> frozenset[int]:
        """The metadata partitions being read."""
        return frozenset(self._tracked)

    def is_tracked(self, metadata_partition: int) -> bool:
        """Whether ``metadata_partition`` is read."""
        return metadata_partition in self._tracked

    @property
    def unwanted_count(self) -> int:
        """How often partitions may have stopped being read (a narrowing, an untrack): while
        it stays the same, every partition wanted before is still wanted, so a caller that
        wants the same partitions over and over can skip them."""
        return self._unwanted

    def track(self, metadata_partitions: Iterable[int]) -> None:
        """Start reading these metadata partitions too (from the stored offsets)."""
        added = set(metadata_partitions) - self._tracked
        if added:
            self._tracked |= added
            self._changed.set()

    def untrack(self, metadata_partitions: Iterable[int]) -> None:
        """Stop reading these metadata partitions; their waiters fail with
        MetadataNotTrackedError. Their stored state and offsets are kept."""
        removed = self._tracked & set(metadata_partitions)
        if removed:
            self._unwanted += 1
            self._tracked -= removed
            for partition in removed:
                self._targets.pop(partition, None)
                self._beginnings.pop(partition, None)
                self._caught_up.discard(partition)
            self._changed.set()
            self._notify()

    def _metadata_partition(self, tp: TopicIdPartition) -> int:
        if self._num_partitions is None:
            raise RuntimeError("MetadataTailer needs num_partitions to scope its reading")
        return metadata_partition(tp, self._num_partitions)

    def _scope(self, mp: int) -> Scope:
        """The scope ``mp`` is (or is about to be) read with; None: every user partition."""
        replay = self._replays.get(mp)
        if mp in self._pending:
            return self._pending[mp]
        if replay is not None:
            return replay.new
        return self._scopes.get(mp)

    def wants(self, tp: TopicIdPartition) -> bool:
        """Whether ``tp``'s events are applied (once its metadata partition is caught up)."""
        mp = self._metadata_partition(tp)
        return mp in self._tracked and _in(self._scope(mp), (tp.topic_id, tp.partition))

    def complete(self, tp: TopicIdPartition) -> bool:
        """Whether the store holds every event of ``tp`` on the topic so far: its events are
        applied and its metadata partition is caught up (what deciding that an object of
        ``tp`` is referenced by nothing needs)."""
        return self.wants(tp) and self.caught_up(self._metadata_partition(tp))

    def want(self, partitions: Iterable[TopicIdPartition | tuple[TopicIdPartition, int]]) -> None:
        """Read the metadata of these user partitions (tracking their metadata partitions),
        applying their events whatever the scope so far; cheap for partitions already wanted.
        Each is a partition, or a (partition, its metadata partition) pair (no hash to
        compute). Unscoped, it tracks their metadata partitions whole."""
        pairs = [
            item if isinstance(item, tuple) else (item, self._metadata_partition(item))
            for item in partitions
        ]
        if not self._scoped:
            self.track({mp for _tp, mp in pairs})
            return
        grown: dict[int, set[_Key]] = {}
        for tp, mp in pairs:
            key = (tp.topic_id, tp.partition)
            narrowed = self._narrowed.get(mp)
            if narrowed is not None and key not in narrowed:
                # a narrowing asked for before this want and not applied yet keeps it (it is
                # in the scope now, or about to be wanted into it below)
                self._narrowed[mp] = narrowed | {key}
            if mp in self._tracked and _in(self._scope(mp), key):
                continue
            if mp in self._scopes or mp in self._pending or mp in self._replays:
                scope = self._scope(mp)
                if scope is None or key in scope:
                    self.track((mp,))
                    continue
            grown.setdefault(mp, set()).add(key)
        for mp, keys in grown.items():
            scope = self._scope(mp) if (mp in self._scopes or mp in self._pending) else None
            base = frozenset() if scope is None and mp not in self._consumed else scope
            if base is None:  # read whole already
                self.track((mp,))
                continue
            self._pending[mp] = base | keys
            self._narrowed.pop(mp, None)
            self._caught_up.discard(mp)  # not before the newcomers are read
            self._tracked.add(mp)
            self._changed.set()
            self._notify()

    def want_everything(self) -> None:
        """Read every metadata partition whole (the coordinator)."""
        if self._num_partitions is None:
            raise RuntimeError("MetadataTailer needs num_partitions to scope its reading")
        if not self._scoped:
            self.track(range(self._num_partitions))
            return
        for mp in range(self._num_partitions):
            if self._scope(mp) is None:  # read whole, or about to be
                self.track((mp,))
                continue
            self._pending[mp] = None
            self._narrowed.pop(mp, None)
            self._caught_up.discard(mp)
            self._tracked.add(mp)
            self._changed.set()
        self._notify()

    def narrow(self, keep: Iterable[TopicIdPartition]) -> None:
        """Keep only these user partitions' metadata: every other partition is dropped from the
        store, and metadata partitions left with none are no longer read (scoped only)."""
        if not self._scoped:
            return
        wanted: dict[int, set[_Key]] = {}
        for tp in keep:
            wanted.setdefault(self._metadata_partition(tp), set()).add((tp.topic_id, tp.partition))
        known = set(self._scopes) | set(self._pending) | set(self._replays) | self._tracked
        for mp in known:
            kept = frozenset(wanted.get(mp, ()))
            pending = self._pending.get(mp, frozenset())
            if mp in self._pending:
                if pending is None:
                    del self._pending[mp]  # no longer to be read whole
                else:
                    self._pending[mp] = pending & kept  # newcomers still wanted stay
            scope = self._scopes.get(mp)
            if scope is not None and scope <= kept and mp not in self._replays:
                continue  # nothing to drop
            self._narrowed[mp] = kept
            self._unwanted += 1
            self._changed.set()

    def caught_up(self, metadata_partition: int) -> bool:
        """Whether ``metadata_partition`` is read up to the end offset seen when it was assigned."""
        return metadata_partition in self._caught_up

    @property
    def healthy(self) -> bool:
        """Whether the tailer runs and its last attempt to read Kafka did not fail."""
        return self._state is _State.STARTED and self._failure is None and self.last_error is None

    def lag(self) -> int:
        """Records of the tracked metadata partitions not yet applied to the store, summed: per
        partition, its end offset (the last stable offset of the consumer's last fetch, else the
        end offset seen at assignment) minus the next offset to apply. Partitions not assigned
        yet count 0. A lower bound while ``run`` is not polling (aiokafka stops prefetching
        while fetched records wait). Cheap: no request, safe to call from a metrics scrape."""
        consumer = self._consumer if self._state is _State.STARTED else None
        total = 0
        for partition in self._tracked:
            end = self._targets.get(partition)
            if end is None:
                continue
            if consumer is not None and partition in self._assigned:
                end = max(end, _fetched_end(consumer, TopicPartition(self.topic, partition)))
                end = max(end, self._checked_ends.get(partition, -1))
            consumed = self._consumed.get(partition)
            start = self._beginnings.get(partition, 0)
            following = start if consumed is None else max(consumed + 1, start)
            total += max(0, end - following)
        return total

    def consumed_offset(self, metadata_partition: int) -> int | None:
        """The last offset of ``metadata_partition`` applied to the store, or None."""
        return self._consumed.get(metadata_partition)

    async def wait_caught_up(self, metadata_partitions: Collection[int] | None = None) -> None:
        """Wait until the given (default: all tracked) partitions are caught up. Use
        ``asyncio.timeout`` to bound it."""
        while True:
            self._raise_if_failed()
            wanted = self._tracked if metadata_partitions is None else set(metadata_partitions)
            self._raise_if_untracked(wanted)
            if wanted <= self._caught_up:
                return
            await self._progress.wait()

    async def wait_for_offset(self, metadata_partition: int, offset: int) -> None:
        """Wait until ``offset`` of ``metadata_partition`` is applied to the store. Raises
        MetadataNotTrackedError at once if the partition is not tracked, and
        MetadataPublishError once the tailer has stopped. Use ``asyncio.timeout`` to bound it."""
        while True:
            self._raise_if_failed()
            self._raise_if_untracked((metadata_partition,))
            if self._consumed.get(metadata_partition, -1) >= offset:
                return
            await self._progress.wait()

    async def sync(self, metadata_partition: int) -> None:
        """Wait until every event published to ``metadata_partition`` before this call is
        applied to the store (the partition's end offset now). Raises MetadataTailError when
        Kafka does not answer, MetadataNotTrackedError when the partition is not tracked. Use
        ``asyncio.timeout`` to bound it."""
        self._raise_if_failed()
        self._raise_if_untracked((metadata_partition,))
        consumer = self._consumer
        if self._state is not _State.STARTED or consumer is None:
            raise MetadataPublishError(f"the metadata tailer is {self._state.value}")
        tp = TopicPartition(self.topic, metadata_partition)
        try:
            beginnings = await consumer.beginning_offsets([tp])
            ends = await consumer.end_offsets([tp])
        except KafkaError as exc:
            raise MetadataTailError(
                f"cannot read the end offset of {self.topic}-{metadata_partition}: {exc!r}"
            ) from exc
        end = int(ends[tp])
        if int(beginnings[tp]) >= end:
            return  # nothing left to read (empty, or every record expired)
        await self.wait_for_offset(metadata_partition, end - 1)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise MetadataPublishError(
                f"the metadata tailer of {self.topic} stopped: {self._failure}"
            ) from self._failure

    def _raise_if_untracked(self, partitions: Iterable[int]) -> None:
        missing = set(partitions) - self._tracked
        if missing:
            raise MetadataNotTrackedError(
                f"the metadata tailer does not read {self.topic} partitions {sorted(missing)}"
            )

    def _notify(self) -> None:
        """Wake every waiter; they re-check their condition."""
        self._progress.set()
        self._progress = asyncio.Event()

    def _fail(self, cause: BaseException) -> None:
        if self._failure is None:
            self._failure = cause
        self._notify()

    # --- the root task

    async def run(self, stopping: asyncio.Event) -> None:
        """Tail the tracked partitions until ``stopping`` is set. Kafka errors are logged,
        reported and retried with backoff (the partitions are re-assigned and resume at the
        stored offsets); any other error ends it. Waiters fail when it ends."""
        consumer = self._consumer
        if self._state is not _State.STARTED or consumer is None:
            raise RuntimeError(
                f"MetadataTailer.run needs a started tailer, it is {self._state.value}"
            )
        backoff = self._backoff_initial_s
        try:
            while not stopping.is_set():
                try:
                    self._start_progress_check(consumer)
                    await self._step(consumer, stopping)
                except (KafkaError, MetadataStoreError) as exc:
                    if isinstance(exc, MetadataStoreError) and not _store_may_recover(exc):
                        raise
                    self._changed.set()  # re-assign and seek to the stored offsets on retry
                    self._report_error(exc, backoff)
                    await wait_any(stopping, within=backoff)
                    backoff = min(backoff * 2, self._backoff_max_s)
                    continue
                backoff = self._backoff_initial_s
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            await self._stop_progress_check()
            await self._stop_probe()
        self._fail(MetadataPublishError("the metadata tailer stopped"))

    def _start_progress_check(self, consumer: AIOKafkaConsumer) -> None:
        """Start the progress check when it is due and none runs (see the module's doc)."""
        task = self._progress_task
        if task is not None:
            if not task.done():
                return
            self._progress_task = None
            task.result()  # what the check could not handle itself ends the reading too
        if time.monotonic() >= self._next_progress_check and self._assigned:
            self._progress_task = asyncio.create_task(
                self._check_progress(consumer), name="metadata progress check"
            )

    async def _stop_progress_check(self) -> None:
        task, self._progress_task = self._progress_task, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def _step(self, consumer: AIOKafkaConsumer, stopping: asyncio.Event) -> None:
        """One round: (re-)assign if needed, then one fetch applied to the store."""
        probe = self._probe_task
        if probe is not None and probe.done():
            self._probe_task = None
            probe.result()  # what the probe could not handle itself ends the reading too
        if self._changed.is_set():
            await self._assign(consumer)
        for mp, replay in list(self._replays.items()):
            if replay.done >= replay.until:  # its end was stored, not yet its new scope
                await self._finish_replay(mp, replay)
        if not self._assigned:
            await _first(stopping.wait(), self._changed.wait())
            return
        try:
            records = await self._fetch(consumer, stopping)
        except OffsetOutOfRangeError as exc:
            self._out_of_range(exc)
            # the next assignment asks for the partitions' bounds; should the position still be
            # refused (a leader still catching up), the loop must not hammer the brokers
            await wait_any(stopping, within=self._backoff_initial_s)
            return
        if records:
            await self._ingest(records)
        if self.last_error is not None and not self._unanswered:
            log.info("metadata_tail_recovered", topic=self.topic, after=self.last_error)
            self.last_error = None
            self._notify()

    async def _check_progress(self, consumer: AIOKafkaConsumer) -> None:
        """Ask the end offsets of the partitions read; note those behind whose position has
        not moved since the last check (see the module's doc). The next check is due
        ``progress_check_s`` after this one ends."""
        try:
            await self._check_progress_once(consumer)
        finally:
            self._next_progress_check = time.monotonic() + self._progress_check_s

    async def _check_progress_once(self, consumer: AIOKafkaConsumer) -> None:
        tps = {p: TopicPartition(self.topic, p) for p in sorted(self._assigned)}
        if not tps:
            return
        try:
            ends = await consumer.end_offsets(list(tps.values()))
        except KafkaError as exc:
            # one partition without a leader fails the whole request: reported, but the
            # reading of the others goes on (raised, it would back off every fetch)
            log.warning("metadata_progress_check_failed", topic=self.topic, error=repr(exc))
            if self._on_error is not None:
                self._on_error(exc)
            return
        stalled: set[int] = set()
        positions: dict[int, int] = {}
        for p, tp in tps.items():
            end = ends.get(tp)
            if end is None or tp not in consumer.assignment():
                continue
            self._checked_ends[p] = end
            try:  # a position being reset is not progress to judge: the next check will
                position = await asyncio.wait_for(consumer.position(tp), _POSITION_WAIT_S)
            except TimeoutError:
                continue
            if position >= end:
                continue
            if self._checked_positions.get(p) == position:
                stalled.add(p)
            positions[p] = position
        self._checked_positions = positions
        for p in [k for k in self._checked_ends if k not in tps]:
            del self._checked_ends[p]  # no longer read
        for p in sorted(stalled - self.stalled):
            log.warning(
                "metadata_partition_stalled",
                topic=self.topic,
                metadata_partition=p,
                position=positions[p],
                end_offset=self._checked_ends[p],
                detail="no record of it was read since the last check although it has more;"
                " its leader may be unreachable from here",
            )
        for p in sorted(self.stalled - stalled):
            log.info("metadata_partition_resumed", topic=self.topic, metadata_partition=p)
        self.stalled = frozenset(stalled)

    def _out_of_range(self, exc: OffsetOutOfRangeError) -> None:
        """A fetch position the partition no longer has: it was truncated or recreated under
        the reading (the position is past its end), or its records were deleted before they
        were read (before its beginning). The partitions are assigned again as new ones, whose
        check tells which: the first stops the tailer, the second is logged and skipped."""
        positions = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
        partitions = {tp.partition for tp in positions} or set(self._targets)
        log.warning(
            "metadata_fetch_out_of_range",
            topic=self.topic,
            positions={tp.partition: offset for tp, offset in positions.items()},
        )
        for p in partitions:
            self._targets.pop(p, None)
        self._changed.set()

    def _report_error(self, exc: KafkaError | MetadataStoreError, retry_in_s: float) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if self.last_error is None:
            log.warning(
                "metadata_tail_failed", topic=self.topic, error=error, retry_in_s=retry_in_s
            )
        else:
            log.info("metadata_tail_retry", topic=self.topic, error=error, retry_in_s=retry_in_s)
        self.last_error = error
        if self._on_error is not None and isinstance(exc, KafkaError):
            self._on_error(exc)

    async def _rescope(self) -> set[int]:
        """Apply the scope changes asked for since the last assignment; the metadata partitions
        to read again from their beginning. A store write that fails (a full disk, another
        process's lock) leaves the changes not applied yet to the next assignment."""
        narrowed, self._narrowed = self._narrowed, {}
        pending, self._pending = self._pending, {}
        if not (narrowed or pending):
            return set()
        try:
            return await self._apply_scopes(narrowed, pending)
        except BaseException:
            for mp, kept in narrowed.items():
                self._narrowed.setdefault(mp, kept)  # a narrowing asked since is the newer one
            for mp, scope in pending.items():
                newer = self._pending.get(mp, scope)
                self._pending[mp] = None if newer is None or scope is None else newer | scope
            raise

    async def _apply_scopes(
        self, narrowed: dict[int, frozenset[_Key]], pending: dict[int, Scope]
    ) -> set[int]:
        """:meth:`_rescope`'s work; each entry is removed from ``narrowed`` or ``pending`` once
        the store has it."""
        restart: set[int] = set()
        stored = await asyncio.to_thread(self._store.partitions)
        on_mp: dict[int, list[TopicIdPartition]] = {}
        for tp in stored:
            on_mp.setdefault(self._metadata_partition(tp), []).append(tp)
        for mp, kept in list(narrowed.items()):
            if mp in self._replays:  # shrink once the re-read is done
                self._narrowed[mp] = kept
                del narrowed[mp]
                continue
            scope = self._scopes.get(mp)
            keep = kept if scope is None else scope & kept
            drop = [tp for tp in on_mp.get(mp, ()) if (tp.topic_id, tp.partition) not in keep]
            await asyncio.to_thread(self._store.set_scope, mp, keep, drop=drop)
            del narrowed[mp]
            self._scopes[mp] = keep
            if drop:
                log.info(
                    "metadata_scope_narrowed",
                    topic=self.topic,
                    metadata_partition=mp,
                    dropped=len(drop),
                    kept=len(keep),
                )
            if not keep:
                self.untrack((mp,))
        for mp, new in list(pending.items()):
            # caught up again once the assignment has read its end offset anew (want() made
            # it not caught up: a newcomer's history may be on it)
            self._targets.pop(mp, None)
            self._caught_up.discard(mp)
            consumed = self._consumed.get(mp)
            old = self._scopes.get(mp)
            if consumed is None:  # never read: read it from its beginning with this scope
                await asyncio.to_thread(self._store.set_scope, mp, new)
                del pending[mp]
                self._scopes[mp] = new
                continue
            replay = self._replays.get(mp)
            if old is None:
                del pending[mp]
                continue  # read whole already
            if replay is not None:  # a re-read is under way: widen it
                old = replay.old
            elif new is not None and new <= old:
                del pending[mp]
                continue  # no newcomer
            if mp not in self._tracked:
                del pending[mp]
                continue  # narrowed away meanwhile
            incoming = [
                tp
                for tp in on_mp.get(mp, ())
                if _in(new, (tp.topic_id, tp.partition)) and (tp.topic_id, tp.partition) not in old
            ]
            # the newcomers' partial state, if any, is rebuilt from the beginning
            await asyncio.to_thread(self._store.set_scope, mp, old, drop=incoming)
            del pending[mp]
            self._scopes[mp] = old
            self._replays[mp] = _Replay(until=consumed, old=old, new=new)
            restart.add(mp)
            log.info(
                "metadata_partition_reread",
                topic=self.topic,
                metadata_partition=mp,
                until_offset=consumed,
                partitions="all" if new is None else len(new),
            )
        return restart

    async def _assign(self, consumer: AIOKafkaConsumer) -> None:
        self._changed.clear()
        restart = await self._rescope() | self._restart_held
        tracked = frozenset(self._tracked)
        skipped = self._unanswered & tracked  # the probe asks those
        # asked before the assignment: one whose bounds Kafka cannot give is left out of it
        new = [p for p in sorted(tracked - skipped) if p not in self._targets]
        probed = {p: self._probed.pop(p) for p in new if p in self._probed}
        self._probed.clear()  # of partitions no longer tracked
        beginnings, ends = await self._bounds(
            consumer, [TopicPartition(self.topic, p) for p in new if p not in probed]
        )
        for p, (beginning, end) in probed.items():
            beginnings[TopicPartition(self.topic, p)] = beginning
            ends[TopicPartition(self.topic, p)] = end
        failed = {p for p in new if TopicPartition(self.topic, p) not in ends}
        self._unanswered = (self._unanswered & tracked) | failed
        if self._unanswered and self._probe_task is None:
            self._probe_task = asyncio.create_task(
                self._probe_bounds(consumer), name="metadata bounds probe"
            )
        readable = tracked - skipped - failed
        self._restart_held = (restart & tracked) - readable  # read again once assigned
        new = [p for p in new if p in readable]
        partitions = {p: TopicPartition(self.topic, p) for p in sorted(readable)}
        consumer.assign(list(partitions.values()))
        # every partition gets a position (or a reset to its beginning) before the next await:
        # the consumer resets none itself (auto_offset_reset="none")
        seeked: dict[int, int] = {}  # metadata partition -> offset the reading resumes at
        from_beginning: list[TopicPartition] = []
        for p, tp in partitions.items():
            consumed = self._consumed.get(p)
            replay = self._replays.get(p)
            if p in restart and replay is not None:
                from_beginning.append(tp)
            elif replay is not None:
                seeked[p] = replay.done + 1
            elif consumed is None:
                from_beginning.append(tp)
            else:
                seeked[p] = consumed + 1
            if p in seeked:
                consumer.seek(tp, seeked[p])
        if from_beginning:
            await consumer.seek_to_beginning(*from_beginning)
        if new:
            for p in new:
                tp = partitions[p]
                position = self._consumed.get(p, -1) + 1
                if position > ends[tp]:
                    # The topic was recreated or truncated (an unclean leader election): new
                    # events would reuse offsets the store counts as applied and be skipped.
                    raise MetadataStoreError(
                        f"the store has applied {self.topic}-{p} up to offset {position - 1},"
                        f" but the partition ends at {ends[tp]}: the metadata topic was"
                        " recreated or truncated; remove the store to rebuild it from the topic"
                    )
                resume = seeked.get(p)
                if resume is None and tp in from_beginning and beginnings[tp] > 0:
                    # read from its beginning, whose earlier records are gone: this store
                    # never held their events (the scrub must not trust it)
                    log.warning(
                        "metadata_history_incomplete",
                        topic=self.topic,
                        metadata_partition=p,
                        begins_at=beginnings[tp],
                        detail="the metadata topic deleted records before this store first"
                        " read the partition; the orphan scrub is refused on this store",
                    )
                    await asyncio.to_thread(self._store.record_history_gap, p, beginnings[tp])
                if resume is not None and resume < beginnings[tp]:
                    # deleted before they were read (the topic's retention, DeleteRecords):
                    # what they said is missing from the store; the reading goes on after them
                    log.error(
                        "metadata_records_expired_unread",
                        topic=self.topic,
                        metadata_partition=p,
                        from_offset=resume,
                        to_offset=beginnings[tp] - 1,
                        detail="the metadata topic deleted these records before the sidecar"
                        " read them; its store may lack their events (rebuild it by removing"
                        " it if the topic keeps every event)",
                    )
                    self.expired_records += beginnings[tp] - resume
                    if self._on_expired is not None:
                        self._on_expired(beginnings[tp] - resume)
                    await asyncio.to_thread(self._store.record_history_gap, p, beginnings[tp])
                    consumer.seek(tp, beginnings[tp])
                self._targets[p] = ends[tp]
                self._beginnings[p] = beginnings[tp]
                replay = self._replays.get(p)
                if replay is not None and beginnings[tp] > replay.until:
                    await self._finish_replay(p, replay)  # nothing left to read again
                    replay = None
                if replay is None and (beginnings[tp] >= ends[tp] or position >= ends[tp]):
                    self._caught_up.add(p)
                log.debug(
                    "metadata_partition_assigned",
                    topic=self.topic,
                    metadata_partition=p,
                    resume_offset=position if p in self._consumed else beginnings[tp],
                    end_offset=ends[tp],
                    caught_up=p in self._caught_up,
                )
        if readable != self._assigned:
            # one line per change at INFO; the per-partition lines above are DEBUG
            log.info(
                "metadata_partitions_assigned",
                topic=self.topic,
                partitions=len(readable),
                caught_up=len(readable & self._caught_up),
                tracked=sorted(tracked),
            )
        self._assigned = readable
        self._notify()

    async def _bounds(
        self, consumer: AIOKafkaConsumer, tps: list[TopicPartition]
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """The beginning and end offsets of ``tps``, without those Kafka cannot give. One
        partition without a reachable leader fails a whole ListOffsets (after the request
        timeout): the partitions are then asked one by one, so that the others are read
        meanwhile; those that fail are logged and reported (the tailer is not ``healthy``
        until they answer), and asked again by :meth:`_probe_bounds`."""
        if not tps:
            return {}, {}
        try:
            return await _ask_bounds(consumer, tps)
        except KafkaError as exc:
            if len(tps) == 1:
                answered: dict[TopicPartition, tuple[int, int]] = {}
                failures = {tps[0]: exc}
            else:
                answered, failures = await _ask_each(consumer, tps)
        beginnings = {tp: bounds[0] for tp, bounds in answered.items()}
        ends = {tp: bounds[1] for tp, bounds in answered.items()}
        failed = {tp.partition: error for tp, error in failures.items()}
        if failed:
            log.warning(
                "metadata_partition_offsets_failed",
                topic=self.topic,
                metadata_partitions=sorted(failed),
                error=repr(next(iter(failed.values()))),
                detail="their beginning and end offsets could not be read (no reachable"
                " leader?): they are not read until they can be; the others are",
                retry_in_s=self._bounds_backoff,
            )
            error = next(iter(failed.values()))
            self.last_error = f"{type(error).__name__}: {error}"
            if self._on_error is not None:
                self._on_error(error)
        return beginnings, ends

    async def _probe_bounds(self, consumer: AIOKafkaConsumer) -> None:
        """Ask the bounds of the partitions left out of the assignment (:meth:`_bounds`) one
        by one, after a backoff that doubles while none answers, beside the reading (each
        question to a partition without a leader waits out the request timeout); those that
        answer are assigned again by the next assignment. Ends once none is left."""
        self._bounds_backoff = self._backoff_initial_s
        while self._unanswered:
            await asyncio.sleep(self._bounds_backoff)
            waiting = [TopicPartition(self.topic, p) for p in sorted(self._unanswered)]
            bounds, failures = await _ask_each(consumer, waiting)
            answered = {tp.partition for tp in bounds}
            errors = list(failures.values())
            self._probed.update({tp.partition: b for tp, b in bounds.items()})
            if errors:
                log.debug(
                    "metadata_partition_offsets_failed_again",
                    topic=self.topic,
                    metadata_partitions=sorted(self._unanswered - answered),
                    error=repr(errors[0]),
                )
                self.last_error = f"{type(errors[0]).__name__}: {errors[0]}"
                if self._on_error is not None:
                    self._on_error(errors[0])
            if answered:
                log.info(
                    "metadata_partition_offsets_answered",
                    topic=self.topic,
                    metadata_partitions=sorted(answered),
                )
                self._unanswered -= answered
                self._bounds_backoff = self._backoff_initial_s
                self._changed.set()  # the next assignment reads them
            else:
                self._bounds_backoff = min(self._bounds_backoff * 2, self._backoff_max_s)
        if self._probe_task is asyncio.current_task():
            self._probe_task = None  # ended: another is started when one is left out again

    async def _stop_probe(self) -> None:
        task, self._probe_task = self._probe_task, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def _fetch(
        self, consumer: AIOKafkaConsumer, stopping: asyncio.Event
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        """One ``getmany``, ended early by ``stopping`` or a tracking change. Records a finished
        fetch returned are never dropped (the consumer has already advanced past them)."""
        fetch = asyncio.ensure_future(
            consumer.getmany(timeout_ms=_POLL_TIMEOUT_MS, max_records=self._max_records)
        )
        try:
            await _first(fetch, stopping.wait(), self._changed.wait())
        finally:
            if not fetch.done():
                fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
        if fetch.cancelled():
            return {}
        records: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = fetch.result()
        return records

    async def _ingest(
        self, records: Mapping[TopicPartition, Sequence[ConsumerRecord[bytes, bytes]]]
    ) -> None:
        batch: list[tuple[int, int, bytes | None]] = []
        replayed: dict[int, int] = {}  # metadata partition re-read → last offset in this fetch
        for tp, partition_records in records.items():
            self.records_fetched += len(partition_records)
            replay = self._replays.get(tp.partition)
            done = self._consumed.get(tp.partition, -1) if replay is None else replay.done
            batch += [
                (tp.partition, r.offset, r.value) for r in partition_records if r.offset > done
            ]
            if replay is not None and partition_records:
                replayed[tp.partition] = partition_records[-1].offset
        if not batch:
            return
        ingested = await asyncio.to_thread(self._decode_and_apply, batch)
        for partition, offset, error in ingested.undecodable:
            self.undecodable_records += 1
            log.error(
                "metadata_record_undecodable",
                topic=self.topic,
                metadata_partition=partition,
                offset=offset,
                error=str(error),
            )
            if self._on_undecodable is not None:
                self._on_undecodable(partition, offset, error)
        for rejection in ingested.result.rejected:
            self.rejected_events += 1
            partition, offset = ingested.origins[rejection.index]
            log.error(
                "metadata_event_dropped",
                topic=self.topic,
                metadata_partition=partition,
                offset=offset,
                reason=rejection.reason.value,
                detail=rejection.detail,
            )
            if self._on_rejected is not None:
                self._on_rejected(rejection.reason.value)
        self._consumed.update(ingested.consumed)
        for partition, last in replayed.items():
            replay = self._replays.get(partition)
            if replay is not None:
                replay.done = max(replay.done, last)
                if replay.done >= replay.until:
                    await self._finish_replay(partition, replay)
        for partition, last in ingested.consumed.items():
            if partition in self._replays:
                continue  # caught up once the re-read is done
            target = self._targets.get(partition)
            if partition not in self._caught_up and target is not None and last + 1 >= target:
                self._caught_up.add(partition)
                log.debug(
                    "metadata_partition_caught_up",
                    topic=self.topic,
                    metadata_partition=partition,
                    offset=last,
                )
                if self._tracked <= self._caught_up:
                    log.info("metadata_caught_up", topic=self.topic, partitions=len(self._tracked))
        self._notify()

    async def _finish_replay(self, mp: int, replay: _Replay) -> None:
        """The re-read passed where the reading was: the scope is the new one from now on."""
        await asyncio.to_thread(self._store.set_scope, mp, replay.new)
        self._scopes[mp] = replay.new
        del self._replays[mp]
        if mp in self._narrowed:
            self._changed.set()  # a narrowing waited for the re-read
        target = self._targets.get(mp)
        consumed = self._consumed.get(mp, -1)
        if target is not None and consumed + 1 >= target:
            self._caught_up.add(mp)
        log.info("metadata_partition_reread_done", topic=self.topic, metadata_partition=mp)
        self._notify()

    def _decode_and_apply(self, batch: Sequence[tuple[int, int, bytes | None]]) -> _Ingested:
        """Decode a fetch and apply it in one store transaction (runs in a worker thread)."""
        events: list[RemoteLogMetadata] = []
        origins: list[tuple[int, int]] = []
        undecodable: list[tuple[int, int, MetadataFormatError]] = []
        consumed: dict[int, int] = {}
        applied = self._consumed  # read only here; the loop updates it after this returns
        filtered = 0
        for partition, offset, value in batch:
            if offset > applied.get(partition, -1):
                consumed[partition] = offset
            if value is None:
                undecodable.append((partition, offset, _NULL_VALUE))
                continue
            try:
                event = decode(value)
            except MetadataFormatError as exc:
                undecodable.append((partition, offset, exc))
                continue
            if not self._wanted(partition, offset, event):
                filtered += 1
                continue
            events.append(event)
            origins.append((partition, offset))
        result = self._store.apply(events, consumed=consumed)
        self.filtered_records += filtered
        return _Ingested(result, origins, undecodable, consumed)

    def _wanted(self, mp: int, offset: int, event: RemoteLogMetadata) -> bool:
        """Whether ``event`` (read at ``offset`` of ``mp``) belongs to the scope read."""
        if isinstance(event, SegmentMetadataSnapshot):
            return True  # never applied; the store counts it
        tp = event.topic_id_partition
        key = (tp.topic_id, tp.partition)
        replay = self._replays.get(mp)
        if replay is not None:
            return replay.wanted(offset, key)
        return _in(self._scopes.get(mp), key)


#: how long the progress check waits for a partition's position (one being reset is skipped)
_POSITION_WAIT_S = 1.0

#: SQLite result codes of a write the disk refused (full, or an I/O error) or another process's
#: lock held past the busy timeout: the transaction was rolled back, and the same records apply
#: once the disk takes writes again or the lock is released
_RECOVERABLE_SQLITE = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_BUSY})


def _store_may_recover(exc: MetadataStoreError) -> bool:
    """Whether the store failed because its disk refused a write (not because it disagrees
    with the topic): the tailer reports it, backs off and applies the same records again."""
    cause = exc.__cause__
    code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(cause, sqlite3.OperationalError) and isinstance(code, int):
        return code & 0xFF in _RECOVERABLE_SQLITE
    return isinstance(cause, OSError)


async def _ask_bounds(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition]
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """The beginning and end offsets of ``tps`` (two ListOffsets)."""
    return await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)


async def _ask_each(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition]
) -> tuple[dict[TopicPartition, tuple[int, int]], dict[TopicPartition, KafkaError]]:
    """The (beginning, end) offsets of each of ``tps``, asked one by one at once, and the
    Kafka error of each that could not answer; any other error is raised."""
    answers = await asyncio.gather(
        *(_ask_bounds(consumer, [tp]) for tp in tps), return_exceptions=True
    )
    bounds: dict[TopicPartition, tuple[int, int]] = {}
    failures: dict[TopicPartition, KafkaError] = {}
    for tp, answer in zip(tps, answers, strict=True):
        if isinstance(answer, KafkaError):
            failures[tp] = answer
        elif isinstance(answer, BaseException):
            raise answer
        else:
            bounds[tp] = (answer[0][tp], answer[1][tp])
    return bounds, failures


def _fetched_end(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
    """The end offset of ``tp`` the consumer's last fetch reported (LSO, else the high
    watermark), or -1 when unknown (nothing fetched yet, or no longer assigned)."""
    try:
        lso = consumer.last_stable_offset(tp)
        end = lso if lso is not None and lso >= 0 else consumer.highwater(tp)
    except (AssertionError, KeyError):  # unassigned meanwhile (aiokafka asserts)
        return -1
    return -1 if end is None else int(end)


async def _first(*awaitables: Any) -> None:
    """Wait until the first of ``awaitables`` completes; cancel the others' tasks. (A task
    passed in is not cancelled: its owner decides.)"""
    tasks = [asyncio.ensure_future(aw) for aw in awaitables]
    owned = [task for task, aw in zip(tasks, awaitables, strict=True) if task is not aw]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in owned:
            task.cancel()
        await asyncio.gather(*owned, return_exceptions=True)
