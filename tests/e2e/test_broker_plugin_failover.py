"""Broker-driven tiering across a leadership move: three brokers, each running the plugin
against its own sidecar (its own socket, state dir and log dir), one bucket prefix.

The leader's RLM copies through its sidecar; the leader is stopped mid-stream; the new leader's
RLM continues from the last FINISHED copy it reads (Kafka's ``findHighestRemoteOffset``), through
its own sidecar, and a consumer from offset 0 reads every offset exactly once through the new
leader, the old leader's copies included."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.metadata.events import RemoteLogSegmentState, SegmentMetadata
from sidecar.storage.keys import KeyLayout
from tests.conftest import stack
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    leaders,
    topic_id_partition,
    write_config,
)
from tests.e2e.test_broker_plugin import (
    METADATA_TOPIC,
    TOPIC_CONFIGS,
    _active_base,
    _consume,
    _local_start,
    _produce_values,
    plugin_jar,
)
from tests.helpers import create_topic
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e


@dataclasses.dataclass
class _PerNodeSocketCluster(stack.KafkaCluster):  # type: ignore[name-defined,misc]
    """The stack's cluster, with each node's plugin pointed at its own sidecar's socket."""

    sockets: dict[int, Path] = dataclasses.field(default_factory=dict)

    def _properties(self, node: Any) -> str:
        # a later key wins in a Java properties file
        return super()._properties(node) + f"rsm.config.socket.path={self.sockets[node.node_id]}\n"


@dataclass
class PluggedCluster:
    cluster: Any
    sidecars: dict[int, Sidecar]
    prefix: str


