"""The remote log metadata topic deleted and re-created under the same name while the sidecar
was down: its offsets start again, so the store's consumed offsets would skip the new topic's
first events. On the real broker the sidecar records the topic's id at its first start and,
started again against the re-created topic, refuses with the way out instead of reading on."""

from __future__ import annotations

import pytest

from tests.e2e._support import delete_topic, write_config
from tests.helpers import create_topic
from tests.sidecar_runner import Sidecar, sidecar_env

pytestmark = pytest.mark.e2e


async def test_a_store_of_a_recreated_metadata_topic_is_refused(
    kafka, s3, topic_name, s3_prefix, tmp_path
):
    bootstrap = kafka.bootstrap_servers
    metadata_topic = f"__rlm_{topic_name}"
    await create_topic(bootstrap, topic_name, partitions=1)
    config = write_config(
        tmp_path / "sidecar.toml",
        state_dir=tmp_path / "state",
        log_dir=kafka.log_dir,
        bootstrap=bootstrap,
        s3=s3,
        metrics_port=0,
        metadata_topic=metadata_topic,
        include_topics=[topic_name],
        prefix=s3_prefix,
    )
    first = await Sidecar.start(config, sidecar_env(s3), tmp_path / "first.log", name="first")
    try:
        await first.wait_for("sidecar_ready", timeout=180)
    finally:
        assert await first.stop() == 0, first.tail()
    await delete_topic(bootstrap, metadata_topic)
    await create_topic(bootstrap, metadata_topic, partitions=5)

    second = await Sidecar.start(config, sidecar_env(s3), tmp_path / "second.log", name="second")
    code = await second.wait_exit(timeout=180)
    assert code != 0, second.tail()
    refusal = "".join(second.raw)
    assert "deleted and re-created" in refusal, second.tail()
    assert "remove the store to rebuild it" in refusal, second.tail()
    assert not second.matching("sidecar_ready")
