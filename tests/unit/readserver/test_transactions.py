"""read_committed on the read path (aborted transactions from the segments' transaction indexes,
Kafka's consumer filter, on raw and JSON responses, in the client and ``sidecar read``) and
ListOffsets' special timestamps, over fake tiered data."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs

from sidecar.kafka.checkpoints import format_partition_metadata
from sidecar.kafka.indexes import AbortedTxn
from sidecar.kafka.records import ControlRecordType, decode_batches, parse_batch_header
from sidecar.readserver import (
    AbortedTransaction,
    ChunkCache,
    CommittedFilter,
    IsolationLevel,
    OffsetOutOfRangeError,
    ReadClient,
    ReadServer,
    ReadService,
)
from sidecar.readserver._cli import read_command
from sidecar.readserver._txn import format_aborted, parse_aborted
from sidecar.readserver.routes import MAX_LISTED_ABORTS
from sidecar.testing import TestRecord, build_batch, build_control_batch
from tests.unit.readserver._tiered import BASE_TS, LAYOUT, TP, Remote, data_batches

BASE = "http://localhost"


def _txn(pid: int, first: int, count: int) -> bytes:
    records = [
        TestRecord(f"p{pid}".encode(), f"txn-{pid}-{first + i}".encode(), timestamp=BASE_TS + i)
        for i in range(count)
    ]
    return build_batch(
        records, producer_id=pid, producer_epoch=0, base_sequence=0, transactional=True
    )


def _plain(first: int, count: int) -> bytes:
    return data_batches(first, 1, per_batch=count, value_size=16)[0]


def _marker(kind: ControlRecordType, pid: int) -> bytes:
    return build_control_batch(kind, producer_id=pid, timestamp=BASE_TS + 50)


async def _interleaved(remote: Remote) -> tuple[set[int], set[int]]:
    """Three segments, producers 1 and 3 abort, 2 commits; producer 1's transaction spans two
    segments and its marker sits in the second, producer 3's marker in the third. Returns the
    data offsets a read_committed and a read_uncommitted consumer read."""
    # segment 1: 0-4 plain, 5-6 pid 1, 7-8 pid 2, 9-13 plain
    await remote.upload(0, [_plain(0, 5), _txn(1, 5, 2), _txn(2, 7, 2), _plain(9, 5)])
    # segment 2: 14 pid 1, 15 ABORT 1 (pid 2 still open: LSO 7), 16 pid 2, 17 COMMIT 2,
    # 18-19 pid 3
    await remote.upload(
        14,
        [
            _txn(1, 14, 1),
            _marker(ControlRecordType.ABORT, 1),
            _txn(2, 16, 1),
            _marker(ControlRecordType.COMMIT, 2),
            _txn(3, 18, 2),
        ],
        aborted=[AbortedTxn(0, 1, 5, 15, 7)],
    )
    # segment 3: 20 ABORT 3 (nothing open: LSO 21), 21-25 plain
    await remote.upload(
        20,
        [_marker(ControlRecordType.ABORT, 3), _plain(21, 5)],
        aborted=[AbortedTxn(0, 3, 18, 20, 21)],
    )
    uncommitted = set(range(15)) | {16, 18, 19} | set(range(21, 26))
    committed = set(range(5)) | {7, 8} | set(range(9, 14)) | {16} | set(range(21, 26))
    return committed, uncommitted


async def _committed_offsets(service: ReadService, offset: int, max_bytes: int) -> list[int]:
    """Data offsets of one read_committed response, filtered as a consumer filters it."""
    aborted, limit = await service.aborted_transactions(TP, offset, max_bytes)
    stream = await service.batches(TP, offset, max_bytes, limit_offset=limit)
    keep = CommittedFilter(aborted)
    found = []
    async for batch in stream:
        data = batch.tobytes()
        for header, records in decode_batches(data):
            control = records[0].control_type if header.is_control else None
            if keep.accept(header, control):
                found += [r.offset for r in records if r.offset >= offset]
    return found


def _local_log(logs: Path, base: int, aborted: AbortedTxn | None = None, tail: bytes = b"") -> None:
    """The broker's local copy of TP under ``logs``: one (empty) segment at ``base``, with a
    .txnindex holding ``aborted`` (and ``tail``, e.g. a partial entry being appended)."""
    partition = logs / f"{TP.topic}-{TP.partition}"
    partition.mkdir(parents=True)
    (partition / "partition.metadata").write_bytes(format_partition_metadata(TP.topic_id))
    (partition / f"{base:020d}.log").write_bytes(b"")
    if aborted is not None:
        entry = b"".join(f.to_bytes(8 if i else 2, "big") for i, f in enumerate(aborted))[:34]
        (partition / f"{base:020d}.txnindex").write_bytes(entry + tail)


async def _aborted_with_local(remote, chunks, logs: tuple[Path, ...], offset: int = 0):
    """``aborted_transactions(TP, offset)`` of a read service over ``logs``."""
    service = ReadService(
        store=remote.store, objects=remote.objects, layout=LAYOUT, chunks=chunks,
        log_dirs=logs, lineage_ttl_s=0,
    )  # fmt: skip
    try:
        return await service.aborted_transactions(TP, offset, 1 << 20)
    finally:
        await service.aclose()


class TestCommittedFilter:
    """Kafka's consumer loop over batches and an aborted-transaction list."""

    def test_header_round_trip(self) -> None:
        """The header lists pairs by first offset, without duplicates, and parses back."""
        aborted = [AbortedTransaction(9, 40), AbortedTransaction(1, 5), AbortedTransaction(9, 40)]
        text = format_aborted(aborted)
        assert text == "1:5,9:40"
        assert parse_aborted(text) == [AbortedTransaction(1, 5), AbortedTransaction(9, 40)]
        assert parse_aborted("") == []
        with pytest.raises(ValueError, match="producer_id:first_offset"):
            parse_aborted("12")

    def test_an_aborted_producer_is_dropped_until_its_abort_marker(self) -> None:
        """Batches of the producer after its aborted transaction started are dropped, its ABORT
        marker ends that, and its next transaction is kept; other producers are untouched."""
        keep = CommittedFilter([AbortedTransaction(1, 10)])
        early = parse_batch_header(build_batch([TestRecord(b"k", b"v")], base_offset=5,
                                               producer_id=1, producer_epoch=0,
                                               base_sequence=0, transactional=True))  # fmt: skip
        assert keep.accept(early)  # before the aborted transaction started
        aborted = parse_batch_header(_rebased(_txn(1, 10, 2), 10))
        other = parse_batch_header(_rebased(_txn(2, 12, 1), 12))
        marker = parse_batch_header(_rebased(_marker(ControlRecordType.ABORT, 1), 13))
        later = parse_batch_header(_rebased(_txn(1, 14, 1), 14))
        assert not keep.accept(aborted)
        assert keep.accept(other)
        assert not keep.accept(marker, ControlRecordType.ABORT)  # a marker is never data
        assert keep.accept(later)


