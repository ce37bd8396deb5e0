"""The engine's per-partition state (workers, backoffs, errors, hand-over times, repairs, foreign
copies waited for) and its copy-lag series follow the partitions present now: a partition that
leaves the log dir or is led by another broker is forgotten once its worker ended."""

from __future__ import annotations

import dataclasses
import uuid

from sidecar.observability.metrics import Metrics
from tests.unit.tiering.test_engine import OTHER, TOPIC, Rig


def _lag(metrics: Metrics) -> float | None:
    name = "kafka_tiered_sidecar_copy_lag_segments"
    return metrics.registry.get_sample_value(name, {"topic": TOPIC})


def _state(r: Rig) -> dict[str, object]:
    e = r.engine
    return {
        "workers": dict(e._workers),
        "repaired": set(e._repaired),
        "led_since": dict(e._led_since),
        "waiting_for": dict(e._waiting_for),
        "last_errors": dict(e.last_errors),
    }


async def _tiered_with_state(r: Rig) -> None:
    r.start()
    await r.until(r.all_tiered)
    await r.until(lambda: _lag(r.metrics) == 0)
    key = (TOPIC, 0)
    await r.until(lambda: key in r.engine._workers and r.engine._workers[key].task.done())
    assert key in r.engine._repaired
    assert key in r.engine._led_since
    # what a failure and a foreign copy waited for leave behind
    r.engine.last_errors[key] = (0.0, "StorageError: S3 down")
    r.engine._waiting_for[uuid.uuid4()] = (key, 0.0)


async def test_a_partition_gone_from_the_log_dir_is_forgotten(rig):
    r = rig(lag_interval_s=0.01)
    await _tiered_with_state(r)
    r.engine._views = dict  # the topic was deleted: its dir is gone
    r.engine.poke()
    await r.until(lambda: not r.engine._workers)
    await r.until(lambda: _lag(r.metrics) is None)
    assert _state(r) == {
        "workers": {},
        "repaired": set(),
        "led_since": {},
        "waiting_for": {},
        "last_errors": {},
    }
    await r.stop()


async def test_a_partition_led_elsewhere_is_forgotten(rig):
    r = rig(lag_interval_s=0.01)
    await _tiered_with_state(r)
    r.cluster.set_leader(OTHER)
    r.engine.poke()
    await r.until(lambda: not r.engine._workers)
    assert not r.engine._waiting_for
    assert not r.engine.last_errors
    await r.stop()


async def test_a_stale_view_keeps_backoffs(rig):
    """A stale cluster view says nothing about who leads: failure state survives it."""
    r = rig(lag_interval_s=0.01)
    await _tiered_with_state(r)
    r.cluster.view = dataclasses.replace(r.cluster.view, refreshed_at=0.0)  # long ago
    before = r.engine.last_errors.copy()
    r.engine.poke()
    await r.until(lambda: not r.engine._led_since)  # a reconcile saw the stale view
    assert r.engine.last_errors == before
    assert (TOPIC, 0) in r.engine._workers
    await r.stop()
