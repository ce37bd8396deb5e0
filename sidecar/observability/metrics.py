"""Every Prometheus metric the sidecar exports, in one place, each with its help text.

Names follow Prometheus conventions (base units, ``_total``, ``_seconds``, ``_bytes``). Labels
stay bounded: topic and outcome at most, never offsets, file names or exception text. The
metrics live in a registry owned by the :class:`Metrics` object (not the process-global default
registry), so tests and several daemons in one process never collide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.metrics import MetricWrapperBase

__all__ = [
    "PUBLISH_STAGES",
    "S3_ERROR_REASONS",
    "S3_OPERATIONS",
    "Metrics",
    "metric_reference",
    "reference_markdown",
]

NAMESPACE = "kafka_tiered_sidecar"

#: the ``operation`` label of the S3 request metrics (the S3 API's names, in snake case)
S3_OPERATIONS: Final = (
    "put_object",
    "create_multipart_upload",
    "upload_part",
    "complete_multipart_upload",
    "abort_multipart_upload",
    "list_multipart_uploads",
    "get_object",
    "head_object",
    "copy_object",
    "list_objects",
    "delete_objects",
)
#: the ``reason`` label of ``s3_request_errors_total``
S3_ERROR_REASONS: Final = (
    "not_found",
    "invalid_range",
    "checksum_mismatch",
    "access_denied",
    "throttled",
    "server_error",
    "client_error",
    "timeout",
    "connection",
    "cancelled",
    "other",
)
#: the ``stage`` label of the metadata publish metrics
PUBLISH_STAGES: Final = ("acked", "read_back")
#: the ``outcome`` label of ``eager_uploads_total``
EAGER_OUTCOMES: Final = ("staged", "adopted", "not_staged", "failed")
#: label sets with fixed values, documented with the metrics reference
FIXED_LABEL_VALUES: Final = {
    "operation (s3_*)": S3_OPERATIONS,
    "outcome (eager_uploads_total)": EAGER_OUTCOMES,
    "reason (s3_request_errors_total)": S3_ERROR_REASONS,
    "stage (metadata_publish_*)": PUBLISH_STAGES,
}
_EXPOSED_SUFFIX: Final = {"counter": "_total", "info": "_info"}


def metric_reference() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(exposed name, type, label names, help) of every metric, in definition order."""
    rows = []
    for value in vars(Metrics()).values():
        if isinstance(value, MetricWrapperBase):
            kind = str(value._type)
            name = value._name + _EXPOSED_SUFFIX.get(kind, "")
            rows.append((name, kind, tuple(value._labelnames), value._documentation))
    return rows


def reference_markdown() -> str:
    """The README's metrics table (``python -m tests.unit.test_metrics_reference`` writes it)."""
    lines = ["| Metric | Type | Labels | Description |", "|---|---|---|---|"]
    for name, kind, labels, documentation in metric_reference():
        label_text = ", ".join(f"`{label}`" for label in labels)
        lines.append(f"| `{name}` | {kind} | {label_text} | {documentation} |")
    lines.append("")
    lines.append("Labels with a fixed set of values:")
    lines.append("")
    for label, values in FIXED_LABEL_VALUES.items():
        lines.append(f"- `{label}`: " + ", ".join(f"`{v}`" for v in values))
    return "\n".join(lines) + "\n"