def _rebased(batch: bytes, base: int) -> bytes:
    return base.to_bytes(8, "big", signed=True) + batch[8:]


class TestServiceReadCommitted:
    """The aborted-transaction list and the limit the service computes."""

    async def test_every_offset_and_size_reads_what_a_committed_consumer_reads(
        self, remote, service
    ):
        """From every offset and for several sizes, following next offsets to the end: the
        data offsets are exactly the committed ones, even where a marker sits two segments on."""
        committed, _ = await _interleaved(remote)
        for max_bytes in (1, 200, 10_000):
            for start in range(26):
                offset, seen = start, []
                while offset <= 25:
                    got = await _committed_offsets(service, offset, max_bytes)
                    seen += got
                    _, limit = await service.aborted_transactions(TP, offset, max_bytes)
                    stream = await service.runs(TP, offset, max_bytes, limit_offset=limit)
                    offset = max([r.next_offset async for r in stream])
                assert seen == sorted(o for o in committed if o >= start), (max_bytes, start)

    async def test_the_list_holds_overlapping_transactions_only(self, remote, service):
        """A transaction that ended before the offset, or starts past the bound, is not listed."""
        await _interleaved(remote)
        aborted, _ = await service.aborted_transactions(TP, 0, 1 << 20)
        assert aborted == [AbortedTransaction(1, 5), AbortedTransaction(3, 18)]
        aborted, _ = await service.aborted_transactions(TP, 16, 1 << 20)
        assert aborted == [AbortedTransaction(3, 18)]
        aborted, limit = await service.aborted_transactions(TP, 0, 1)
        assert limit < 14  # from the offset index: a bound well inside the first segment
        assert aborted == [AbortedTransaction(1, 5)][: 1 if limit > 5 else 0]

    async def test_cap_moves_the_limit_down(self, remote, service):
        """With a cap, the response stops before the first transaction left out."""
        await _interleaved(remote)
        aborted, limit = await service.aborted_transactions(TP, 0, 1 << 20, cap=1)
        assert aborted == [AbortedTransaction(1, 5)]
        assert limit == 18
        stream = await service.runs(TP, 0, 1 << 20, limit_offset=limit)
        assert max([r.next_offset async for r in stream]) <= 18

    async def test_local_txn_indexes_complete_the_list(self, remote, chunks, tmp_path):
        """A marker not tiered yet: the broker's local .txnindex (same topic id) supplies it;
        without a local copy the list cannot be known, so the response stops at the archive's
        last stable offset (the aborted transaction's first offset)."""
        await remote.upload(0, [_plain(0, 5), _txn(4, 5, 2)])
        # a whole entry and a partial one being appended
        _local_log(tmp_path / "logs", 7, AbortedTxn(0, 4, 5, 7, 8), tail=b"\0")
        assert await _aborted_with_local(remote, chunks, ()) == ([], 5)
        expected = ([AbortedTransaction(4, 5)], 7)
        assert await _aborted_with_local(remote, chunks, (tmp_path / "logs",)) == expected

    async def test_an_abort_tiered_past_a_gap_does_not_settle_the_data_before_it(
        self, remote, service
    ):
        """Producer 4's transaction is open at the end of the tiered run, and its marker was
        in offsets that were never tiered: an abort tiered past the gap says nothing of it."""
        # 0-4 plain, 5-6 producer 4's transaction, open at the segment's end (its ABORT at 7 is in
        # offsets 7..19, never tiered: lost at local retention while tiering was stalled)
        await remote.upload(0, [_plain(0, 5), _txn(4, 5, 2)])
        # 20 producer 5, 21 its ABORT (LSO 22 then): the only entry of the tiered txn indexes
        await remote.upload(
            20,
            [_txn(5, 20, 1), _marker(ControlRecordType.ABORT, 5), _plain(22, 2)],
            aborted=[AbortedTxn(0, 5, 20, 21, 22)],
        )
        aborted, limit = await service.aborted_transactions(TP, 0, 1 << 20)
        # whether producer 4's transaction aborted is unknown here: it must not go out
        assert limit <= 5, (aborted, limit)
        assert 5 not in await _committed_offsets(service, 0, 1 << 20)

    async def test_a_local_abort_past_a_gap_does_not_settle_the_tiered_end(
        self, remote, chunks, tmp_path
    ):
        """The same with a local log that starts past the gap."""
        await remote.upload(0, [_plain(0, 5), _txn(4, 5, 2)])  # producer 4 open at the tiered end
        # the local log starts at 20 (7..19 deleted by local retention before they were tiered)
        # and holds an unrelated abort whose LSO is past the bound
        _local_log(tmp_path / "logs", 20, AbortedTxn(0, 5, 20, 21, 22))
        aborted, limit = await _aborted_with_local(remote, chunks, (tmp_path / "logs",))
        assert limit <= 5, (aborted, limit)

    async def test_a_local_log_without_the_abort_settles_nothing(self, remote, chunks, tmp_path):
        """The transaction open at the tiered end: a local log without an abort entry whose
        last stable offset reaches the bound does not settle it. It may have committed (no
        entry), or this replica may be behind and not have the marker yet (its log starts
        before the tiered end or right after it)."""
        await remote.upload(0, [_plain(0, 5), _txn(4, 5, 2)])
        for base in (0, 7):
            _local_log(tmp_path / str(base), base)
            found = await _aborted_with_local(remote, chunks, (tmp_path / str(base),))
            assert found == ([], 5), base

    @pytest.mark.parametrize(
        "outcome", [ControlRecordType.ABORT, ControlRecordType.COMMIT], ids=["abort", "commit"]
    )
    async def test_a_transaction_without_its_marker_tiered_is_held_back(
        self, remote, service, outcome
    ):
        """No local copy and the marker still on the broker: a read_committed response stops
        at the transaction's first offset whether it aborts or commits (it is past the last
        stable offset of what is tiered); a read from there gets nothing, as a fetch at the
        LSO does; once the marker is tiered, the read goes on with the right outcome."""
        await remote.upload(0, [_plain(0, 5), _txn(4, 5, 2)])
        assert await _committed_offsets(service, 0, 1 << 20) == [0, 1, 2, 3, 4]
        for offset in (5, 6, 7):
            assert await _committed_offsets(service, offset, 1 << 20) == []
            _, limit = await service.aborted_transactions(TP, offset, 1 << 20)
            assert [b async for b in await service.runs(TP, offset, 1, limit_offset=limit)] == []
            assert await service.plan_records(TP, offset, 1, limit_offset=limit) is None
        with pytest.raises(OffsetOutOfRangeError):
            await service.aborted_transactions(TP, 8, 1 << 20)
        aborted = [AbortedTxn(0, 4, 5, 7, 8)] if outcome is ControlRecordType.ABORT else []
        await remote.upload(7, [_marker(outcome, 4), _plain(8, 2)], aborted=aborted)
        kept = [5, 6] if outcome is ControlRecordType.COMMIT else []
        assert await _committed_offsets(service, 0, 1 << 20) == [0, 1, 2, 3, 4, *kept, 8, 9]

    async def test_a_transaction_open_at_an_earlier_segment_end_is_not_held_back(
        self, remote, service
    ):
        """Only a transaction open at the end of the tiered data holds a response back: one
        whose marker is tiered in a later segment is settled by the transaction indexes."""
        committed, _ = await _interleaved(remote)
        assert await _committed_offsets(service, 0, 1 << 20) == sorted(committed)

    async def test_an_unusable_producer_snapshot_is_read_from_the_segment_before(
        self, remote, service
    ):
        """The last segment's snapshot does not parse (Kafka uploads an older snapshot that
        fails its CRC as it is): the one of the segment before it says which transactions are
        open there, and the last segment, past it, is not settled. With no usable snapshot at
        all, nothing is. Never an error, never a guess; each snapshot is fetched once."""
        await remote.upload(0, [_plain(0, 5)])
        await remote.upload(5, [_plain(5, 5), _txn(4, 10, 2)], snapshot=b"not a snapshot")
        with capture_logs() as logs:
            for _ in range(2):
                assert await service.aborted_transactions(TP, 0, 1 << 20) == ([], 5)
                assert await _committed_offsets(service, 0, 1 << 20) == [0, 1, 2, 3, 4]
        assert [e["start_offset"] for e in logs if e["event"] == "producer_snapshot_unusable"] == [
            5
        ]
        assert await service.aborted_transactions(TP, 5, 1 << 20) == ([], 5)
        assert await _committed_offsets(service, 5, 1 << 20) == []

    async def test_with_no_usable_snapshot_nothing_is_settled(self, remote, service):
        await remote.upload(0, [_plain(0, 5)], snapshot=b"not a snapshot")
        assert await service.aborted_transactions(TP, 0, 1 << 20) == ([], 0)
        assert await _committed_offsets(service, 0, 1 << 20) == []
        stream = await service.batches(TP, 0, 1 << 20)  # read_uncommitted: no limit
        assert [b.header.base_offset async for b in stream] == [0]


