"""Composition root: build the components from the configuration, run the root tasks under one
TaskGroup, and shut down in phases on SIGTERM.

Root tasks (each wrapped by :func:`sidecar._aio.guard`; one exiting early stops the daemon):

* ``log-dir detector``   watches the broker's log dirs and keeps a view per partition
* ``cluster watcher``    leadership, LSOs and topic configs from Kafka
* ``metadata tailer``    tails the remote log metadata partitions into the local store
* ``tiering engine``     plans and uploads segments, one worker per partition
* ``retention``          remote retention, deleted topics/partitions, orphan scrub
* ``readiness probe``    turns component health into /readyz (each failing check with its reason);
                         when Kafka or S3 comes back it ends the upload workers' backoff
* ``health server``      serves /metrics, /healthz and /readyz
* ``read server``        serves tiered reads on the Unix socket (and optional loopback TCP)
* ``loop watchdog``      measures how long the event loop is held (``event_loop_lag_seconds``)

Outages after startup never end the daemon: the cluster watcher, the metadata tailer and the
publisher retry Kafka with backoff, uploads retry S3 with backoff, and /readyz, the
``readiness_check`` and ``dependency_errors`` metrics and a log line say what is down. Only
startup fails fast (the first connection to Kafka, the metadata topic).

Shutdown is phased: SIGTERM sets ``stopping``; the engine stops starting uploads and drains the
ones in flight (they still need the publisher and the tailer to read their events back); only
then do the other root tasks stop, and the clients close in reverse order of opening.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from sidecar import __version__
from sidecar._aio import capture_signals, failures, freeze_startup_heap, guard, wait_any
from sidecar.broker_config import PLUGIN_CLASS
from sidecar.config import SidecarConfig, kafka_client_options, secret_values
from sidecar.errors import ConfigError, SidecarError, StorageError
from sidecar.kafka.checkpoints import MetaProperties
from sidecar.kafka.logdir import PartitionScan, read_broker_identity, scan_partition_dir
from sidecar.metadata.events import TopicIdPartition
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.publisher import MetadataPublisher
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.metadata.tailer import MetadataTailer
from sidecar.observability.health import HealthServer, Readiness
from sidecar.observability.logging import bind_context, configure_logging, get_logger
from sidecar.observability.loopwatch import LoopWatchdog
from sidecar.observability.metrics import Metrics
from sidecar.readserver import ReadServer
from sidecar.retention._kafka import RetentionKafka
from sidecar.retention.election import CoordinatorElection
from sidecar.retention.manager import RetentionManager
from sidecar.retention.scrub import OrphanScrubber
from sidecar.status import partition_status
from sidecar.storage import ObjectStore, open_store
from sidecar.storage.keys import KeyLayout
from sidecar.storage.ownership import PrefixOwner, PrefixOwnershipError, claim_prefix
from sidecar.storage.throttle import TokenBucket
from sidecar.tiering.brokercopy import BrokerCopier
from sidecar.tiering.cluster import ClusterUnavailableError, ClusterWatcher, TopicSelector
from sidecar.tiering.detector import LogDirDetector
from sidecar.tiering.eager import EagerStager, StagingLedger
from sidecar.tiering.quarantine import Quarantine
from sidecar.tiering.selection import SelectionMonitor, broker_plugin_gauge, count_led
from sidecar.tiering.uploader import SegmentUploader
from sidecar.tiering.workers import EngineSettings, MetadataSync, TieringEngine

__all__ = ["Daemon", "run_daemon", "upload_throttle"]

log = get_logger(__name__)

#: the longest wait between two tries of a startup step (the broker's identity, Kafka)
_STARTUP_RETRY_MAX_S = 10.0


class _KafkaUnreachableError(ClusterUnavailableError):
    """No bootstrap server accepted a connection (refused, timed out, not resolvable)."""


async def _connect_once(servers: Sequence[str], options: dict[str, Any], timeout_ms: int) -> None:
    """Open (and authenticate) one connection to the first bootstrap server that takes it,
    then close it. :class:`_KafkaUnreachableError` when none could be reached; a server
    that answered but refused us is a :class:`ClusterUnavailableError` that says why.
    aiokafka's own bootstrap reports both alike ("Unable to bootstrap"), hence this probe."""
    from aiokafka.conn import create_conn
    from aiokafka.errors import KafkaError

    problems: list[str] = []
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            conn = await create_conn(
                host.strip("[]"), int(port), request_timeout_ms=timeout_ms, **options
            )
        except ssl.SSLError as exc:  # something listens there and the handshake failed
            raise ClusterUnavailableError(f"{server}: TLS handshake failed: {exc}") from exc
        except (OSError, TimeoutError) as exc:
            problems.append(f"{server}: {exc or type(exc).__name__}")
            continue
        except KafkaError as exc:  # e.g. SaslAuthenticationFailed
            raise ClusterUnavailableError(f"{server} refused the connection: {exc!r}") from exc
        conn.close()
        return
    raise _KafkaUnreachableError("no bootstrap server could be reached: " + "; ".join(problems))


