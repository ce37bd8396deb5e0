"""Remote retention under S3 faults: while every DeleteObjects fails, the retention passes
report errors and delete nothing they should keep (every object of a FINISHED copy stays);
the deletes they started are left DELETE_SEGMENT_STARTED; once the fault is gone the same
deletes resume and finish, and the bucket holds exactly the FINISHED copies' objects."""

from __future__ import annotations

import pytest

from sidecar.metadata.events import RemoteLogSegmentState
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    clean_prefix,
    delete_topic,
    expected_keys,
    topic_id_partition,
)
from tests.faults._harness import FaultProxy
from tests.faults._scenario import backlog_topic, sidecar_config, wait_all_tiered
from tests.sidecar_runner import sidecar_env

pytestmark = [pytest.mark.faults, pytest.mark.e2e]

DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


async def test_retention_under_failing_deletes_keeps_what_it_must_and_resumes(
    kafka, s3, s3_proxied, fault_proxy: FaultProxy, topic_name, s3_prefix, tmp_path
):
    bootstrap = kafka.bootstrap_servers
    segments = await backlog_topic(kafka, topic_name, records=4700)
    assert len(segments) >= 4
    fault_proxy.set({"fault": "internal_error", "op": "DeleteObjects", "count": None})
    run = sidecar_config(
        tmp_path, kafka, s3_proxied, topic_name, s3_prefix,
        retention={"interval_s": 1.0, "scrub_enabled": False},
    )  # fmt: skip
    # remote retention of 2 MiB per partition: the oldest copies go
    run.config.write_text(
        run.config.read_text()
        + f'[[retention.overrides]]\ntopics = ["{topic_name}"]\nretention_bytes = 2097152\n'
    )
    sidecar = await Sidecar.start(run.config, sidecar_env(s3), tmp_path / "sidecar.log")
    tip = topic_id_partition(kafka.log_dir, topic_name, 0)
    try:
        await wait_all_tiered([sidecar], segments, timeout=120)
        await sidecar.wait_until(
            lambda: any(e.get("errors", 0) > 0 for e in sidecar.matching("retention_pass")),
            timeout=60,
            what="a retention pass with errors",
        )
        async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m1") as topic_log:
            await topic_log.wait_until(
                lambda: DELETE_STARTED in topic_log.final_states().values(),
                timeout=60,
                what="a delete started",
            )
            await topic_log.read_to_end()
            finished = topic_log.finished(tip)
            states = topic_log.final_states()
        assert DELETE_FINISHED not in states.values()  # no delete could finish
        keys = set(bucket_keys(s3, s3_prefix))
        assert expected_keys(s3_prefix, finished) <= keys  # nothing referenced deleted
        assert fault_proxy.stats()["injected"]["internal_error"] >= 1

        fault_proxy.clear()
        async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m2") as topic_log:
            await topic_log.wait_until(
                lambda: (
                    DELETE_FINISHED in topic_log.final_states().values()
                    and not topic_log.store.unfinished_deletes()
                ),
                timeout=60,
                what="the interrupted deletes finished",
            )
            await topic_log.read_to_end()
            finished = topic_log.finished(tip)
            states = topic_log.final_states()
        assert DELETE_STARTED not in states.values()
        assert finished, "retention of 2 MiB keeps the newest copies"
        assert set(bucket_keys(s3, s3_prefix)) == expected_keys(s3_prefix, finished)
        assert not sidecar.exited
        assert await sidecar.stop() == 0
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        clean_prefix(s3, s3_prefix)
        await delete_topic(bootstrap, topic_name)