@pytest.fixture
async def plugged3(
    s3: Any, s3_prefix: str, stack_root: Path, tmp_path: Path
) -> AsyncIterator[PluggedCluster]:
    """Three brokers with the plugin, each beside its own sidecar; one bucket prefix."""
    jar = plugin_jar()
    states = {i: Path(tempfile.mkdtemp(prefix=f"rsm{i}-", dir="/tmp")) for i in (1, 2, 3)}
    cluster = _PerNodeSocketCluster.create(stack_root / f"kafka3-{states[1].name}", nodes=3)
    configs = {}
    for node in cluster.nodes:
        configs[node.node_id] = write_config(
            tmp_path / f"sidecar-{node.node_id}.toml",
            state_dir=states[node.node_id],
            log_dir=node.log_dir,
            bootstrap=cluster.bootstrap_servers,
            s3=s3,
            metrics_port=stack.free_port(),
            metadata_topic=METADATA_TOPIC,
            include_topics=[],
            prefix=s3_prefix,
            metadata_replication=3,
        )
        printed = subprocess.run(
            [
                *(sys.executable, "-m", "sidecar", "broker-config"),
                *("-c", str(configs[node.node_id]), "--plugin-jar", str(jar)),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        props = dict(
            line.split("=", 1) for line in printed.splitlines() if line and not line.startswith("#")
        )
        cluster.sockets[node.node_id] = Path(props.pop("rsm.config.socket.path"))
        cluster.overrides.update(props)
    cluster.overrides["remote.log.manager.task.interval.ms"] = "1000"
    cluster.start(timeout=180.0)
    env = sidecar_env(s3)
    sidecars: dict[int, Sidecar] = {}
    try:
        for node_id, config in configs.items():
            sidecars[node_id] = await Sidecar.start(
                config, env, tmp_path / f"sidecar-{node_id}.log", name=f"sidecar-{node_id}"
            )
        for sidecar in sidecars.values():
            await sidecar.wait_for("read_server_listening", timeout=90)
        yield PluggedCluster(cluster, sidecars, s3_prefix)
    finally:
        for sidecar in sidecars.values():
            await sidecar.stop()
        cluster.stop()
        for state in states.values():
            shutil.rmtree(state, ignore_errors=True)


async def test_leadership_move_continues_without_gap_or_second_upload(
    plugged3: PluggedCluster, s3: Any, topic_name: str, tmp_path: Path
) -> None:
    """The leader is stopped mid-stream: the new leader's broker and sidecar continue from the
    old leader's last FINISHED copy (no gap; no range copied twice but the one segment Kafka's
    handover race can make both leaders copy), and a consumer from offset 0 reads every offset
    exactly once through the new leader."""
    cluster, sidecars = plugged3.cluster, plugged3.sidecars
    bootstrap = cluster.bootstrap_servers
    await create_topic(bootstrap, topic_name, replication=3, configs=TOPIC_CONFIGS)
    old = (await leaders(bootstrap, topic_name))[0]
    old_dir = cluster.node(old).log_dir / f"{topic_name}-0"
    # the broker creates the partition's dir when it applies the topic's metadata, which may be
    # after the topic shows in Metadata responses
    await _until(lambda: (old_dir / "partition.metadata").exists(), timeout=60)
    tip = topic_id_partition(cluster.node(old).log_dir, topic_name, 0)
    sent = await _produce_values(bootstrap, topic_name, range(4000))
    async with MetadataTopic(bootstrap, METADATA_TOPIC, tmp_path / "metadata") as metadata:
        await metadata.wait_until(
            lambda: len(metadata.finished(tip)) >= 4, timeout=300, what="the old leader's copies"
        )
        # mid-stream: the leader goes away while records keep coming
        cluster.stop_node(old)
        survivors = ",".join(
            f"{stack.LOOPBACK}:{n.port}" for n in cluster.nodes if n.node_id != old
        )

        new = (await leaders(survivors, topic_name, avoid={old}, timeout=120))[0]
        sent += await _produce_values(survivors, topic_name, range(4000, 8000))
        new_dir = cluster.node(new).log_dir / f"{topic_name}-0"

        def done() -> bool:
            finished = metadata.finished(tip)
            active = _active_base(new_dir)
            return (
                bool(finished)
                and finished[-1].end_offset + 1 == active
                and _local_start(new_dir) == active
            )

        await metadata.wait_until(done, timeout=300, what="the new leader's copies")
        await metadata.read_to_end()
        finished = metadata.finished(tip)
        copies = metadata.copies(tip)
        started = [
            e
            for e in metadata.events
            if isinstance(e, SegmentMetadata)
            and e.topic_id_partition == tip
            and e.state is RemoteLogSegmentState.COPY_SEGMENT_STARTED
        ]
    by_broker = Counter(m.broker_id for m in finished)
    assert by_broker[old] >= 4, by_broker
    assert by_broker[new] >= 2, by_broker
    # Kafka's race at the handover: the old leader's copy in flight may write FINISHED after
    # the new leader computed where to continue (once, when it became leader), and then both
    # copy that one segment. Only that: at most one range twice, one copy from each leader.
    starts = Counter(m.start_offset for m in finished)
    twice = [m for m in finished if starts[m.start_offset] == 2]
    assert max(starts.values()) <= 2, starts
    assert len(twice) in (0, 2), twice
    assert {m.broker_id for m in twice} in (set(), {old, new})
    ranges = sorted({(m.start_offset, m.end_offset) for m in finished})
    # contiguous from 0, no other range copied twice, one attempt per copy
    assert ranges[0][0] == 0
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges)), ranges
    # the old leader may have written COPY_SEGMENT_STARTED for its next segment as it shut
    # down: Kafka leaves that record to remote retention. It never reached the bucket (the
    # keys below), and it is the only copy without FINISHED.
    dangling = [c for c in copies if c.state is not RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
    assert [(c.state, c.broker_id) for c in dangling] in (
        [],
        [(RemoteLogSegmentState.COPY_SEGMENT_STARTED, old)],
    )
    assert len(started) == len(finished) + len(dangling)
    print(
        f"\nleadership move {old} -> {new}: copies by broker {dict(by_broker)},"
        f" copied by both at the handover: {sorted({m.start_offset for m in twice})},"
        f" left STARTED by the old leader: {[c.start_offset for c in dangling]}"
    )
    layout = KeyLayout(prefix=plugged3.prefix)
    logs = [k for k in bucket_keys(s3, plugged3.prefix) if k.endswith(".log")]
    keyed = Counter(p.segment_id for k in logs if (p := layout.parse(k)) is not None)
    # every FINISHED copy once; besides, at most the dangling copy's objects (the old
    # sidecar finished an upload its broker gave up on: they go with its remote retention)
    dangling_ids = {c.segment_id.id for c in dangling}
    assert {m.segment_id.id for m in finished} <= set(keyed)
    assert set(keyed) - {m.segment_id.id for m in finished} <= dangling_ids
    assert set(keyed.values()) == {1}
    # each sidecar uploaded its own broker's copies
    for node_id, sidecar in sidecars.items():
        mine = {str(m.segment_id.id) for m in finished if m.broker_id == node_id}
        uploaded = {e["segment_id"] for e in sidecar.matching("broker_copy_finished")}
        assert mine <= uploaded
        assert uploaded - mine <= {str(i) for i in dangling_ids}

    # through the new leader, from offset 0 (the old leader's copies are remote only there)
    assert _local_start(new_dir) > max(m.end_offset for m in finished if m.broker_id == old)
    got = await _consume(survivors, topic_name, "read_uncommitted", len(sent))
    assert [(k, v) for k, v, _ in got] == sent
    assert old_dir.exists()  # the old leader's log dir was left alone


async def _until(condition: Callable[[], bool], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.1)