def upload_throttle(config: SidecarConfig, metrics: Metrics) -> TokenBucket | None:
    """The daemon's one upload bandwidth cap (``tiering.max_upload_bytes_per_second``), for the
    object store that every upload goes through; None when uploads are not capped.

    The bucket holds one second of bytes or one part (``s3.part_size_bytes``), whichever is
    smaller: what an idle daemon may send at once before the cap applies. A part larger than
    that waits for a full bucket and leaves it in debt, so the average still holds.
    """
    rate = config.tiering.max_upload_bytes_per_second
    metrics.upload_throttle_rate.set(rate)
    if rate == 0:
        return None
    bucket = TokenBucket(
        rate,
        burst=min(rate, config.s3.part_size_bytes),
        on_wait=metrics.upload_throttle_wait.inc,
    )
    log.info(
        "upload_bandwidth_capped",
        bytes_per_second=rate,
        burst_bytes=int(bucket.burst),
        part_size_bytes=config.s3.part_size_bytes,
    )
    return bucket


def _sample_tailer(metrics: Metrics, tailer: MetadataTailer) -> None:
    """The tailer's gauges, computed at each scrape from what it already knows (no request),
    on the event loop that changes it."""
    metrics.sample_on_loop(metrics.metadata_store_lag, tailer.lag)
    metrics.sample_on_loop(metrics.metadata_partitions_tracked, lambda: len(tailer.tracked))
    metrics.sample_on_loop(metrics.metadata_partitions_stalled, lambda: len(tailer.stalled))


class _LocalTotals:
    """Partitions, rolled and active segments and ``.log`` bytes over the detector's views,
    moved by each view that appears or goes; ``segments_visited`` counts the work.
    ``per_topic`` counts the partitions of each topic, and ``topics_changed`` how often a
    partition came or went (the selection count is redone then, not on every probe)."""

    def __init__(self) -> None:
        self.per_topic: collections.Counter[str] = collections.Counter()
        self.topics_changed = 0
        self.partitions = 0
        self.rolled = 0
        self.active = 0
        self.bytes = 0
        self.segments_visited = 0

    def _move(self, view: PartitionScan | None, sign: int) -> None:
        if view is None:
            return
        segments = view.segments
        self.segments_visited += len(segments)
        self.per_topic[view.topic] += sign
        if self.per_topic[view.topic] <= 0:
            del self.per_topic[view.topic]
        self.partitions += sign
        if segments:
            self.rolled += sign * (len(segments) - 1)
            self.active += sign
        self.bytes += sign * sum(seg.size for seg in segments)

    def add(self, view: PartitionScan | None) -> None:
        self._move(view, 1)

    def remove(self, view: PartitionScan | None) -> None:
        self._move(view, -1)


class MetadataReadiness:
    """The ``metadata`` check of /readyz: the store has caught up with the metadata of the
    broker's partitions once, at start.

    Until the tiering engine has made a pass over the log dirs' first scan on a fresh cluster
    view, the tailer tracks nothing yet (the pass is what asks for the partitions' metadata, and
    on a stale view no topic is selected), so the check waits for it rather than pass on an
    empty set. Once passed, metadata partitions read later (a topic
    created, a partition moved here, the cluster duties taken up, a read of another broker's
    partition) no longer take the whole pod out of service while their history is read: the
    engine and the read path each wait for what they need, and ``metadata_store_lag`` shows
    it. A tailer that fails fails the check at any time."""

    def __init__(self) -> None:
        self._passed = False
        #: the engine's passes when the log dirs' first scan was seen done
        self._passes_at_scan: int | None = None

    def check(
        self,
        *,
        healthy: bool,
        error: str | None,
        lagging: Sequence[int],
        scanned: bool,
        passes: int,
    ) -> tuple[bool, str | None]:
        """(ok, reason) from the tailer's state, whether the log dirs were scanned once and
        the engine's passes so far."""
        if not healthy:
            return False, error or "the metadata tailer is failing"
        if self._passed:
            return True, None
        if not scanned:
            return False, "waiting for the first scan of the log dirs"
        if self._passes_at_scan is None:
            self._passes_at_scan = passes
        if passes <= self._passes_at_scan:
            return False, "waiting for the tiering engine's first pass on a fresh cluster view"
        if lagging:
            return False, f"catching up on metadata partitions {list(lagging)}"
        self._passed = True
        return True, None


