"""A corrupt segment in the broker's log dir (a flipped byte, written by the test before the
sidecar starts) is never uploaded: it is quarantined, reported, and skipped after a restart,
while the other partitions tier as usual."""

from __future__ import annotations

import json

import pytest

from sidecar.storage.keys import KeyLayout
from tests.conftest import stack
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    clean_prefix,
    delete_topic,
    end_offsets,
    metric_samples,
    partition_scan,
    rolled_below,
    sample,
    topic_id_partition,
    write_config,
)
from tests.helpers import create_topic, produce
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

PARTITIONS = 3


def _flip_byte(path, position: int) -> None:
    with path.open("r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


class TestCorruptSegment:
    """A segment whose batches fail their CRC is quarantined, never uploaded."""

    async def test_corrupt_segment_is_quarantined_and_others_tier(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """The corrupt segment gets segment_quarantined, the quarantine gauge and file, no
        metadata and no object; its partition stops there (in-order planning) while the other
        partitions tier every rolled segment; a restart does not retry it."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(
            bootstrap,
            topic_name,
            partitions=PARTITIONS,
            configs={"segment.bytes": "1048576", "segment.ms": "3600000"},
        )
        sidecar = None
        try:
            for partition in range(PARTITIONS):
                await produce(bootstrap, topic_name, count=3200, partition=partition)
            lsos = await end_offsets(bootstrap, topic_name, range(PARTITIONS))
            rolled = {
                p: rolled_below(partition_scan(kafka.log_dir, topic_name, p), lsos[p])
                for p in range(PARTITIONS)
            }
            assert all(len(segments) >= 2 for segments in rolled.values()), rolled
            bad = rolled[0][0]
            _flip_byte(bad.log_path, 200)  # inside the first batch's records: its CRC fails

            port = stack.free_port()
            config = write_config(
                tmp_path / "sidecar.toml",
                state_dir=tmp_path / "state",
                log_dir=kafka.log_dir,
                bootstrap=bootstrap,
                s3=s3,
                metrics_port=port,
                metadata_topic=f"__rlm_{topic_name}",
                include_topics=[topic_name],
                prefix=s3_prefix,
            )
            env = sidecar_env(s3)
            sidecar = await Sidecar.start(config, env, tmp_path / "sidecar-1.log")
            quarantined = await sidecar.wait_for(
                "segment_quarantined", topic=topic_name, partition=0
            )
            assert quarantined[0]["base_offset"] == bad.base_offset
            assert "corrupt" in quarantined[0]["error"]
            for partition in (1, 2):
                await sidecar.wait_for(
                    "segment_tiered",
                    count=len(rolled[partition]),
                    topic=topic_name,
                    partition=partition,
                )
            samples = await metric_samples(port)
            assert sample(samples, "kafka_tiered_sidecar_quarantined_segments") == 1
            assert (
                sample(
                    samples,
                    "kafka_tiered_sidecar_upload_errors_total",
                    kind="CorruptSegmentError",
                )
                >= 1
            )
            saved = json.loads((tmp_path / "state" / "quarantine.json").read_text())
            assert [(s["topic"], s["partition"], s["base_offset"]) for s in saved["segments"]] == [
                (topic_name, 0, bad.base_offset)
            ]
            assert await sidecar.stop() == 0

            # a restart keeps the quarantine: the segment is not read or retried again
            sidecar = await Sidecar.start(config, env, tmp_path / "sidecar-2.log")
            await sidecar.wait_for("sidecar_ready")
            samples = await metric_samples(port)
            assert sample(samples, "kafka_tiered_sidecar_quarantined_segments") == 1
            assert await sidecar.stop() == 0
            assert not sidecar.matching("segment_quarantined")
            assert not sidecar.matching("segment_upload_started", partition=0)

            async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m") as topic:
                await topic.read_to_end()
                tip0 = topic_id_partition(kafka.log_dir, topic_name, 0)
                assert topic.copies(tip0) == []  # nothing was even started for partition 0
                for partition in (1, 2):
                    tip = topic_id_partition(kafka.log_dir, topic_name, partition)
                    assert [(m.start_offset, m.end_offset) for m in topic.finished(tip)] == [
                        (s.base_offset, s.end_offset) for s in rolled[partition]
                    ]
            layout = KeyLayout(prefix=s3_prefix)
            parsed = [layout.parse(key) for key in bucket_keys(s3, s3_prefix)]
            assert parsed
            assert None not in parsed
            assert {p.partition for p in parsed if p is not None} == {1, 2}
        finally:
            if sidecar is not None and sidecar.proc.returncode is None:
                await sidecar.kill()
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)
