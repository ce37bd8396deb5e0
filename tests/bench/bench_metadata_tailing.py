"""Metadata read amplification: what each sidecar reads of the remote log metadata topic, with
every sidecar reading every metadata partition (``remote_log_metadata.tailing = "all"``) and
with selective tailing (each reads the metadata partitions of its broker's partitions, one
elected coordinator reads them all).

Computed, not measured on a cluster: clusters of 10, 100 and 1,000 brokers are laid out as
Kafka lays out topics (replicas round-robin from a random broker, replication factor 3), with
random topic ids, and each partition's metadata partition is computed with the sidecar's own
``metadata_partition`` (Kafka's partitioner). Every user partition is assumed to roll and
expire segments at the same rate, so a metadata partition carries events in proportion to the
user partitions hashed to it. Event sizes are those of the sidecar's serde for a typical
segment (one leader epoch, no custom metadata). The stores: every sidecar's held every live
segment of the cluster; reading by metadata partition alone would keep those of the metadata
partitions read; scoped reading (what the sidecar does) keeps its broker's partitions' only.

Run from the repository root: ``.venv/bin/python tests/bench/bench_metadata_tailing.py``
(``--replicas-per-broker``, ``--metadata-partitions``, ``--ingest-mb-s``, ``--segment-mib``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sidecar.metadata.events import (
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.serde import encode

RF = 3
PARTITIONS_PER_TOPIC = 30


def _event_bytes() -> float:
    """Mean record value size of a segment's four events (copy started and finished, delete
    started and finished), from the sidecar's serde."""
    tp = TopicIdPartition(uuid.uuid4(), "orders-events", 17)
    segment_id = RemoteLogSegmentId(tp, uuid.uuid4())
    started = SegmentMetadata(
        segment_id=segment_id,
        start_offset=123_456_789,
        end_offset=124_456_788,
        broker_id=7,
        max_timestamp_ms=1_764_000_000_000,
        event_timestamp_ms=1_764_000_000_000,
        segment_leader_epochs=((12, 123_456_789),),
        segment_size_in_bytes=1 << 30,
    )
    updates = [
        SegmentMetadataUpdate(
            segment_id=segment_id, broker_id=7, event_timestamp_ms=1_764_000_000_000, state=state
        )
        for state in (
            RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
            RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
            RemoteLogSegmentState.DELETE_SEGMENT_FINISHED,
        )
    ]
    sizes = [len(encode(started))] + [len(encode(u)) for u in updates]
    # a record in a batch adds ~8 bytes (length, attributes, deltas, null key, no headers)
    return statistics.fmean(sizes) + 8


def _layout(
    brokers: int, replicas_per_broker: int, metadata_partitions: int, rng: random.Random
) -> tuple[list[set[int]], list[int], int]:
    """Per broker: the metadata partitions of the partitions it hosts; per metadata partition:
    how many user partitions hash to it; and the number of user partitions."""
    user_partitions = brokers * replicas_per_broker // RF
    hosted: list[set[int]] = [set() for _ in range(brokers)]
    load = [0] * metadata_partitions
    made = 0
    while made < user_partitions:
        topic_id = uuid.UUID(int=rng.getrandbits(128))
        start = rng.randrange(brokers)
        for p in range(min(PARTITIONS_PER_TOPIC, user_partitions - made)):
            mp = metadata_partition(TopicIdPartition(topic_id, "t", p), metadata_partitions)
            load[mp] += 1
            for r in range(RF):
                hosted[(start + p + r) % brokers].add(mp)
        made += PARTITIONS_PER_TOPIC
    return hosted, load, user_partitions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--replicas-per-broker", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--metadata-partitions", type=int, nargs="+", default=[50, 500])
    parser.add_argument(
        "--ingest-mb-s", type=float, default=50.0, help="produce rate each broker leads, MB/s"
    )
    parser.add_argument("--segment-mib", type=float, default=1024.0, help="segment.bytes, MiB")
    parser.add_argument(
        "--remote-retention-days", type=float, default=7.0, help="how long segments stay tiered"
    )
    parser.add_argument("--seed", type=int, default=405)
    args = parser.parse_args(argv)

    event_bytes = _event_bytes()
    # each broker leads 1/RF of its replicas; each rolled segment makes 4 events over its life
    segments_per_s = args.ingest_mb_s * 1e6 / (args.segment_mib * 2**20)
    print(
        f"assumptions: each broker leads {args.ingest_mb_s:g} MB/s of produce, {args.segment_mib:g}"
        f" MiB segments, 4 events per segment ({event_bytes:.0f} bytes each on average, the"
        f" sidecar's serde), replication factor {RF}, topics of {PARTITIONS_PER_TOPIC} partitions"
    )
    live_per_broker = segments_per_s * args.remote_retention_days * 86400
    print(
        f"store and scrub: {args.remote_retention_days:g} days of remote retention, so"
        f" {live_per_broker:,.0f} live segments per broker's share of the cluster; a scrub"
        " lists 3 objects per segment, 1,000 keys per LIST request"
    )
    print(
        "    brokers  replicas/broker  metadata partitions | every sidecar reads all     |"
        " selective: other sidecars (mean / max)        | coordinator | whole cluster"
    )
    footprint: list[str] = []
    for metadata_partitions in args.metadata_partitions:
        for replicas in args.replicas_per_broker:
            for brokers in args.brokers:
                rng = random.Random(args.seed)
                hosted, load, users = _layout(brokers, replicas, metadata_partitions, rng)
                stream_events = brokers * segments_per_s * 4  # events/s of the whole topic
                stream_kb = stream_events * event_bytes / 1000

                def share(mps: set[int], load: list[int] = load, users: int = users) -> float:
                    return sum(load[mp] for mp in mps) / users

                shares = [share(h) for h in hosted]
                mean, worst = statistics.fmean(shares), max(shares)
                before_total = brokers * stream_kb
                after_total = (brokers - 1) * mean * stream_kb + stream_kb
                print(
                    f"    {brokers:7d}  {replicas:15d}  {metadata_partitions:19d} |"
                    f" {stream_kb:8.2f} KB/s (100 %)      |"
                    f" {mean * stream_kb:8.2f} KB/s ({mean:6.1%}) / {worst * stream_kb:8.2f}"
                    f" KB/s ({worst:6.1%}) | {stream_kb:8.2f} KB/s |"
                    f" {before_total / 1000:8.2f} -> {after_total / 1000:8.2f} MB/s"
                    f" ({after_total / before_total:.1%})"
                )
                live = brokers * live_per_broker
                lists = live * 3 / 1000
                # a store keeps only its broker's replicas' segments: replicas / user partitions
                own = live * replicas / users
                footprint.append(
                    f"    {brokers:7d}  {replicas:15d}  {metadata_partitions:19d} |"
                    f" {live:12,.0f} {mean * live:12,.0f} {own:10,.0f} |"
                    f" {brokers * lists:12,.0f} -> {lists:10,.0f}"
                )
    print(
        "\n    brokers  replicas/broker  metadata partitions |"
        " segments in each store: all, by metadata partition, by partition |"
        " scrub LIST requests per interval"
    )
    print("\n".join(footprint))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
