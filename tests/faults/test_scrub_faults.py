"""The orphan scrub under S3 faults (``sidecar scrub`` through the fault proxy): planted
orphans (objects of segment ids no metadata holds, an open multipart upload) next to the
objects of FINISHED copies. A scrub whose deletes keep failing stops with a clear error and
deletes nothing referenced; a scrub whose listing is cut once is retried; the next scrub
without faults finishes the interrupted work, and a referenced object is never deleted."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sidecar.storage.keys import KeyLayout, ObjectSuffix
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    clean_prefix,
    delete_topic,
    expected_keys,
    multipart_uploads,
    topic_id_partition,
)
from tests.faults._harness import REPO, FaultProxy
from tests.faults._scenario import backlog_topic, sidecar_config, wait_all_tiered
from tests.sidecar_runner import sidecar_env

pytestmark = [pytest.mark.faults, pytest.mark.e2e]


def _scrub(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "scrub", "--execute", "--config", str(config), "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


async def test_scrub_under_s3_faults_never_deletes_a_referenced_object(
    kafka, s3, s3_proxied, fault_proxy: FaultProxy, topic_name, s3_prefix, tmp_path
):
    bootstrap = kafka.bootstrap_servers
    segments = await backlog_topic(kafka, topic_name)
    run = sidecar_config(
        tmp_path,
        kafka,
        s3_proxied,
        topic_name,
        s3_prefix,
        retention={"orphan_grace_s": 0.001, "multipart_grace_s": 0.001, "scrub_enabled": False},
    )
    env = sidecar_env(s3)
    sidecar = await Sidecar.start(run.config, env, tmp_path / "sidecar.log")
    try:
        await wait_all_tiered([sidecar], segments, timeout=120)
        assert await sidecar.stop() == 0
        tip = topic_id_partition(kafka.log_dir, topic_name, 0)
        async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m") as topic_log:
            await topic_log.read_to_end()
            referenced = expected_keys(s3_prefix, topic_log.finished(tip))
        assert set(bucket_keys(s3, s3_prefix)) == referenced
        layout = KeyLayout(prefix=s3_prefix)
        orphans = {
            layout.segment_key(
                topic=topic_name,
                topic_id=tip.topic_id,
                partition=0,
                base_offset=10_000 + n,
                segment_id=uuid.uuid4(),
                suffix=suffix,
            )
            for n in range(4)
            for suffix in ObjectSuffix
        }
        client = s3.client()
        try:
            for key in orphans:
                client.put_object(Bucket=s3.bucket, Key=key, Body=b"orphan")
            upload_key = next(k for k in sorted(orphans) if k.endswith(".log"))
            client.create_multipart_upload(Bucket=s3.bucket, Key=upload_key)
        finally:
            client.close()

        # every delete fails: the scrub stops, nothing referenced is touched
        fault_proxy.set({"fault": "internal_error", "op": "DeleteObjects", "count": None})
        failed = _scrub(run.config, env)
        assert failed.returncode != 0, failed.stdout
        assert "InternalError" in failed.stderr, failed.stderr[-2000:]
        assert fault_proxy.stats()["injected"]["internal_error"] >= 1
        left = set(bucket_keys(s3, s3_prefix))
        assert referenced <= left
        assert orphans <= left  # nothing was deleted: the interrupted work is all still there

        # the listing is cut once: retried, the scrub completes
        fault_proxy.set({"fault": "reset", "op": "ListObjects", "count": 1})
        done = _scrub(run.config, env)
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout)
        assert report["orphans"] == len(orphans), report
        assert fault_proxy.stats()["injected"]["reset"] == 1
        assert set(bucket_keys(s3, s3_prefix)) == referenced
        assert multipart_uploads(s3, s3_prefix) == []

        fault_proxy.clear()
        again = json.loads(_scrub(run.config, env).stdout)
        assert (again["orphans"], again["referenced"]) == (0, len(referenced)), again
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        clean_prefix(s3, s3_prefix)
        await delete_topic(bootstrap, topic_name)
