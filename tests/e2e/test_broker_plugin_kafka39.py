"""The broker plugin on Kafka 3.9: the plugin is compiled against Kafka 4's storage API and must
load and work on a 3.9 broker, configured by the same `sidecar broker-config` output.

Kafka 3.9 lacks `RetriableRemoteStorageException` and `RemoteLogSegmentMetadata.isTxnIdxEmpty()`;
the plugin reaches both only through lookups (`KafkaCompat`), so no reference to them breaks
class loading or a copy there. The test runs the main broker-plugin scenario unchanged on a
single 3.9.1 KRaft node: consumers from offset 0 after local deletion read exactly what was
produced, in both isolation levels, and ListOffsets -2/-4 answer the remote and local starts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tests.e2e.test_broker_plugin as main_scenario
from tests.conftest import stack

pytestmark = pytest.mark.e2e

#: the newest 3.x release; its jars come from Maven Central like 4.x's (`stack.py fetch`)
KAFKA_39 = stack.KAFKA_39


@pytest.fixture
async def plugged39(
    s3: Any, s3_prefix: str, stack_root: Path, tmp_path: Path
) -> AsyncIterator[main_scenario.PluggedBroker]:
    """A one-node Kafka 3.9.1 KRaft broker tiering through the plugin, its properties appended
    from `sidecar broker-config` exactly as for 4.x, and the sidecar beside it."""
    async with main_scenario.plugged_broker(
        s3, s3_prefix, stack_root, tmp_path, version=KAFKA_39
    ) as broker:
        yield broker


async def test_kafka39_broker_reads_tiered_topic_from_offset_zero_after_local_deletion(
    plugged39: main_scenario.PluggedBroker, s3: Any, topic_name: str, tmp_path: Path
) -> None:
    """On a Kafka 3.9.1 broker, the main scenario holds unchanged: both isolation levels from
    offset 0 after local deletion, ListOffsets -2/-4, one object set per segment, deletion."""
    assert plugged39.cluster.version == KAFKA_39
    await main_scenario.test_broker_reads_tiered_topic_from_offset_zero_after_local_deletion(
        plugged39, s3, topic_name, tmp_path
    )
    # the broker logged no class-loading or linkage error from the plugin
    server_log = plugged39.cluster.nodes[0].log_file.read_text(errors="replace")
    for error in ("NoClassDefFoundError", "NoSuchMethodError", "VerifyError"):
        assert error not in server_log


async def test_kafka39_retries_copies_while_the_sidecar_is_down(
    plugged39: main_scenario.PluggedBroker, s3: Any, topic_name: str, tmp_path: Path
) -> None:
    """Without RetriableRemoteStorageException, the plugin's plain RemoteStorageException for an
    unreachable sidecar is retried by Kafka 3.9 too: no local deletion, and once the sidecar is
    back every record is read from offset 0."""
    await main_scenario.test_sidecar_down_is_retried_and_nothing_is_deleted_locally(
        plugged39, s3, topic_name, tmp_path
    )
