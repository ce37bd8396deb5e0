"""`sidecar metadata decode --hex`, the status document and its table renderer."""

from __future__ import annotations

import io
import json
import time
import uuid
from pathlib import Path

from sidecar.cli import main, render_status_header
from sidecar.kafka.logdir import scan_partition_dir
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.metadata_cli import decode_command
from sidecar.status import partition_status, render_status
from sidecar.testing import write_partition
from sidecar.tiering.cluster import ClusterView
from tests.unit.readserver._tiered import data_batches

VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "metadata-vectors.json").read_text()
)["recordVectors"]


class TestMetadataDecode:
    def test_every_vector_decodes_to_json(self):
        """Each vector becomes one JSON object with state names and base64 ids."""
        out = io.StringIO()
        status = decode_command(
            hex_values=[v["expectedHex"] for v in VECTORS],
            config=None,
            topic="t",
            max_messages=None,
            out=out,
        )
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert status == 0
        assert len(lines) == len(VECTORS)
        assert lines[0]["state"] == "COPY_SEGMENT_STARTED"
        assert lines[0]["topic_id"] == "ASNFZ4mrze_-3LqYdlQyEA"
        assert all("error" not in line for line in lines)

    def test_garbage_is_reported_not_raised(self, capsys):
        """Undecodable or non-hex input prints an error object and exits 1."""
        assert main(["metadata", "decode", "--hex", "01ff", "--hex", "xyz"]) == 1
        captured = capsys.readouterr()
        assert captured.err == (
            'sidecar: error: 2 of 2 values did not decode (their lines carry "error")\n'
        )
        lines = [json.loads(line) for line in captured.out.splitlines()]
        assert lines[0]["value_hex"] == "01ff"
        assert "error" in lines[0]
        assert lines[1]["error"] == "not hex"


class TestRenderStatus:
    def test_table_shows_lag_and_errors(self):
        """The table lists selected partitions with lag and the last error."""
        row = {
            "topic": "orders",
            "partition": 3,
            "selected": True,
            "mode": "broker-driven",
            "leader": True,
            "local_segments": 5,
            "tiered_segments": 3,
            "remote_start_offset": 0,
            "remote_end_offset": 299,
            "lag_segments": 1,
            "lag_bytes": 1024,
            "lag_seconds": 2.5,
            "quarantined": [],
            "last_error": {"at": 0, "message": "StorageError: boom"},
        }
        text = render_status([row, {**row, "partition": 4, "selected": False, "mode": None}])
        assert "MODE" in text.splitlines()[0]
        assert "orders-3" in text
        assert text.splitlines()[1].split()[:3] == ["orders-3", "broker-driven", "yes"]
        assert "0..299" in text
        assert "StorageError: boom" in text
        assert "orders-4" not in text
        assert "orders-4" in render_status(
            [{**row, "partition": 4, "selected": False}], all_partitions=True
        )


class TestStatusHeader:
    def _document(self, mode: str | None, last: float | None) -> dict[str, object]:
        return {
            "broker_id": 1,
            "ready": True,
            "checks": {"kafka": True},
            "failing": {},
            "broker_plugin": {"last_request_at": last},
            "partitions": [{"topic": "orders", "partition": 0, "mode": mode}],
        }

    def test_a_broker_that_never_called_the_plugin_is_named(self):
        """Broker-driven partitions and no plugin request yet: the second line says so and
        what to check."""
        header = render_status_header(self._document("broker-driven", None))
        first, second = header.splitlines()
        assert first == "broker 1  ready  kafka ok"
        assert second.startswith("broker plugin: no request since the sidecar started")
        assert "sidecar broker-config" in second

    def test_the_plugins_last_request_is_shown_only_with_broker_driven_partitions(self):
        header = render_status_header(self._document("copy-disabled", time.time() - 42))
        second = header.splitlines()[1]
        assert second.startswith("broker plugin: last request ")
        assert second.endswith(" s ago")
        assert int(second.split()[-3]) >= 42  # when the test asked, plus what passed since
        assert "\n" not in render_status_header(self._document("standalone", None))

    def test_a_broker_with_another_remote_storage_manager_is_named(self):
        """The broker's own configs name another class (or none): the second line says which,
        rather than the time since the plugin's last request."""
        document = self._document("broker-driven", None)
        document["broker_plugin"] = {
            "last_request_at": None,
            "loaded_by_broker": False,
            "broker_rsm_class": "org.example.OtherRsm",
        }
        second = render_status_header(document).splitlines()[1]
        assert second.startswith(
            "broker plugin: not loaded (the broker loads org.example.OtherRsm;"
        )
        document["broker_plugin"] = {**document["broker_plugin"], "broker_rsm_class": None}
        second = render_status_header(document).splitlines()[1]
        assert "the broker has no RemoteStorageManager" in second
        document["broker_plugin"] = {"last_request_at": None, "loaded_by_broker": True}
        second = render_status_header(document).splitlines()[1]
        assert second.startswith("broker plugin: no request since the sidecar started;")
        assert "the broker loads it" in second
        assert "sidecar broker-config" not in second  # nothing to add to the broker


class TestPartitionStatus:
    def test_copy_lag_is_null_where_nothing_copies(self, tmp_path: Path):
        """A standalone or broker-driven partition's rolled segments are its copy lag; a
        copy-disabled or untiered one has none (null), and the table shows a dash."""
        topic_id = uuid.uuid4()
        segments = [data_batches(0, 2), data_batches(10, 2), data_batches(20, 2)]
        views = {}
        for topic in ("a", "b", "c", "d"):
            path = write_partition(tmp_path / "logs", topic, 0, segments, topic_id=topic_id)
            scan = scan_partition_dir(path)
            assert scan is not None
            views[path] = scan
        modes = {"a": "standalone", "b": "broker-driven", "c": "copy-disabled", "d": None}
        cluster = ClusterView(
            broker_id=1,
            leaders={(t, 0): 1 for t in modes},
            configs={},
            last_stable_offsets={(t, 0): 1_000 for t in modes},
            refreshed_at=time.monotonic(),
            stale_after_s=60,
        )
        store = RemoteSegmentStore(tmp_path / "state")
        try:
            rows = partition_status(
                views=views,
                cluster=cluster,
                store=store,
                mode=modes.get,
                last_errors={},
                quarantined=lambda _id, _p: [],
            )
        finally:
            store.close()
        lags = {r["topic"]: (r["lag_segments"], r["lag_bytes"] is None) for r in rows}
        assert lags == {"a": (2, False), "b": (2, False), "c": (None, True), "d": (None, True)}
        assert rows[2]["lag_seconds"] is None
        lines = render_status(rows, all_partitions=True).splitlines()
        assert lines[3].split()[:2] == ["c-0", "copy-disabled"]
        assert lines[3].split()[-3:] == ["-", "-", "-"]
        assert lines[1].split()[-3:-1] == ["2", str(rows[0]["lag_bytes"])]
