"""SIGTERM while a large segment is being uploaded: the daemon waits out its drain deadline,
cancels the upload (aborting the multipart upload and deleting the copy through
DELETE_SEGMENT_STARTED/FINISHED), exits 0 soon after, and the next start has nothing to repair
and tiers the segment once."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from aiokafka import AIOKafkaProducer

from sidecar.metadata.events import RemoteLogSegmentState
from tests.conftest import stack
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    clean_prefix,
    delete_topic,
    end_offsets,
    expected_keys,
    multipart_uploads,
    partition_scan,
    rolled_below,
    topic_id_partition,
    write_config,
)
from tests.helpers import create_topic, wait_for
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
DRAIN_TIMEOUT_S = 1.0


async def _produce_bytes(bootstrap: str, topic: str, total: int) -> None:
    """``total`` bytes of incompressible 100 KiB records to partition 0."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        size = 100 * 1024
        for i in range(total // size):
            await producer.send(topic, value=os.urandom(size), key=b"%d" % i, partition=0)
        await producer.flush()
    finally:
        await producer.stop()


class TestSigtermDuringUpload:
    """A SIGTERM past the drain deadline leaves nothing behind, and exits 0."""

    @pytest.mark.parametrize("pause", ["parts", "create"])
    async def test_sigterm_mid_upload_cleans_up_and_exits(
        self, kafka, s3, topic_name, s3_prefix, tmp_path, pause
    ):
        """With S3 paused mid-upload of a 64 MiB segment (while parts are sent, or as soon as
        the copy started, when CreateMultipartUpload may still be unanswered), SIGTERM exits 0
        after the drain deadline and the cleanup; the copy ends DELETE_SEGMENT_FINISHED, no
        object and no multipart upload remain, and the next start tiers the segment once with
        nothing to repair."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(
            bootstrap,
            topic_name,
            configs={"segment.bytes": str(64 * MIB), "segment.ms": "3600000"},
        )
        s3_pid = stack.read_pid(s3.pid_file)
        assert s3_pid is not None
        sidecar = None
        paused = False
        try:
            await _produce_bytes(bootstrap, topic_name, 70 * MIB)
            lso = (await end_offsets(bootstrap, topic_name, [0]))[0]
            rolled = rolled_below(partition_scan(kafka.log_dir, topic_name, 0), lso)
            assert len(rolled) == 1
            assert rolled[0].size > 60 * MIB
            metadata_topic = f"__rlm_{topic_name}"
            settings = {
                "state_dir": tmp_path / "state",
                "log_dir": kafka.log_dir,
                "bootstrap": bootstrap,
                "s3": s3,
                "metrics_port": stack.free_port(),
                "metadata_topic": metadata_topic,
                "include_topics": [topic_name],
                "prefix": s3_prefix,
            }
            config = write_config(
                tmp_path / "sidecar.toml",
                **settings,
                tiering={
                    "drain_timeout_s": DRAIN_TIMEOUT_S,
                    # the upload capped at 2 MiB/s stays open for about 30 s, so the poll
                    # below sees it and S3 is paused before it ends, however loaded the
                    # machine (uncapped, SeaweedFS took it in about a second)
                    "max_upload_bytes_per_second": 2 * MIB,
                },
            )
            env = sidecar_env(s3)
            sidecar = await Sidecar.start(config, env, tmp_path / "sidecar-1.log")
            started = await sidecar.wait_for("segment_upload_started", topic=topic_name)
            assert started[0]["bytes"] == rolled[0].size
            if pause == "parts":
                # S3 gives no event for it: poll until the multipart upload of the .log is open
                await asyncio.to_thread(
                    wait_for,
                    lambda: bool(multipart_uploads(s3, s3_prefix)),
                    timeout=60,
                    what="the multipart upload of the .log",
                )
            os.kill(s3_pid, signal.SIGSTOP)  # a slow S3: the upload cannot finish in time
            paused = True
            sigterm_at = time.monotonic()
            sidecar.proc.send_signal(signal.SIGTERM)
            await sidecar.wait_for("tiering_drain_deadline_passed", timeout=60)
            assert time.monotonic() - sigterm_at >= DRAIN_TIMEOUT_S
            os.kill(s3_pid, signal.SIGCONT)
            paused = False
            # it exits on its own (killed past the wait: not 0); that it did not finish the
            # upload instead is shown by the cancellation and the deleted copy below
            assert await sidecar.wait_exit(timeout=120) == 0
            assert sidecar.matching("segment_upload_failed", error_type="CancelledError")
            assert sidecar.matching("sidecar_stopped")
            assert not sidecar.matching("segment_cleanup_failed")
            assert not sidecar.matching("multipart_abort_failed")

            # the cancellation path left nothing: no object, no multipart upload, no open copy
            assert bucket_keys(s3, s3_prefix) == []
            assert multipart_uploads(s3, s3_prefix) == []
            tip = topic_id_partition(kafka.log_dir, topic_name, 0)
            async with MetadataTopic(bootstrap, metadata_topic, tmp_path / "m1") as topic:
                await topic.read_to_end()
                copies = topic.copies(tip)
            assert [c.state for c in copies] == [RemoteLogSegmentState.DELETE_SEGMENT_FINISHED]

            # the next start has nothing to repair and tiers the segment exactly once (uncapped)
            config = write_config(
                tmp_path / "sidecar.toml", **settings, tiering={"drain_timeout_s": DRAIN_TIMEOUT_S}
            )
            sidecar = await Sidecar.start(config, env, tmp_path / "sidecar-2.log")
            tiered = await sidecar.wait_for("segment_tiered", topic=topic_name, timeout=60)
            assert tiered[0]["base_offset"] == rolled[0].base_offset
            assert await sidecar.stop() == 0
            assert not sidecar.matching("repairing_unfinished_copy")
            assert not sidecar.matching("finishing_unfinished_delete")
            async with MetadataTopic(bootstrap, metadata_topic, tmp_path / "m2") as topic:
                await topic.read_to_end()
                finished = topic.finished(tip)
                assert topic.store.unfinished_copies() == []
                assert topic.store.unfinished_deletes() == []
            assert [(m.start_offset, m.end_offset) for m in finished] == [
                (rolled[0].base_offset, rolled[0].end_offset)
            ]
            assert set(bucket_keys(s3, s3_prefix)) == expected_keys(s3_prefix, finished)
            assert multipart_uploads(s3, s3_prefix) == []
        finally:
            if paused:
                os.kill(s3_pid, signal.SIGCONT)
            if sidecar is not None and sidecar.proc.returncode is None:
                await sidecar.kill()
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)
