"""``sidecar quarantine list|clear`` on the state dir's file, and how ``sidecar status`` shows
quarantined segments."""

from __future__ import annotations

import json
import uuid

from sidecar.cli import main
from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.status import render_status
from sidecar.tiering.quarantine import Quarantine, QuarantineEntry

OLD, NEW = uuid.UUID(int=10), uuid.UUID(int=11)


def _entry(topic_id: uuid.UUID, base: int, partition: int = 0) -> QuarantineEntry:
    return QuarantineEntry(
        topic_id=topic_id,
        topic="orders",
        partition=partition,
        base_offset=base,
        end_offset=base + 9,
        size_bytes=4096,
        reason="record batch at offset 0 is corrupt",
        since_ms=1_700_000_000_000,
    )


def _state(tmp_path, *entries: QuarantineEntry) -> list[str]:
    q = Quarantine(tmp_path / "quarantine.json")
    for entry in entries:
        q.add(entry)
    return ["--set", f"state_dir={tmp_path}"]


class TestQuarantineList:
    def test_lists_every_entry(self, tmp_path, capsys):
        """The table shows partition, topic id, offsets, bytes and reason of each entry."""
        args = _state(tmp_path, _entry(OLD, 0), _entry(NEW, 100, partition=2))
        assert main(["quarantine", "list", *args]) == 0
        out = capsys.readouterr().out
        assert encode_kafka_uuid(OLD) in out
        assert "orders-2" in out
        assert "record batch at offset 0 is corrupt" in out

    def test_json(self, tmp_path, capsys):
        """--json prints the entries as the file holds them."""
        args = _state(tmp_path, _entry(OLD, 0))
        assert main(["quarantine", "list", "--json", *args]) == 0
        document = json.loads(capsys.readouterr().out)
        assert document["segments"] == [_entry(OLD, 0).to_json()]
        assert document["legacy_entries_ignored"] == 0
        assert document["damaged"] is False

    def test_empty(self, tmp_path, capsys):
        """No file: nothing quarantined, and listing creates no file."""
        assert main(["quarantine", "list", "--set", f"state_dir={tmp_path}"]) == 0
        assert "no quarantined segment" in capsys.readouterr().out
        assert list(tmp_path.iterdir()) == []

    def test_a_damaged_file_is_not_a_clean_listing(self, tmp_path, capsys):
        """A file that is not the quarantine's JSON, or has an unreadable entry, is named on
        stderr with exit 1 (the daemon reads it as empty), as text and with --json."""
        path = tmp_path / "quarantine.json"
        good = _entry(OLD, 0).to_json()
        partly = json.dumps({"segments": [good, {"topic_id": "zz"}]})
        for body in ("{not json", '{"segments": 3}', partly):
            path.write_text(body)
            assert main(["quarantine", "list", "--set", f"state_dir={tmp_path}"]) == 1
            captured = capsys.readouterr()
            last = captured.err.splitlines()[-1]  # after the warning the load logged
            assert last.startswith(f"sidecar: error: {path} is damaged"), captured.err
            assert main(["quarantine", "list", "--json", "--set", f"state_dir={tmp_path}"]) == 1
            document = json.loads(capsys.readouterr().out)
            assert document["damaged"] is True
        assert document["segments"] == [good]  # the readable entry is still listed
        assert path.read_text() == partly  # listing does not rewrite it


class TestQuarantineClear:
    def test_clear_one_segment(self, tmp_path, capsys):
        """--offset releases one segment; the others stay."""
        args = _state(tmp_path, _entry(OLD, 0), _entry(OLD, 10))
        argv = ["quarantine", "clear", "--topic", "orders", "--partition", "0"]
        assert main([*argv, "--offset", "10", *args]) == 0
        assert "cleared orders-0 segment 10" in capsys.readouterr().out
        assert Quarantine(tmp_path / "quarantine.json").offsets(OLD, 0) == {0}

    def test_clear_by_topic_id(self, tmp_path):
        """--topic-id releases only that incarnation of the topic."""
        args = _state(tmp_path, _entry(OLD, 0), _entry(NEW, 0))
        argv = ["quarantine", "clear", "--topic", "orders", "--partition", "0"]
        assert main([*argv, "--topic-id", encode_kafka_uuid(NEW), *args]) == 0
        q = Quarantine(tmp_path / "quarantine.json")
        assert (q.offsets(OLD, 0), q.offsets(NEW, 0)) == ({0}, frozenset())

    def test_nothing_matched_exits_1(self, tmp_path, capsys):
        """Clearing what is not quarantined says so and exits 1."""
        args = _state(tmp_path, _entry(OLD, 0))
        argv = ["quarantine", "clear", "--topic", "orders", "--partition", "1", *args]
        assert main(argv) == 1
        assert "no quarantined segment of orders-1" in capsys.readouterr().err

    def test_bad_topic_id_exits_2(self, tmp_path, capsys):
        """A topic id that is not Kafka's base64 form is a usage error."""
        argv = ["quarantine", "clear", "--topic", "orders", "--partition", "0"]
        assert main([*argv, "--topic-id", "nope!", "--set", f"state_dir={tmp_path}"]) == 2
        assert "--topic-id" in capsys.readouterr().err


class TestStatusText:
    def test_quarantined_segments_are_listed_with_their_clear_command(self):
        """The status table lists each quarantined segment and the command that clears it."""
        row = {
            "topic": "orders",
            "partition": 3,
            "selected": True,
            "leader": True,
            "local_segments": 5,
            "tiered_segments": 3,
            "remote_start_offset": 0,
            "remote_end_offset": 299,
            "lag_segments": 0,
            "lag_bytes": 0,
            "lag_seconds": 0.0,
            "quarantined": [100],
            "quarantined_segments": [
                {
                    "base_offset": 100,
                    "end_offset": 199,
                    "bytes": 4096,
                    "since_ms": 1_700_000_000_000,
                    "reason": "bad crc",
                    "local": True,
                }
            ],
            "last_error": None,
        }
        text = render_status([row])
        assert "QUARANTINED" in text
        assert "orders-3 segment 100..199 (4096 bytes, local only" in text
        assert "sidecar quarantine clear --topic orders --partition 3 --offset 100" in text
        assert "QUARANTINED" not in render_status([{**row, "quarantined_segments": []}])
        # the status command's own config arguments: the quarantine file is in its state_dir
        text = render_status([row], config_args=["-c", "/etc/my sidecar.toml"])
        assert (
            "sidecar quarantine clear -c '/etc/my sidecar.toml' --topic orders --partition 3"
            " --offset 100" in text
        )