class Metrics:
    """The sidecar's metrics, registered in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        #: gauges read from the event loop's state before each render (see ``sample_on_loop``)
        self._sampled: list[tuple[Gauge, Callable[[], float]]] = []
        self.build_info = Info("build", "Sidecar version.", namespace=NAMESPACE, registry=r)
        self.event_loop_lag = Histogram(
            "event_loop_lag_seconds",
            "How late the event loop ran the watchdog's timer: the longest time it could not run"
            " anything else (uploads, Kafka clients, reads, /healthz) in each 100 ms interval.",
            namespace=NAMESPACE,
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )
        self.partitions_watched = Gauge(
            "partitions_watched",
            "Partitions found in the broker's log dirs.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.segments_local = Gauge(
            "local_segments",
            "Segments in the broker's log dirs, by state (rolled = closed, active = open).",
            ["state"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.segments_local_bytes = Gauge(
            "local_segment_bytes",
            "Bytes of .log files in the broker's log dirs.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.log_dir_scans = Counter(
            "log_dir_scans",
            "Scans that list the broker's log dirs (full scans and the stat-only rescans between"
            " them), by outcome; rescans of the partition dirs an inotify hint named are not"
            " counted.",
            ["outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.log_dir_scan_seconds = Histogram(
            "log_dir_scan_seconds",
            "Time of one scan counted in log_dir_scans_total.",
            namespace=NAMESPACE,
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10),
        )
        self.format_errors = Counter(
            "format_errors",
            "Files in the log dirs that could not be parsed, by kind.",
            ["kind"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.log_dir_events = Counter(
            "log_dir_events",
            "inotify events received from the log dirs (hints for a rescan).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.log_dir_hints = Gauge(
            "log_dir_hints",
            "1 while inotify hints cover every log dir and partition dir; 0 while some or all"
            " rolls are seen by the rescans alone (watch limit reached, watcher stopped).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.log_dir_watch_restarts = Counter(
            "log_dir_watch_restarts",
            "inotify watchers started again: a log dir appeared, or the watcher had stopped.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.copy_lag_segments = Gauge(
            "copy_lag_segments",
            "Rolled local segments not yet copied to remote storage, by topic.",
            ["topic"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.copy_lag_bytes = Gauge(
            "copy_lag_bytes",
            "Bytes of rolled local segments not yet copied, by topic.",
            ["topic"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.copy_lag_seconds = Gauge(
            "copy_lag_seconds",
            "Age of the newest record of the oldest segment not yet copied, by topic.",
            ["topic"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.segments_copied = Counter(
            "segments_copied",
            "Segments copied to remote storage (COPY_SEGMENT_FINISHED published), by topic.",
            ["topic"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.bytes_copied = Counter(
            "copied_bytes",
            "Bytes copied to remote storage (segments and indexes), by topic.",
            ["topic"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.upload_seconds = Histogram(
            "segment_upload_seconds",
            "Time to copy one segment, from COPY_SEGMENT_STARTED to FINISHED read back.",
            namespace=NAMESPACE,
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.upload_errors = Counter(
            "upload_errors",
            "Failed segment copies, by error type.",
            ["kind"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.upload_throttle_rate = Gauge(
            "upload_throttle_rate_bytes",
            "The upload bandwidth cap in bytes per second, shared by every upload of the daemon"
            " (tiering.max_upload_bytes_per_second); 0 = unlimited.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.upload_throttle_wait = Counter(
            "upload_throttle_wait_seconds",
            "Seconds uploads waited for the upload bandwidth cap before sending a part or a PUT,"
            " summed over concurrent uploads (its rate is the average number of waiting parts).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.quarantined_segments = Gauge(
            "quarantined_segments",
            "Local segments whose bytes are corrupt (bad CRC or framing): not uploaded until"
            " cleared with `sidecar quarantine clear`; later segments still tier, leaving a gap.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.quarantined_bytes = Gauge(
            "quarantined_bytes",
            "Bytes of the quarantined segments: never tiered, their only copy is local and the"
            " broker's local retention deletes it.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.corrupt_snapshots_tiered = Counter(
            "corrupt_snapshots_tiered",
            "Segments tiered with an older producer snapshot that fails its CRC, uploaded as it"
            " is (as Kafka's RLM does: it never heals, and the segment would otherwise never"
            " tier), by topic.",
            ["topic"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.stalled_partitions = Gauge(
            "stalled_partitions",
            "Partitions whose tiering has waited longer than 5 minutes for a rolled segment that"
            " is not ready (its producer snapshot or an index missing, unfinished or unreadable),"
            " by reason: nothing from that segment on is tiered.",
            ["reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.segment_read_retries = Counter(
            "segment_read_retries",
            "Uploads retried (with backoff) because a local segment file could not be read, by"
            " reason (the errno, e.g. eio, eacces); such segments are never quarantined.",
            ["reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.readiness_checks = Gauge(
            "readiness_check",
            "Readiness checks behind /readyz: 1 passing, 0 failing (the check label says which).",
            ["check"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.dependency_errors = Counter(
            "dependency_errors",
            "Failed calls to Kafka or S3 outside segment uploads, by dependency and component.",
            ["dependency", "component"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.preempted_copies = Counter(
            "preempted_copies",
            "Copies abandoned, by reason: not_leader (another broker leads the partition now),"
            " cluster_view_stale (leadership unknown), broker_driven (the topic turned"
            " broker-driven), deleted_by_another_broker (it took the copy for dangling and"
            " deleted it before FINISHED landed; also an upload error).",
            ["reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.eager_uploads = Counter(
            "eager_uploads",
            "Broker-driven segments uploaded ahead of the broker's copy call, by outcome: staged"
            " (uploaded on roll), adopted (a copy call bound it to the broker's segment id),"
            " not_staged (a copy call found nothing staged and uploaded itself), failed (a"
            " staging upload failed; the copy call uploads instead).",
            ["outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.broker_runs_plugin = Gauge(
            "broker_runs_plugin",
            "1 when the broker beside the sidecar loads the sidecar's plugin as its"
            " RemoteStorageManager (its remote.log.storage.* configs); 0 when it does not while"
            " the cluster has topics the broker copies (remote.storage.enable: another class"
            " copies them, and nothing is uploaded ahead); -1 while unknown, or when no topic"
            " is broker-driven.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.broker_runs_plugin.set(-1)
        self.repairs = Counter(
            "crash_repairs",
            "Unfinished copies deleted and unfinished deletes finished (after a crash, or left by"
            " a previous leader), by kind.",
            ["kind"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.metadata_undecodable = Counter(
            "metadata_undecodable_records",
            "Records of the remote log metadata topic that did not decode (skipped).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.metadata_events_dropped = Counter(
            "metadata_events_dropped",
            "Events of the remote log metadata topic that the store dropped as Kafka's own"
            " metadata cache would (invalid transition, unknown segment, ...), by reason.",
            ["reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.metadata_expired = Counter(
            "metadata_expired_records",
            "Records of the remote log metadata topic deleted (its retention, DeleteRecords)"
            " before the sidecar read them: their events are missing from its store.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.partitions_led = Gauge(
            "partitions_led",
            "Partitions of tiered topics (standalone or broker-driven) that this broker leads.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.topic_configs_refused = Gauge(
            "topic_configs_refused",
            "Topics whose configs the brokers refused to describe at the last refresh (an"
            " authorizer without DESCRIBE_CONFIGS): each keeps its last configs read, and one"
            " never read is not tiered by the sidecar.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.selected_partitions = Gauge(
            "selected_partitions",
            "Partitions of the broker's log dirs selected for tiering (remote.storage.enable or"
            " tiering.include_topics); 0 means nothing will be tiered.",
            namespace=NAMESPACE,
            registry=r,
        )
        # --- S3 requests, metadata publishes and the metadata store
        self.s3_requests = Counter(
            "s3_requests",
            "S3 request attempts (retries count again), by operation.",
            ["operation"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.s3_request_errors = Counter(
            "s3_request_errors",
            "S3 request attempts that failed, by operation and reason (not_found, timeout, ...).",
            ["operation", "reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.s3_unechoed_uploads = Counter(
            "s3_unechoed_uploads",
            "Uploads whose response carried no CRC-32C echo, by resolution: verified_head (a HEAD"
            " returned the checksum), verified_get (the read-back matched), mismatch, refused.",
            ["resolution"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.s3_request_seconds = Histogram(
            "s3_request_seconds",
            "Time of one S3 request attempt (failed ones too), by operation.",
            ["operation"],
            namespace=NAMESPACE,
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        for operation in S3_OPERATIONS:  # every operation's series exists from the start
            self.s3_requests.labels(operation)
            self.s3_request_seconds.labels(operation)
        self.metadata_publish_seconds = Histogram(
            "metadata_publish_seconds",
            "Time to publish one remote log metadata event, by stage: acked (send until all"
            " in-sync replicas have it) and read_back (send until the local store applied it).",
            ["stage"],
            namespace=NAMESPACE,
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
        )
        self.metadata_publish_errors = Counter(
            "metadata_publish_errors",
            "Metadata publishes that failed, by the stage that failed (acked, read_back).",
            ["stage"],
            namespace=NAMESPACE,
            registry=r,
        )
        for stage in PUBLISH_STAGES:
            self.metadata_publish_seconds.labels(stage)
            self.metadata_publish_errors.labels(stage)
        for outcome in EAGER_OUTCOMES:
            self.eager_uploads.labels(outcome)
        self.metadata_store_lag = Gauge(
            "metadata_store_lag_records",
            "Records of the tracked metadata partitions not yet applied to the local store"
            " (end offset minus next offset to apply, summed).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.metadata_partitions_stalled = Gauge(
            "metadata_partitions_stalled",
            "Partitions of the remote log metadata topic behind their end offset whose reading"
            " did not move between two progress checks (their leader unreachable from here).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.metadata_partitions_tracked = Gauge(
            "metadata_partitions_tracked",
            "Partitions of the remote log metadata topic the sidecar reads.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.cluster_coordinator = Gauge(
            "cluster_coordinator",
            "1 while this sidecar is the elected coordinator that runs topic and partition"
            " deletion and the orphan scrub for the cluster (selective metadata tailing).",
            namespace=NAMESPACE,
            registry=r,
        )
        # --- the read path: socket requests, the chunk cache, S3 fetches
        self.read_requests = Counter(
            "read_requests",
            "Requests to the read socket, by endpoint and HTTP status (499: the client closed"
            " the connection before the whole response was sent).",
            ["endpoint", "status"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_request_seconds = Histogram(
            "read_request_seconds",
            "Time to serve one read-socket request (whole response), by endpoint.",
            ["endpoint"],
            namespace=NAMESPACE,
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30),
        )
        self.read_bytes = Counter(
            "read_response_bytes",
            "Body bytes sent by the read socket, by endpoint.",
            ["endpoint"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_shared_file_bytes = Counter(
            "read_shared_file_bytes",
            "Bytes the broker plugin was pointed to in the chunk cache's files (it reads them"
            " itself) instead of being sent them.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_requests_in_flight = Gauge(
            "read_requests_in_flight",
            "Read-socket requests being served.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_cache_lookups = Counter(
            "read_cache_lookups",
            "Chunk-cache lookups, by result (hit, miss, joined = shared an in-flight GET).",
            ["result"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_readahead_changes = Counter(
            "read_readahead_changes",
            "Changes of a sequential reader's read-ahead depth: deeper (it waited, and the last"
            " deepening made it read faster), back (a deeper read-ahead read no faster: the"
            " reader keeps the depth before).",
            ["change"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_cache_evictions = Counter(
            "read_cache_evictions",
            "Chunks evicted from the disk cache (least recently used first).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_cache_bytes = Gauge(
            "read_cache_bytes",
            "Bytes of chunks in the disk cache.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_cache_pending_write_bytes = Gauge(
            "read_cache_pending_write_bytes",
            "Bytes of fetched chunks waiting to be written to the disk cache.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_cache_writes_skipped = Counter(
            "read_cache_writes_skipped",
            "Fetched chunks served from memory only, not written to the disk cache: the writes"
            " behind already held read_server.cache_max_pending_write_bytes (disk slower than S3),"
            " or files the cache could not remove held its budget.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_cache_unlink_errors = Counter(
            "read_cache_unlink_errors",
            "Chunk files the disk cache could not remove when it evicted or dropped them, or"
            " after their write's rename failed (EACCES, EIO, EROFS): they stay counted in"
            " read_cache_bytes while they stay on disk, and a later eviction tries them again.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_early_bytes = Counter(
            "read_early_bytes",
            "Bytes the read server answered with from a GET still in flight, as they arrived"
            " (a reader that needs the start of a chunk does not wait for the whole chunk).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_fetches = Counter(
            "read_fetches",
            "Ranged GETs of the read path, by kind (demand: a reader waits for it; prefetch:"
            " read-ahead, the next segment's start, and a segment's indexes fetched beside its"
            " manifest) and outcome.",
            ["kind", "outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_fetch_bytes = Counter(
            "read_fetched_bytes",
            "Bytes fetched from S3 by the read path.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_fetch_seconds = Histogram(
            "read_fetch_seconds",
            "Time of one ranged GET of the read path.",
            namespace=NAMESPACE,
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 30),
        )
        self.read_index_lookups = Counter(
            "read_index_cache_lookups",
            "Lookups of remote manifests and indexes in memory, by result (hit, miss).",
            ["result"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_errors = Counter(
            "read_errors",
            "Read requests that failed, by error code (the JSON error's stable code).",
            ["code"],
            namespace=NAMESPACE,
            registry=r,
        )
        # --- remote retention, topic/partition deletion, orphan scrub
        self.retention_deleted_segments = Counter(
            "retention_deleted_segments",
            "Remote segments deleted (DELETE_SEGMENT_FINISHED published), by topic and reason"
            " (retention_ms, retention_bytes, log_start_offset, lineage, retry, topic_deleted,"
            " partition_deleted).",
            ["topic", "reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.retention_deleted_bytes = Counter(
            "retention_deleted_bytes",
            "Bytes of the .log of remote segments deleted, by topic and reason.",
            ["topic", "reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.retention_errors = Counter(
            "retention_errors",
            "Retention, deletion or scrub steps that failed (retried next pass), by error type.",
            ["kind"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.partition_deletions = Counter(
            "remote_partition_deletions",
            "KIP-405 partition deletions finished (DELETE_PARTITION_FINISHED published).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.topic_deletion_halted = Counter(
            "topic_deletion_halted",
            "Retention passes whose topic deletions would have removed more than"
            " retention.topic_deletion_max_share of the tiered segments: none were deleted.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.topic_deletion_unconfirmed = Counter(
            "topic_deletion_unconfirmed",
            "Topic ids missing from the all-topics listing that the cluster did not confirm"
            " unknown when asked by id (unauthorized = TOPIC_AUTHORIZATION_FAILED, unknown ="
            " another answer), by reason; their data is kept.",
            ["reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.scrub_runs = Counter(
            "scrub_runs",
            "Orphan scrubs, by outcome (ok, failed, stopped = the daemon stopped during the"
            " listing, nothing deleted; skipped = metadata or topic configs not"
            " read yet, refused = the metadata topic's retention.ms/bytes is not -1, or the"
            " prefix's ownership marker is missing or another cluster's, so deleting could"
            " remove objects that are not orphans).",
            ["outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.scrub_deleted_objects = Counter(
            "scrub_deleted_objects",
            "Unreferenced objects deleted by the orphan scrub (older than the grace period).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.scrub_aborted_uploads = Counter(
            "scrub_aborted_uploads",
            "Incomplete multipart uploads aborted by the orphan scrub.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.segments_at_risk = Gauge(
            "segments_at_risk",
            "Local segments not yet tiered that the broker's local retention will delete soon,"
            " by topic.",
            ["topic"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.segments_lost = Counter(
            "segments_lost",
            "Segments the broker deleted locally before they were tiered (data loss), by topic.",
            ["topic"],
            namespace=NAMESPACE,
            registry=r,
        )

    def sample_on_loop(self, gauge: Gauge, read: Callable[[], float]) -> None:
        """Set ``gauge`` to ``read()`` before each /metrics render, on the event loop.

        Not ``Gauge.set_function``: that calls ``read`` during the render, which runs in a
        worker thread, and ``read`` looks at what the loop changes meanwhile (a set of tracked
        partitions, the Kafka consumer's fetch state): iterated from another thread, a set
        that grows raises and the scrape fails."""
        self._sampled.append((gauge, read))

    def sample(self) -> None:
        """Set every gauge given to :meth:`sample_on_loop` (on the event loop)."""
        for gauge, read in self._sampled:
            gauge.set(read())

    def forget_topic(self, topic: str) -> None:
        """Drop every series labelled with ``topic`` (a deleted topic's counters would
        otherwise stay in every scrape for the daemon's life)."""
        for metric in vars(self).values():
            if isinstance(metric, MetricWrapperBase) and "topic" in metric._labelnames:
                metric.remove_by_labels({"topic": topic})
