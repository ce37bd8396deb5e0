"""Composition root: build the components from the configuration, run the root tasks under one
TaskGroup, and shut down in phases on SIGTERM.

Root tasks (each wrapped by :func:`sidecar._aio.guard`; one exiting early stops the daemon):

* ``log-dir detector``  watches the broker's log dirs and keeps a view per partition
* ``health server``     serves /metrics, /healthz and /readyz

Later issues add the upload workers, the metadata tailer, the read server and retention here.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from sidecar import __version__
from sidecar._aio import capture_signals, guard
from sidecar.config import SidecarConfig
from sidecar.errors import FormatError, SidecarError
from sidecar.kafka.checkpoints import MetaProperties, read_meta_properties
from sidecar.kafka.logdir import META_PROPERTIES, PartitionScan, scan_partition_dir
from sidecar.observability.health import HealthServer, Readiness
from sidecar.observability.logging import bind_context, configure_logging, get_logger
from sidecar.observability.metrics import Metrics
from sidecar.tiering.detector import LogDirDetector

__all__ = ["Daemon", "run_daemon"]

log = get_logger(__name__)


def read_broker_identity(log_dirs: list[Path]) -> MetaProperties | None:
    """The first readable ``meta.properties`` of the broker's log dirs (node id, cluster id)."""
    for log_dir in log_dirs:
        try:
            return read_meta_properties(log_dir / META_PROPERTIES)
        except (FileNotFoundError, FormatError):
            continue
    return None


def _secrets(config: SidecarConfig) -> list[str]:
    values = [config.s3.access_key_id, config.s3.secret_access_key, config.kafka.sasl_password]
    return [v.get_secret_value() for v in values if v is not None]


class Daemon:
    """The running sidecar: its components and root tasks."""

    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.metrics.build_info.info({"version": __version__})
        self.readiness = Readiness()
        self.readiness.register("log_dirs_scanned")
        self.stopping = asyncio.Event()
        self.detector: LogDirDetector[PartitionScan] = LogDirDetector(
            log_dirs=config.broker.log_dirs,
            scan_partition=scan_partition_dir,
            on_change=self._on_partition_change,
            rescan_interval_s=config.tiering.rescan_interval_s,
            metrics=self.metrics,
        )
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
                    log.info(
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
        self._refresh_gauges()

    def _refresh_gauges(self) -> None:
        views = self.detector.views.values()
        rolled = sum(len(v.segments) - (1 if v.segments else 0) for v in views)
        self.metrics.partitions_watched.set(len(views))
        self.metrics.segments_local.labels("rolled").set(rolled)
        self.metrics.segments_local.labels("active").set(sum(1 for v in views if v.segments))
        self.metrics.segments_local_bytes.set(sum(seg.size for v in views for seg in v.segments))

    async def _mark_ready_after_first_scan(self) -> None:
        await self.detector.scanned.wait()
        self.readiness.set("log_dirs_scanned", True)
        views = self.detector.views.values()
        log.info(
            "log_dirs_scanned",
            partitions=len(views),
            segments=sum(len(v.segments) for v in views),
            ready=sum(len(v.ready_segments) for v in views),
        )

    async def run(self) -> None:
        """Run every root task until SIGTERM/SIGINT, then stop them in order."""
        broker_id = self.config.broker.broker_id
        identity = await asyncio.to_thread(read_broker_identity, self.config.broker.log_dirs)
        if broker_id is None and identity is not None:
            broker_id = identity.node_id
        with capture_signals(self.stopping), bind_context(broker_id=broker_id):
            log.info(
                "sidecar_starting",
                version=__version__,
                log_dirs=[str(d) for d in self.config.broker.log_dirs],
                cluster_id=identity.cluster_id if identity else None,
            )
            async with asyncio.TaskGroup() as tg:
                for name, coro in (
                    # keeps the per-partition views of the broker's log dirs current
                    ("log-dir detector", self.detector.run(self.stopping)),
                    # /metrics, /healthz, /readyz for Prometheus and the kubelet
                    ("health server", self.health.run(self.stopping)),
                ):
                    tg.create_task(guard(coro, name=name, stopping=self.stopping), name=name)
                tg.create_task(self._mark_ready_after_first_scan(), name="readiness")
            log.info("sidecar_stopped")


def run_daemon(config: SidecarConfig) -> int:
    """Configure logging, run the daemon on uvloop (where available), return the exit code."""
    configure_logging(
        level=config.logging.level, fmt=config.logging.format, secrets=_secrets(config)
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
        for exc in _leaves(group):
            log.error("sidecar_failed", error=str(exc), error_type=type(exc).__name__)  # noqa: TRY400
        return 1
    except SidecarError as exc:
        log.error("sidecar_failed", error=str(exc), error_type=type(exc).__name__)  # noqa: TRY400
        return exc.exit_code
    return 0


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found.extend(_leaves(exc))
        elif not isinstance(exc, asyncio.CancelledError):
            found.append(exc)
    return found
