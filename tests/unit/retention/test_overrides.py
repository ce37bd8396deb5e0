"""Sidecar remote-retention overrides (``[[retention.overrides]]``) on a broker without KIP-405:
the broker's local retention moves the log start offset and truncates the leader-epoch cache,
which must not delete remote data of an overridden topic; a DeleteRecords (log start strictly
inside a local segment) still does. Expected sets are written out by hand per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config import load_config
from sidecar.errors import ConfigError
from sidecar.retention.policy import (
    DeleteReason,
    delete_records_offset,
    extended_lineage,
    plan_expiry,
)
from tests.unit.retention.test_policy import NOW, chosen, facts, seg


class TestConfig:
    def _load(self, tmp_path: Path, text: str):
        path = tmp_path / "sidecar.toml"
        path.write_text(text)
        return load_config(path, environ={}).retention

    def test_first_full_match_wins_and_unset_is_the_broker_value(self, tmp_path):
        retention = self._load(
            tmp_path,
            """
[[retention.overrides]]
topics = ["orders-.*", "audit"]
retention_ms = 7776000000

[[retention.overrides]]
topics = [".*"]
retention_bytes = -1
""",
        )
        orders = retention.override_for("orders-eu")
        assert orders is not None
        assert (orders.retention_ms, orders.retention_bytes) == (7_776_000_000, -2)
        other = retention.override_for("xorders-eu")  # full match, not search
        assert other is not None
        assert (other.retention_ms, other.retention_bytes) == (-2, -1)
        assert retention.override_for("audit") is orders

    def test_no_override_by_default(self, tmp_path):
        assert self._load(tmp_path, "").override_for("orders") is None

    def test_from_the_environment_as_json(self):
        config = load_config(
            None,
            environ={"SIDECAR_RETENTION__OVERRIDES": '[{"topics": ["a.*"], "retention_ms": -1}]'},
        )
        override = config.retention.override_for("abc")
        assert override is not None
        assert override.retention_ms == -1

    @pytest.mark.parametrize(
        "entry",
        [
            'topics = ["("]',  # not a regex
            "topics = []",
            'topics = ["a"]\nretention_ms = -3',
            'topics = ["a"]\nretention_days = 3',  # unknown key
        ],
    )
    def test_bad_entries_are_config_errors(self, tmp_path, entry):
        with pytest.raises(ConfigError, match="overrides"):
            self._load(tmp_path, f"[[retention.overrides]]\n{entry}\n")


class TestDeleteRecordsOffset:
    """Local retention leaves the log start on a base offset; DeleteRecords inside a segment."""

    @pytest.mark.parametrize(
        ("start", "bases", "expected"),
        [
            (300, [300, 400, 500], None),  # local retention deleted up to 300
            (350, [300, 400, 500], 350),  # DeleteRecords inside the first segment
            (520, [500], 520),  # inside the active (only) segment
            (400, [400], None),  # DeleteRecords exactly at a boundary: not told apart
            (250, [300, 400], None),  # listed after more was deleted: nothing to conclude
            (0, [], None),
        ],
    )
    def test_cases(self, start, bases, expected):
        assert delete_records_offset(start, bases) == expected


class TestExtendedLineage:
    def test_remote_epochs_come_before_the_truncated_local_cache(self):
        # the broker truncated its cache at its log start 5200: epoch 2 really began at 5000
        segments = [
            seg(0, 2999, epochs=((0, 0),)),
            seg(3000, 4999, epochs=((0, 3000), (1, 4000))),
            seg(5000, 5199, epochs=((2, 5000),)),
        ]
        assert extended_lineage([(2, 5200), (3, 7000)], segments) == [
            (0, 0),
            (1, 4000),
            (2, 5000),
            (3, 7000),
        ]

    def test_diverged_copies_cannot_reorder_it(self):
        # a copy says epoch 0 began at 50, after epoch 1 began (10): epoch 0 is left out
        segments = [seg(0, 99, epochs=((0, 50),)), seg(10, 20, epochs=((1, 10),))]
        assert extended_lineage([(2, 200)], segments) == [(1, 10), (2, 200)]

    def test_unfinished_copies_do_not_count(self):
        from sidecar.metadata.events import RemoteLogSegmentState

        segments = [seg(0, 99, state=RemoteLogSegmentState.COPY_SEGMENT_STARTED)]
        assert extended_lineage([(0, 100)], segments) == [(0, 100)]


class TestPlanWithOverride:
    def test_local_retention_moving_the_start_deletes_nothing(self):
        segments = [seg(0, 99), seg(100, 199), seg(200, 299)]
        moved = facts(log_start_offset=200, lineage=[(0, 200)])
        # without an override Kafka's rule applies: below the log start goes
        assert chosen(plan_expiry(segments, moved), segments) == [
            (0, DeleteReason.LOG_START_OFFSET),
            (1, DeleteReason.LOG_START_OFFSET),
        ]
        kept = facts(log_start_offset=200, lineage=[(0, 200)], override=True)
        assert plan_expiry(segments, kept).deletions == ()

    def test_delete_records_still_moves_the_remote_start(self):
        segments = [seg(0, 99), seg(100, 199), seg(200, 299)]
        plan = plan_expiry(
            segments,
            facts(
                log_start_offset=150,
                lineage=[(0, 150)],
                override=True,
                delete_records_offset=150,
            ),
        )
        assert chosen(plan, segments) == [(0, DeleteReason.LOG_START_OFFSET)]

    def test_older_epochs_are_not_unreferenced(self):
        segments = [seg(0, 99, epochs=((0, 0),)), seg(100, 199, epochs=((2, 100),))]
        truncated = facts(lineage=[(2, 250)], log_start_offset=250)
        assert chosen(plan_expiry(segments, truncated), segments) == [
            (0, DeleteReason.LINEAGE),
            (1, DeleteReason.LOG_START_OFFSET),
        ]
        override = facts(lineage=[(2, 250)], log_start_offset=250, override=True)
        assert plan_expiry(segments, override).deletions == ()

    def test_override_time_and_size_reach_below_the_local_log(self):
        segments = [
            seg(0, 99, epochs=((0, 0),), ts=NOW - 9000),
            seg(100, 199, epochs=((1, 100),), ts=NOW - 8000),
            seg(200, 299, epochs=((1, 200),), ts=NOW - 10),
        ]
        base = {"lineage": [(1, 250)], "log_start_offset": 250, "override": True}
        by_time = plan_expiry(segments, facts(retention_ms=5000, **base))
        assert chosen(by_time, segments) == [
            (0, DeleteReason.RETENTION_MS),
            (1, DeleteReason.RETENTION_MS),
        ]
        assert by_time.new_log_start_offset == 200
        # 300 remote + 50 local, 120 allowed: breach 230 covers two 100-byte segments
        by_size = plan_expiry(segments, facts(retention_bytes=120, only_local_bytes=50, **base))
        assert by_size.remote_bytes == 300
        assert chosen(by_size, segments) == [
            (0, DeleteReason.RETENTION_BYTES),
            (1, DeleteReason.RETENTION_BYTES),
        ]