class Daemon:
    """The running sidecar: its components and root tasks."""

    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.metrics.build_info.info({"version": __version__})
        self.readiness = Readiness(self.metrics)
        for check in ("log_dirs_scanned", "kafka", "metadata", "s3", "prefix_owner"):
            self.readiness.register(check)
        self.stopping = asyncio.Event()
        self._infra_stop = asyncio.Event()  # set once the engine has drained
        self._s3_down = False  # the last S3 probe failed (logged once per outage)
        self._prefix_owner: PrefixOwner | None = None  # set once the bucket prefix is ours
        self.engine: TieringEngine | None = None
        self.stager: EagerStager | None = None  # broker-driven segments staged on roll
        self._gauges = _LocalTotals()  # the local-segment gauges, kept per change
        self.retention: RetentionManager | None = None
        self.detector: LogDirDetector[PartitionScan] = LogDirDetector(
            log_dirs=config.broker.log_dirs,
            scan_partition=scan_partition_dir,
            on_change=self._on_partition_change,
            rescan_interval_s=config.tiering.rescan_interval_s,
            metrics=self.metrics,
        )
        self.watchdog = LoopWatchdog(histogram=self.metrics.event_loop_lag)
        self.health = HealthServer(
            host=config.metrics.host,
            port=config.metrics.port,
            metrics=self.metrics,
            readiness=self.readiness,
        )

    def _on_partition_change(
        self, directory: Path, old: PartitionScan | None, new: PartitionScan | None
    ) -> None:
        """Log what changed in one partition directory and refresh the gauges."""
        if new is None:
            if old is not None:
                log.info("partition_removed", topic=old.topic, partition=old.partition)
        else:
            with bind_context(topic=new.topic, partition=new.partition):
                if old is None:
                    active = new.active_segment
                    # the first scan finds every partition: one line each only at DEBUG, the
                    # log_dirs_scanned summary at INFO; a partition created later is news
                    emit = log.info if self.detector.scanned.is_set() else log.debug
                    emit(
                        "partition_discovered",
                        directory=str(directory),
                        topic_id=new.topic_id,
                        segments=len(new.segments),
                        rolled=len(new.segments) - (1 if active else 0),
                        ready=len(new.ready_segments),
                        active_base_offset=active.base_offset if active else None,
                        log_bytes=sum(seg.size for seg in new.segments),
                    )
                    known_problems: set[str] = set()
                else:
                    old_ready = {seg.base_offset for seg in old.ready_segments}
                    for seg in new.ready_segments:
                        if seg.base_offset not in old_ready:
                            log.info(
                                "segment_ready",
                                base_offset=seg.base_offset,
                                end_offset=seg.end_offset,
                                size=seg.size,
                            )
                    new_bases = {seg.base_offset for seg in new.segments}
                    for seg in old.segments:
                        if seg.base_offset not in new_bases:
                            log.info("segment_removed", base_offset=seg.base_offset)
                    known_problems = {str(p) for p in old.all_problems()}
                for problem in new.all_problems():
                    if str(problem) not in known_problems:
                        self.metrics.format_errors.labels(type(problem).__name__).inc()
                        log.warning(
                            "partition_format_problem",
                            error_type=type(problem).__name__,
                            error=str(problem),
                        )
        self._refresh_gauges(old, new)
        if self.retention is not None:  # lost-segment check
            self.retention.note_change(old, new)
        self._poke_uploaders()

    def _poke_uploaders(self) -> None:
        """Something changed (a roll, a refresh): the engine and the stager look again now."""
        if self.engine is not None:
            self.engine.poke()
        if self.stager is not None:
            self.stager.poke()

    def _refresh_gauges(self, old: PartitionScan | None, new: PartitionScan | None) -> None:
        """Move the local-segment gauges by one partition's change: the work is that
        partition's segments, not every view's (a first scan reports every partition)."""
        totals = self._gauges
        totals.remove(old)
        totals.add(new)
        if old is None or new is None:
            totals.topics_changed += 1  # a partition came or went
        self.metrics.partitions_watched.set(totals.partitions)
        self.metrics.segments_local.labels("rolled").set(totals.rolled)
        self.metrics.segments_local.labels("active").set(totals.active)
        self.metrics.segments_local_bytes.set(totals.bytes)

    async def _mark_ready_after_first_scan(self) -> None:
        """Mark the log dirs scanned once the detector's first scan is done. A stop before
        that (SIGTERM during startup) ends the detector without a scan: this ends with it,
        or the task group would wait for it for ever."""
        stopped = self._infra_stop
        while not self.detector.scanned.is_set():
            if stopped.is_set():
                return
            await wait_any(self.detector.scanned, stopped, within=60.0)
        self.readiness.set("log_dirs_scanned", True)
        self._freeze_before_uploads()
        self._poke_uploaders()
        views = self.detector.views.values()
        log.info(
            "log_dirs_scanned",
            partitions=len(views),
            segments=sum(len(v.segments) for v in views),
            ready=sum(len(v.ready_segments) for v in views),
        )

    def _broker_id(self, identity: MetaProperties | None) -> int:
        broker_id = self.config.broker.broker_id
        if broker_id is None and identity is not None:
            broker_id = identity.node_id
        missing = [str(d) for d in self.config.broker.log_dirs if not d.is_dir()]
        if broker_id is None and missing:
            raise ConfigError(
                f"broker.log_dirs: {', '.join(missing)} does not exist or is not a directory;"
                " give the broker's log.dirs with --log-dir or broker.log_dirs"
            )
        if broker_id is None:
            raise ConfigError(
                "broker.broker_id is not set and no meta.properties with node.id/broker.id was"
                f" found in {[str(d) for d in self.config.broker.log_dirs]}"
            )
        for log_dir in missing:
            # the daemon starts (another log dir may be fine, a mount may come late), but a
            # dir it cannot see is tiered by nobody: say so, once, where the operator looks
            log.error(
                "broker_log_dir_missing",
                log_dir=log_dir,
                detail="not a directory here: nothing in it is tiered; check broker.log_dirs"
                " and the volume mount (the selected_partitions gauge counts what is seen)",
            )
        return broker_id

    async def run(self) -> None:
        """Run every root task until SIGTERM/SIGINT, then stop them in order. /healthz is
        served from the start, also while the sidecar waits for its broker."""
        with capture_signals(self.stopping):
            async with asyncio.TaskGroup() as tg:
                infra = self._infra_stop
                tg.create_task(
                    guard(self.health.run(infra), name="health server", stopping=infra),
                    name="health server",
                )
                try:
                    await self._start()
                finally:
                    infra.set()

    async def _start(self) -> None:
        config = self.config
        deadline = time.monotonic() + config.broker.startup_wait_s
        started = await self._await_broker(deadline)
        if started is None:
            return  # stopped while waiting
        identity, broker_id = started
        with bind_context(broker_id=broker_id):
            log.info(
                "sidecar_starting",
                version=__version__,
                log_dirs=[str(d) for d in config.broker.log_dirs],
                cluster_id=identity.cluster_id if identity else None,
            )
            async with AsyncExitStack() as resources:
                await self._run_with(resources, broker_id, deadline)
            log.info("sidecar_stopped")

    async def _waiting(self, what: str, error: SidecarError, deadline: float, delay: float) -> bool:
        """Wait out one retry of a startup step that ``error`` failed; False when the step
        should give up (``broker.startup_wait_s`` spent: the error then ends the daemon) or
        the daemon is stopping (True means: try again)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise error
        self.readiness.set("startup", False, reason=f"waiting for {what}: {error}")
        log.warning(
            "waiting_for_broker",
            waiting_for=what,
            error=str(error),
            gives_up_in_s=round(left),
            detail="the broker may still be starting; broker.startup_wait_s bounds the wait",
        )
        await wait_any(self.stopping, within=min(delay, left))
        return not self.stopping.is_set()

    async def _await_broker(self, deadline: float) -> tuple[MetaProperties | None, int] | None:
        """The broker's identity and id, waiting while its log dirs have no meta.properties
        yet (a broker formatting its storage beside a sidecar that started first)."""
        delay = 1.0
        while True:
            identity = await asyncio.to_thread(read_broker_identity, self.config.broker.log_dirs)
            try:
                return identity, self._broker_id(identity)
            except ConfigError as exc:
                if not await self._waiting("the broker's meta.properties", exc, deadline, delay):
                    return None
            delay = min(delay * 2, _STARTUP_RETRY_MAX_S)

    async def _claim_metadata_topic_id(
        self, store: RemoteSegmentStore, kafka: RetentionKafka, topic: str
    ) -> None:
        """Check the store against the metadata topic's id (see ``claim_topic_id``): a store
        read from a topic since deleted and re-created is refused, not read on at offsets that
        now belong to other records. The id unknown here (an answer that failed, a topic we may
        not describe) skips the check until the next start."""
        try:
            topic_id = (await kafka.topic_ids()).get(topic)
        except ClusterUnavailableError as exc:
            log.warning("metadata_topic_id_unknown", topic=topic, error=str(exc))
            return
        if topic_id is None:
            log.warning("metadata_topic_id_unknown", topic=topic, error="not in the answer")
            return
        await asyncio.to_thread(store.claim_topic_id, topic_id)

    async def _await_kafka(self, deadline: float) -> bool:
        """Wait while no bootstrap server can be reached (:func:`_connect_once`); False when
        stopped meanwhile. A server that answers but refuses us (credentials, a certificate
        that does not verify) ends the daemon at once, as before: no broker start fixes it."""
        kafka = self.config.kafka
        delay = 1.0
        while True:
            try:
                await _connect_once(
                    kafka.bootstrap_servers, kafka_client_options(kafka), kafka.request_timeout_ms
                )
            except _KafkaUnreachableError as exc:
                if not await self._waiting("Kafka", exc, deadline, delay):
                    return False
                delay = min(delay * 2, _STARTUP_RETRY_MAX_S)
                continue
            self.readiness.set("startup", True)
            return True

    async def _run_with(self, resources: AsyncExitStack, broker_id: int, deadline: float) -> None:
        config = self.config
        meta = config.remote_log_metadata
        options = kafka_client_options(config.kafka)
        bootstrap = config.kafka.bootstrap_servers
        store = await asyncio.to_thread(RemoteSegmentStore, config.state_dir)
        resources.callback(store.close)
        objects = open_store(
            config.s3,
            metrics=self.metrics,  # S3 requests by operation
            # one cap for every upload: the engine's, the broker's copy calls, eager staging
            upload_throttle=upload_throttle(config, self.metrics),
        )
        resources.push_async_callback(objects.aclose)
        retention_kafka = RetentionKafka(
            bootstrap_servers=bootstrap,
            request_timeout_ms=config.kafka.request_timeout_ms,
            client_options=options,
        )
        resources.push_async_callback(retention_kafka.aclose)
        if not await self._await_kafka(deadline):
            return
        tailer = MetadataTailer(
            bootstrap_servers=bootstrap,
            store=store,
            broker_id=broker_id,
            topic=meta.topic,
            client_kwargs={**options, **meta.consumer_kwargs()},
            on_undecodable=lambda *_: self.metrics.metadata_undecodable.inc(),
            on_error=lambda _: self._dependency_error("kafka", "metadata_tailer"),
            on_expired=self.metrics.metadata_expired.inc,
            on_rejected=lambda reason: self.metrics.metadata_events_dropped.labels(reason).inc(),
            num_partitions=meta.num_partitions,
            # selective: only the broker's partitions' events are kept (the coordinator's all)
            scoped=meta.tailing == "selective",
        )
        await tailer.start()
        resources.push_async_callback(tailer.aclose)
        _sample_tailer(self.metrics, tailer)
        publisher = MetadataPublisher(
            bootstrap_servers=bootstrap,
            broker_id=broker_id,
            topic=meta.topic,
            num_partitions=meta.num_partitions,
            replication_factor=meta.replication_factor,
            retention_ms=meta.retention_ms,
            min_isr=meta.min_isr,
            client_kwargs=options,
            producer_kwargs=meta.producer_kwargs(),
            read_back=tailer,
            read_back_timeout_s=meta.consume_wait_ms / 1000,
            metrics=self.metrics,
        )
        await publisher.start()
        resources.push_async_callback(publisher.aclose)
        await publisher.ensure_topic()
        await self._claim_metadata_topic_id(store, retention_kafka, meta.topic)
        cluster = ClusterWatcher(
            bootstrap_servers=bootstrap,
            broker_id=broker_id,
            selector=TopicSelector(
                include=config.tiering.include_topics, exclude=config.tiering.exclude_topics
            ),
            plugin_class=PLUGIN_CLASS,
            refresh_interval_s=config.kafka.metadata_refresh_interval_s,
            stale_after_s=config.kafka.metadata_stale_after_s,
            request_timeout_ms=config.kafka.request_timeout_ms,
            client_options=options,
            on_refresh=lambda _: self._poke_uploaders(),
            on_error=lambda _: self._dependency_error("kafka", "cluster_watcher"),
        )
        resources.push_async_callback(cluster.aclose)
        uploader = SegmentUploader(
            objects=objects,
            publisher=publisher,
            layout=KeyLayout(prefix=config.s3.prefix, hash_prefix=config.s3.hash_prefix),
            broker_id=broker_id,
            part_size=config.s3.part_size_bytes,
            concurrency=config.s3.max_concurrency,
            store=store,
            sync=MetadataSync(
                tailer,
                num_partitions=meta.num_partitions,
                timeout_s=meta.consume_wait_ms / 1000,
            ),
        )
        self.engine = TieringEngine(
            views=lambda: self.detector.views,
            cluster=cluster,
            store=store,
            tailer=tailer,
            uploader=uploader,
            quarantine=Quarantine(config.state_dir / "quarantine.json"),
            metrics=self.metrics,
            settings=EngineSettings(
                max_concurrent_uploads=config.tiering.max_concurrent_uploads,
                drain_timeout_s=config.tiering.drain_timeout_s,
                num_metadata_partitions=meta.num_partitions,
                # an idle partition is planned again on a roll or an LSO move, else this often
                idle_recheck_s=config.tiering.rescan_interval_s,
                # the previous leader's sidecar sees a leadership change within one refresh
                # interval, and its engine acts on it within one wake-up (1 s)
                handover_delay_s=config.kafka.metadata_refresh_interval_s + 1.0,
                # past stale_after_s, no other sidecar can still believe that it leads
                foreign_copy_grace_s=config.kafka.metadata_stale_after_s,
                catch_up_timeout_s=meta.consume_wait_ms / 1000,
            ),
            # S3 or Kafka known down: start no copy that could only fail
            pause_reason=lambda: self._pause_reason(cluster),
        )
        engine = self.engine
        quarantine = engine.quarantine
        # --- remote retention, topic/partition deletion, orphan scrub
        layout = KeyLayout(prefix=config.s3.prefix, hash_prefix=config.s3.hash_prefix)
        election: CoordinatorElection | None = None
        if meta.tailing == "selective":
            election = CoordinatorElection(
                bootstrap_servers=bootstrap,
                broker_id=broker_id,
                topic=meta.topic,
                group_id=meta.coordinator_group_id,
                client_kwargs={**options, **meta.consumer_kwargs()},
                on_error=lambda _: self._dependency_error("kafka", "coordinator_election"),
                on_change=self._coordinator_changed,
            )
        self.retention = RetentionManager(
            config=config.retention,
            views=lambda: self.detector.views,
            cluster=cluster,
            kafka=retention_kafka,
            store=store,
            tailer=tailer,
            publisher=publisher,
            uploader=uploader,
            objects=objects,
            scrubber=OrphanScrubber(
                objects=objects,
                store=store,
                layout=layout,
                owner=lambda: self._prefix_owner,  # no scrub before the claim
                object_grace_s=config.retention.orphan_grace_s,
                upload_grace_s=config.retention.multipart_grace_s,
                in_scope=tailer.complete,
            ),
            metrics=self.metrics,
            metadata_topic=meta.topic,
            num_metadata_partitions=meta.num_partitions,
            coordinator=None if election is None else (lambda: election.is_coordinator),
            scanned=self.detector.scanned.is_set,
        )
        retention = self.retention
        # the broker plugin's copies and deletes (topics with remote.storage.enable=true), and
        # their segments staged on roll, before the broker's copy pass
        staging = StagingLedger() if config.broker.eager_upload else None
        copier = BrokerCopier(
            objects=objects,
            layout=layout,
            log_dirs=config.broker.log_dirs,
            path_map=config.broker.path_map,
            part_size=config.s3.part_size_bytes,
            concurrency=config.s3.max_concurrency,
            staging=staging,
            metrics=self.metrics,
            # the broker tiers what it copies, whatever the last config read says
            on_copy=cluster.note_broker_copy,
        )
        if staging is not None:
            self.stager = EagerStager(
                objects=objects,
                layout=layout,
                views=lambda: self.detector.views,
                cluster=cluster,
                store=store,
                tailer=tailer,
                ledger=staging,
                metrics=self.metrics,
                num_metadata_partitions=meta.num_partitions,
                part_size=config.s3.part_size_bytes,
                concurrency=config.s3.max_concurrency,
                # the same gate as the engine's copies: claimed prefix, S3 and Kafka up
                ready=lambda: self._pause_reason(cluster) is None,
            )
        stager = self.stager
        read_server = ReadServer.from_config(
            config, store=store, objects=objects, metrics=self.metrics, copier=copier
        )
        if meta.tailing == "selective":
            # a read of a partition this broker does not host starts reading its metadata
            read_server.service.discover = _ReadDiscovery(
                tailer=tailer,
                topics=retention_kafka.topic_partitions,
                num_partitions=meta.num_partitions,
                timeout_s=config.read_server.fetch_timeout_s,
            )

        async def status() -> dict[str, Any]:
            rows = await asyncio.to_thread(
                partition_status,
                views=dict(self.detector.views),
                cluster=cluster.view,
                store=store,
                mode=cluster.tiering_mode,
                last_errors=dict(engine.last_errors),
                quarantined=quarantine.entries,
            )
            return {
                "broker_id": broker_id,
                "ready": self.readiness.ready,
                "checks": self.readiness.snapshot(),
                "failing": self.readiness.failing(),
                "metadata": {
                    "tailing": meta.tailing,
                    "tracked_partitions": sorted(tailer.tracked),
                    "coordinator": None if election is None else election.coordinator,
                    "is_coordinator": election is None or election.is_coordinator,
                },
                "broker_plugin": {
                    # seconds since the epoch; None: the broker has not called since this start
                    "last_request_at": read_server.plugin_activity.last_request_at,
                    # the broker's own configs: None while unknown
                    "loaded_by_broker": cluster.broker_runs_plugin,
                    "broker_rsm_class": (
                        None
                        if cluster.view.broker_tiering is None
                        else cluster.view.broker_tiering.rsm_class
                    ),
                },
                "partitions": rows,
            }

        self.health.status_provider = status
        infra = self._infra_stop
        async with asyncio.TaskGroup() as tg:
            engine_task = tg.create_task(
                guard(engine.run(self.stopping), name="tiering engine", stopping=self.stopping),
                name="tiering engine",
            )
            for name, coro in (
                # keeps the per-partition views of the broker's log dirs current
                ("log-dir detector", self.detector.run(infra)),
                # leadership, LSOs and topic configs; uploads stop when it goes stale
                ("cluster watcher", cluster.run(infra)),
                # remote log metadata → local store; read-back for the publisher
                ("metadata tailer", tailer.run(infra)),
                # component health → /readyz (/metrics, /healthz and /readyz are served by
                # the health server that run() started first)
                ("readiness probe", self._probe(cluster, tailer, objects, infra)),
                # tiered reads over the local socket, from the store and the bucket
                ("read server", read_server.run(infra)),
                # how long the loop is held: everything above shares it
                ("loop watchdog", self.watchdog.run(infra)),
            ):
                tg.create_task(guard(coro, name=name, stopping=infra), name=name)
            if election is not None:
                # one sidecar per cluster runs topic and partition deletion and the scrub
                tg.create_task(
                    guard(election.run(infra), name="coordinator election", stopping=infra),
                    name="coordinator election",
                )
            tg.create_task(self._mark_ready_after_first_scan(), name="first scan")
            # the prefix belongs to one cluster: claim it (no upload or scrub before), or stop
            # the daemon when another cluster owns it
            tg.create_task(self._claim_prefix(objects, retention_kafka), name="prefix claim")
            # remote retention and deletions; stops with the engine, before the
            # publisher and tailer it deletes through
            retention_task = tg.create_task(
                guard(retention.run(self.stopping), name="retention", stopping=self.stopping),
                name="retention",
            )
            phase_one = [engine_task, retention_task]
            if stager is not None:
                phase_one.append(
                    tg.create_task(
                        guard(
                            stager.run(self.stopping), name="eager upload", stopping=self.stopping
                        ),
                        name="eager upload",
                    )
                )
            await self.stopping.wait()
            # phase 2: the engine drains with the publisher and tailer still running
            await asyncio.wait(phase_one)
            infra.set()

    async def _claim_prefix(self, objects: ObjectStore, kafka: RetentionKafka) -> None:
        """Write or check the prefix's ownership marker (:mod:`sidecar.storage.ownership`),
        retrying while Kafka or S3 cannot answer (the daemon keeps serving meanwhile); another
        cluster's marker raises PrefixOwnershipError, which stops the daemon."""
        topic = self.config.remote_log_metadata.topic
        delay = 1.0
        while not self.stopping.is_set():
            try:
                cluster_id = await kafka.cluster_id()
                owner, created = await claim_prefix(
                    objects, self.config.s3.prefix, cluster_id=cluster_id, metadata_topic=topic
                )
            except PrefixOwnershipError:
                raise
            except SidecarError as exc:
                # an S3 that lists (the probe passes) but refuses the marker's GET or PUT
                # holds every upload here: not ready, counted, logged
                self._check("prefix_owner", False, f"cannot claim the bucket prefix: {exc}")
                self._dependency_error(
                    "s3" if isinstance(exc, StorageError) else "kafka", "prefix_claim"
                )
                log.warning(
                    "prefix_claim_retry",
                    error=str(exc),
                    error_type=type(exc).__name__,
                    retry_in_s=delay,
                )
                await wait_any(self.stopping, within=delay)
                delay = min(delay * 2, 30.0)
                continue
            log.info(
                "prefix_claimed" if created else "prefix_owner_checked",
                prefix=self.config.s3.prefix,
                cluster_id=owner.cluster_id,
                metadata_topic=owner.metadata_topic,
                created_at=owner.created_at,
            )
            self._prefix_owner = owner
            self._check("prefix_owner", True, None)
            self._freeze_before_uploads()
            if self.engine is not None:
                self.engine.retry_now()
            return

    def _freeze_before_uploads(self) -> None:
        """Freeze the startup heap once the first scan is done and the prefix claimed: the
        clients, the store and the scan are in memory by then, and no upload has started (a
        freeze later, at readiness, spent its collection inside the first uploads)."""
        if self.detector.scanned.is_set() and self._prefix_owner is not None:
            freeze_startup_heap()

    def _pause_reason(self, cluster: ClusterWatcher) -> str | None:
        """Why no copy should start now: a dependency the last probe or refresh found down."""
        if self._s3_down:
            return "S3 is unreachable"
        if self._prefix_owner is None:
            return "the bucket prefix's ownership is not confirmed yet"
        if cluster.last_error is not None:
            return "Kafka is unreachable"
        return None

    def _coordinator_changed(self, holds: bool) -> None:
        self.metrics.cluster_coordinator.set(1 if holds else 0)
        if self.retention is not None:
            self.retention.poke()  # take up (or drop) the cluster duties now

    def _dependency_error(self, dependency: str, component: str) -> None:
        self.metrics.dependency_errors.labels(dependency, component).inc()

    async def _probe(
        self,
        cluster: ClusterWatcher,
        tailer: MetadataTailer,
        objects: ObjectStore,
        stopping: asyncio.Event,
    ) -> None:
        """Every second: Kafka answering, metadata caught up; S3 answering every
        ``s3_probe_interval_s`` (every second while it does not). A check that recovers ends
        the upload workers' backoff."""
        prefix = self.config.s3.prefix
        selection = SelectionMonitor(
            include_topics=self.config.tiering.include_topics,
            set_gauge=self.metrics.selected_partitions.set,
            set_detail=self.readiness.set_detail,
        )
        counted: tuple[object, int] | None = None  # the topic configs and partitions counted
        led_counted: tuple[object, object] | None = None  # the configs and leaders counted
        copied_for: object = None  # the configs that broker_copied was computed from
        broker_copied = False  # a topic in the cluster is copied by the broker's RLM
        was_ready = False
        s3_error: str | None = None
        next_s3_probe = 0.0
        metadata = MetadataReadiness()
        while not stopping.is_set():
            lagging = sorted(p for p in tailer.tracked if not tailer.caught_up(p))
            self._check("kafka", cluster.healthy, cluster.last_error or "no recent refresh")
            ok, reason = metadata.check(
                healthy=tailer.healthy,
                error=tailer.last_error,
                lagging=lagging,
                scanned=self.detector.scanned.is_set(),
                passes=0 if self.engine is None else self.engine.passes,
            )
            self._check("metadata", ok, reason)
            if s3_error is not None or time.monotonic() >= next_s3_probe:
                s3_error = await self._probe_s3(objects, prefix)
                self._check("s3", s3_error is None, s3_error)
                next_s3_probe = time.monotonic() + self.config.metrics.s3_probe_interval_s
            view = cluster.view
            # again when a topic config changes (a refresh keeps the same object otherwise)
            # or a partition came or went
            if (
                self.detector.scanned.is_set()
                and view.fresh
                and (
                    counted is None
                    or counted[0] is not view.configs
                    or counted[1] != self._gauges.topics_changed
                )
            ):
                counted = (view.configs, self._gauges.topics_changed)
                # broker-driven topics count: the broker tiers them through this sidecar
                selection.update(self._gauges.per_topic, cluster.tiered)
            # a refresh keeps the leaders' object while leadership stays the same
            if view.fresh and (
                led_counted is None
                or led_counted[0] is not view.configs
                or led_counted[1] is not view.leaders
            ):
                led_counted = (view.configs, view.leaders)
                self.metrics.partitions_led.set(
                    count_led(view.leaders, view.broker_id, cluster.tiered)
                )
            if copied_for is not view.configs:
                copied_for = view.configs
                broker_copied = any(cluster.broker_copies(topic) for topic in view.configs)
            runs_plugin = cluster.broker_runs_plugin
            self.metrics.broker_runs_plugin.set(broker_plugin_gauge(runs_plugin, broker_copied))
            self.metrics.topic_configs_refused.set(len(view.refused_configs))
            if self.readiness.ready != was_ready:
                was_ready = self.readiness.ready
                if was_ready:
                    log.info("sidecar_ready", checks=self.readiness.snapshot())
                    freeze_startup_heap()  # every client, the store and the first scan are up
                else:
                    log.warning(
                        "sidecar_not_ready",
                        checks=self.readiness.snapshot(),
                        failing=self.readiness.failing(),
                    )
            await wait_any(stopping, within=1.0)

    def _check(self, name: str, ok: bool, reason: str | None) -> None:
        if self.readiness.set(name, ok, reason=reason) and ok and self.engine is not None:
            self.engine.retry_now()  # a dependency is back: no need to sit out the backoff

    async def _probe_s3(self, objects: ObjectStore, prefix: str) -> str | None:
        """None when S3 answers a one-key listing, else why not (logged once per outage)."""
        try:
            async with asyncio.timeout(self.config.s3.request_timeout_s):
                async for _ in objects.list(prefix, page_size=1):
                    break
        except (SidecarError, TimeoutError) as exc:
            error = str(exc) or type(exc).__name__
            self._dependency_error("s3", "readiness_probe")
            if not self._s3_down:
                self._s3_down = True
                log.warning("s3_unreachable", error=error)
            return error
        if self._s3_down:
            self._s3_down = False
            log.info("s3_reachable")
        return None