class TestListOffsets:
    """ListOffsets' special timestamps over the tiered range."""

    async def test_earliest_latest_and_max_timestamp(self, remote, service):
        """-2 is the first tiered offset, -1 the last + 1, -3 the first record with the largest
        timestamp; an unknown negative timestamp is an error."""
        await remote.upload(10, data_batches(10, 4, epoch=3))
        records = [
            TestRecord(b"a", b"1", timestamp=BASE_TS + 5000),
            TestRecord(b"b", b"2", timestamp=BASE_TS + 9000),
            TestRecord(b"c", b"3", timestamp=BASE_TS + 9000),
        ]
        last = await remote.upload(
            30, [build_batch(records, leader_epoch=4), *data_batches(33, 1, epoch=4)]
        )
        earliest = await service.list_offset(TP, -2)
        assert earliest == (10, -1, 3)
        latest = await service.list_offset(TP, -1)
        assert latest == (last.end_offset + 1, -1, 4)
        largest = await service.list_offset(TP, -3)
        assert largest == (31, BASE_TS + 9000, 4)
        with pytest.raises(ValueError, match="-4"):
            await service.list_offset(TP, -4)


@pytest.fixture
async def socket_path(remote: Remote, tmp_path: Path) -> AsyncIterator[Path]:
    chunks = ChunkCache(
        objects=remote.objects, directory=tmp_path / "cache", max_bytes=1 << 20,
        chunk_size=16 * 1024, fetch_timeout_s=5.0,
    )  # fmt: skip
    service = ReadService(
        store=remote.store, objects=remote.objects, layout=LAYOUT, chunks=chunks, lineage_ttl_s=0
    )
    server = ReadServer(service=service, socket_path=tmp_path / "t.sock")
    stopping = asyncio.Event()
    task = asyncio.create_task(server.run(stopping))
    await server.started.wait()
    try:
        yield tmp_path / "t.sock"
    finally:
        stopping.set()
        await task


