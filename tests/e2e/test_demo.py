"""The README's demo command works: it starts its own stack, runs the sidecar, exits 0."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

DEMO = Path(__file__).resolve().parents[2] / "deploy" / "local" / "demo.py"


def test_demo_runs_and_exits_zero(tmp_path):
    """`make demo`'s script exits 0 and shows the partitions and segments the sidecar sees."""
    result = subprocess.run(
        [sys.executable, str(DEMO), "--root", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = result.stdout
    assert "sees 3 partitions of 'demo.orders'" in out
    assert "kafka_tiered_sidecar_partitions_watched" in out
    assert "every tiered .log object is byte-identical to the broker's file" in out
    assert 'kafka_tiered_sidecar_segments_copied_total{topic="demo.orders"}' in out
    assert "3 tiered records read back from S3 through the read socket" in out
    # broker-driven: the broker tiers through the plugin and reads back from offset 0
    assert "rsm.config.socket.path=" in out
    # the broker started with them, as `sidecar broker-config --check` finds
    assert re.search(r"broker \d+: (\d+) of \1 properties as `sidecar broker-config`", out)
    assert "Kafka's console consumer read all 4000 records of 'demo.tiered' from offset 0" in out
    assert "sidecar stopped cleanly (exit 0)" in out
    assert "stack stopped" in out
    # the stack was stopped by PID: nothing it started is still running
    pids = [p for p in (tmp_path / "demo").rglob("*.pid")]
    assert pids == []
