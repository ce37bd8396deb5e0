"""What the fault scenarios share: a one-partition topic with a backlog of rolled segments,
a sidecar whose S3 traffic goes through the fault proxy, and the convergence check (every
rolled segment has exactly one FINISHED copy, nothing unfinished, every object in the bucket
belongs to a FINISHED copy, no multipart upload open)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.metadata.events import RemoteLogSegmentState
from tests.conftest import stack
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    end_offsets,
    expected_keys,
    multipart_uploads,
    partition_scan,
    rolled_below,
    topic_id_partition,
    write_config,
)
from tests.helpers import create_topic, produce

#: what the sidecar counts each S3 fault as (``reason`` of s3_request_errors_total)
REASONS = {
    "internal_error": "server_error",
    "slow_down": "throttled",
    "request_timeout": "client_error",
    "truncate": "connection",
    "reset": "connection",
    "blackhole": "timeout",
}


async def backlog_topic(kafka: Any, topic: str, *, records: int = 2600) -> list[Any]:
    """A one-partition topic with 1 MiB segments and ``records`` KB records produced; the
    segments rolled below the last stable offset."""
    await create_topic(
        kafka.bootstrap_servers,
        topic,
        configs={"segment.bytes": "1048576", "segment.ms": "3600000"},
    )
    await produce(kafka.bootstrap_servers, topic, count=records, partition=0)
    return await rolled(kafka, topic)


async def rolled(kafka: Any, topic: str) -> list[Any]:
    lso = (await end_offsets(kafka.bootstrap_servers, topic, [0]))[0]
    return rolled_below(partition_scan(kafka.log_dir, topic, 0), lso)


@dataclass
class Run:
    config: Path
    metrics_port: int
    state_dir: Path


def sidecar_config(
    tmp_path: Path,
    kafka: Any,
    store: Any,
    topic: str,
    prefix: str,
    *,
    s3_options: dict[str, Any] | None = None,
    kafka_options: dict[str, Any] | None = None,
    **sections: Any,
) -> Run:
    """A sidecar config for ``topic`` with ``store`` (the S3 server or its proxied view);
    ``s3_options`` and ``kafka_options`` go into its [s3] and [kafka] sections."""
    port = stack.free_port()
    state = tmp_path / "state"
    config = write_config(
        tmp_path / "sidecar.toml",
        state_dir=state,
        log_dir=kafka.log_dir,
        bootstrap=kafka.bootstrap_servers,
        s3=store,
        metrics_port=port,
        metadata_topic=f"__rlm_{topic}",
        include_topics=[topic],
        prefix=prefix,
        **sections,
    )
    for section, options in (("s3", s3_options), ("kafka", kafka_options)):
        if options:
            extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())
            header = f"[{section}]\n"
            config.write_text(config.read_text().replace(header, header + extra, 1))
    return Run(config, port, state)


def tiered(sidecars: list[Sidecar]) -> set[int]:
    return {e["base_offset"] for s in sidecars for e in s.matching("segment_tiered")}


async def wait_all_tiered(sidecars: list[Sidecar], segments: list[Any], timeout: float) -> None:
    wanted = {s.base_offset for s in segments}
    await sidecars[-1].wait_until(
        lambda: wanted <= tiered(sidecars), timeout=timeout, what="every rolled segment tiered"
    )


@dataclass
class Outcome:
    """What a scenario left: counted for the reliability table."""

    segments_lost: int
    duplicate_finished: int
    orphans: int
    uploads_open: int


async def converged(
    kafka: Any,
    s3: Any,
    topic: str,
    prefix: str,
    segments: list[Any],
    scratch: Path,
    *,
    timeout: float = 60,
) -> Outcome:
    """Read the metadata topic and the bucket until nothing is unfinished; count what is
    lost (a rolled segment without a FINISHED copy), duplicated (two FINISHED copies
    overlapping), orphaned (an object of no FINISHED copy) and left open (multipart)."""
    tip = topic_id_partition(kafka.log_dir, topic, 0)
    wanted = {(s.base_offset, s.end_offset) for s in segments}
    async with MetadataTopic(kafka.bootstrap_servers, f"__rlm_{topic}", scratch) as topic_log:

        def settled() -> bool:
            store = topic_log.store
            done = {(m.start_offset, m.end_offset) for m in topic_log.finished(tip)}
            return (
                wanted <= done
                and not store.unfinished_copies()
                and not (store.unfinished_deletes())
            )

        await topic_log.wait_until(
            settled, timeout=timeout, what="every segment FINISHED, no unfinished copy or delete"
        )
        await topic_log.read_to_end()
        finished = topic_log.finished(tip)
        stuck = [
            s
            for s in topic_log.final_states().values()
            if s
            not in (
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                RemoteLogSegmentState.DELETE_SEGMENT_FINISHED,
            )
        ]
        assert not stuck, stuck
    ranges = [(m.start_offset, m.end_offset) for m in finished]
    covered = {r for r in ranges}
    lost = sum(1 for s in segments if (s.base_offset, s.end_offset) not in covered)
    duplicates = len(ranges) - len(set(ranges))
    duplicates += sum(1 for a, b in itertools.pairwise(ranges) if b[0] <= a[1])
    keys = set(bucket_keys(s3, prefix))
    orphans = len(keys - expected_keys(prefix, finished))
    missing = expected_keys(prefix, finished) - keys
    assert not missing, f"FINISHED copies whose objects are gone: {sorted(missing)}"
    return Outcome(lost, duplicates, orphans, len(multipart_uploads(s3, prefix)))