class _ReadDiscovery:
    """Selective tailing reads only the metadata of this broker's partitions; a socket read of
    another partition starts reading its metadata partition and waits until it is caught up
    (then the read finds it in the store). A topic the cluster does not know is not asked for
    again for ``_NEGATIVE_TTL_S``, so unknown names cost no Metadata request each. A partition
    number the topic does not have is unknown at once: each partition wanted stays in the
    tailer's scope for good, and its metadata partition is read again from its start, so
    numbers a client makes up must not reach the tailer."""

    _NEGATIVE_TTL_S = 5.0
    #: unknown names remembered at most (clients choose them: a scan of made-up names)
    _MAX_UNKNOWN = 10_000

    def __init__(
        self,
        *,
        tailer: MetadataTailer,
        topics: Callable[[], Awaitable[dict[str, tuple[uuid.UUID, int]]]],
        num_partitions: int,
        timeout_s: float,
    ) -> None:
        """``topics``: every topic of the cluster, name → (topic id, partition count)."""
        self._tailer = tailer
        self._topics = topics
        self._num_partitions = num_partitions
        self._timeout_s = timeout_s
        self._unknown: dict[str, float] = {}  # topic → until when it is not asked for again

    async def __call__(self, topic: str, partition: int) -> bool:
        if time.monotonic() < self._unknown.get(topic, 0.0):
            return False
        try:
            found = (await self._topics()).get(topic)
        except SidecarError as exc:
            log.warning("read_discovery_failed", topic=topic, error=str(exc))
            return False
        if found is None:
            now = time.monotonic()
            if len(self._unknown) >= self._MAX_UNKNOWN:  # names from clients: keep it bounded
                self._unknown = {t: u for t, u in self._unknown.items() if u > now}
                if len(self._unknown) >= self._MAX_UNKNOWN:
                    self._unknown.clear()
            self._unknown[topic] = now + self._NEGATIVE_TTL_S
            return False
        topic_id, partitions = found
        if not 0 <= partition < partitions:
            return False
        tp = TopicIdPartition(topic_id, topic, partition)
        mp = metadata_partition(tp, self._num_partitions)
        if self._tailer.wants(tp) and self._tailer.caught_up(mp):
            return False  # read and caught up: the store has all there is
        if not self._tailer.wants(tp):
            log.info("metadata_partition_read_for_a_read", topic=topic, metadata_partition=mp)
            self._tailer.want([tp])
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._tailer.wait_caught_up([mp])
        except (TimeoutError, SidecarError):
            return False
        return True


def run_daemon(config: SidecarConfig) -> int:
    """Configure logging, run the daemon on uvloop (where available), return the exit code."""
    configure_logging(
        level=config.logging.level, fmt=config.logging.format, secrets=secret_values(config)
    )

    async def main() -> None:
        await Daemon(config).run()

    try:
        if sys.platform != "win32":
            import uvloop

            uvloop.run(main())
        else:  # pragma: no cover
            asyncio.run(main())
    except asyncio.CancelledError:
        log.warning("sidecar_stopped_forcefully")
        return 130
    except BaseExceptionGroup as group:
        # each root task's traceback was logged by guard(); this is the one-line summary
        leaves = failures(group)
        for exc in leaves:
            log.error("sidecar_failed", error=str(exc), error_type=type(exc).__name__)  # noqa: TRY400
        codes = {exc.exit_code for exc in leaves if isinstance(exc, SidecarError)}
        return codes.pop() if len(codes) == 1 and len(leaves) == 1 else 1
    except SidecarError as exc:
        log.error("sidecar_failed", error=str(exc), error_type=type(exc).__name__)  # noqa: TRY400
        return exc.exit_code
    return 0