class TestHttp:
    """The isolation parameter on the socket, the client and ``sidecar read``."""

    async def test_raw_read_committed_carries_the_aborted_list(self, remote, socket_path):
        """Raw responses are whole batches either way; read_committed adds the list header."""
        await _interleaved(remote)
        connector = aiohttp.UnixConnector(path=str(socket_path))
        async with aiohttp.ClientSession(connector=connector) as http:
            url = f"{BASE}/v1/topics/orders/partitions/0/records"
            async with http.get(url, params={"offset": "0"}) as response:
                plain = await response.read()
                assert response.headers["X-Isolation-Level"] == "read_uncommitted"
                assert "X-Aborted-Transactions" not in response.headers
            params = {"offset": "0", "isolation": "read_committed"}
            async with http.get(url, params=params) as response:
                assert await response.read() == plain
                assert response.headers["X-Aborted-Transactions"] == "1:5,3:18"
            params["isolation"] = "committed"
            async with http.get(url, params=params) as response:
                assert response.status == 400
                assert (await response.json())["code"] == "bad_request"
            params = {"timestamp": "-2"}
            async with http.get(url.replace("records", "offsets"), params=params) as response:
                assert (await response.json())["offset"] == 0
            params = {"timestamp": "-4"}
            async with http.get(url.replace("records", "offsets"), params=params) as response:
                assert response.status == 400

    async def test_client_json_and_cli_agree_with_the_consumer(self, remote, socket_path):
        """Client (raw, filtered here), JSON (filtered by the server) and ``sidecar read``
        return the committed records under read_committed, everything otherwise."""
        committed, uncommitted = await _interleaved(remote)
        async with ReadClient(socket_path=socket_path) as client:
            for level, expected in (
                (IsolationLevel.READ_COMMITTED, committed),
                (IsolationLevel.READ_UNCOMMITTED, uncommitted),
            ):
                got = [r.offset async for r in client.iter_records(
                    "orders", 0, 0, max_bytes=150, isolation=level)]  # fmt: skip
                assert got == sorted(expected)
                page = await client.records_json("orders", 0, 0, isolation=level)
                assert [r.offset for r in page.records] == sorted(expected)
                assert page.next_offset == 26
            fetched = await client.fetch("orders", 0, 14, isolation="read_committed")
            assert fetched.aborted == [AbortedTransaction(1, 5), AbortedTransaction(3, 18)]
            latest = await client.offset_for_timestamp("orders", 0, client.LATEST)
            assert latest["offset"] == 26
            with pytest.raises(OffsetOutOfRangeError):
                await client.records("orders", 0, 27)
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(
            read_command,
            socket_path=socket_path, url=None, topic="orders", partition=0, offset=0,
            timestamp=None, count=None, as_json=True, out=out, err=err,
            isolation="read_committed",
        )  # fmt: skip
        assert code == 0
        printed = [json.loads(line)["offset"] for line in out.getvalue().splitlines()]
        assert printed == sorted(committed)
        out = io.StringIO()
        code = await asyncio.to_thread(
            read_command,
            socket_path=socket_path, url=None, topic="orders", partition=0, offset=None,
            timestamp=-1, count=None, as_json=True, out=out, err=err,
        )  # fmt: skip
        assert code == 0
        assert out.getvalue() == ""

    async def test_a_read_from_a_final_marker_ends_cleanly(self, remote, socket_path):
        """The tiered range ends in a transaction marker and the read starts at it: like a
        fetch at the end of a log, no records and exit 0 (the marker's next offset, right
        after the range, answers an empty page); one further is still out of range."""
        await remote.upload(0, [_plain(0, 3), _txn(1, 3, 2), _marker(ControlRecordType.COMMIT, 1)])
        last = remote.segments[-1].end_offset
        assert last == 5
        for level in ("read_uncommitted", "read_committed"):
            for as_json in (False, True):
                out, err = io.StringIO(), io.StringIO()
                code = await asyncio.to_thread(
                    read_command,
                    socket_path=socket_path, url=None, topic="orders", partition=0,
                    offset=last, timestamp=None, count=None, as_json=as_json, out=out,
                    err=err, isolation=level,
                )  # fmt: skip
                assert (code, out.getvalue(), err.getvalue()) == (0, "", ""), level
        async with ReadClient(socket_path=socket_path) as client:
            page = await client.records("orders", 0, last + 1)
            assert (page.records, page.next_offset) == ([], last + 1)
            page = await client.records_json("orders", 0, last + 1, isolation="read_committed")
            assert (page.records, page.next_offset) == ([], last + 1)
            fetched = await client.fetch("orders", 0, last + 1, isolation="read_committed")
            assert (fetched.data, fetched.aborted) == (b"", [])
            with pytest.raises(OffsetOutOfRangeError):
                await client.records("orders", 0, last + 2)

    async def test_read_committed_stops_at_the_archive_last_stable_offset(
        self, remote, socket_path
    ):
        """An aborted transaction whose marker is not tiered: raw and JSON read_committed
        responses end before it, and a read from it gets an empty page that points at the same
        offset (nothing yet); read_uncommitted still returns it."""
        await remote.upload(0, [_plain(0, 5), _txn(4, 5, 2)])
        async with ReadClient(socket_path=socket_path) as client:
            got = [r.offset async for r in client.iter_records(
                "orders", 0, 0, isolation="read_committed")]  # fmt: skip
            assert got == [0, 1, 2, 3, 4]
            fetched = await client.fetch("orders", 0, 0, isolation="read_committed")
            assert [h.next_offset for h, _ in decode_batches(fetched.data)] == [5]
            fetched = await client.fetch("orders", 0, 5, isolation="read_committed")
            assert (fetched.data, fetched.aborted) == (b"", [])
            page = await client.records_json("orders", 0, 5, isolation="read_committed")
            assert (page.records, page.next_offset) == ([], 5)
            page = await client.records_json("orders", 0, 5)
            assert [r.offset for r in page.records] == [5, 6]

    async def test_many_aborts_are_capped_in_the_header(self, remote, socket_path):
        """More aborted transactions than a header lists: the response stops before the first
        one left out, and reading on from there gets the rest (the committed data is whole)."""
        batches, aborted, offset = [], [], 0
        for pid in range(MAX_LISTED_ABORTS + 20):
            batches += [_txn(pid + 100, offset, 1), _marker(ControlRecordType.ABORT, pid + 100)]
            aborted.append(AbortedTxn(0, pid + 100, offset, offset + 1, offset + 2))
            batches.append(_plain(offset + 2, 1))
            offset += 3
        await remote.upload(0, batches, aborted=aborted)
        async with ReadClient(socket_path=socket_path) as client:
            first = await client.fetch("orders", 0, 0, max_bytes=1 << 20,
                                       isolation="read_committed")  # fmt: skip
            # the one that starts at offset 0, and 100 after it
            assert len(first.aborted) == MAX_LISTED_ABORTS + 1
            last = list(decode_batches(first.data))[-1][0]
            assert last.next_offset <= first.aborted[-1].first_offset + 3
            got = [r.value async for r in client.iter_records(
                "orders", 0, 0, isolation="read_committed")]  # fmt: skip
            assert len(got) == MAX_LISTED_ABORTS + 20
            assert all(v is not None and not v.startswith(b"txn") for v in got)
