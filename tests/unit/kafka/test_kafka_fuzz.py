"""Fuzzing: generated and mutated inputs never raise anything but FormatError subclasses from the
parsers (no IndexError, struct.error, ValueError, codec or Rust-panic exceptions leak), scans,
verify and inspect never raise at all, and nothing hangs or grows memory without bound.

Every generated test runs ``SIDECAR_FUZZ_EXAMPLES`` cases (default 200, so the unit suite stays
fast); the two log-dir tests, which write files, run a quarter of that (at least 50). Together
with ``test_kafka_fuzz_codecs.py`` (three generated tests) that is 12.5 x SIDECAR_FUZZ_EXAMPLES
cases. The evidence run, 125,000 cases::

    SIDECAR_FUZZ_EXAMPLES=10000 .venv/bin/python -m pytest -p no:cacheprovider -q \
        tests/unit/kafka/test_kafka_fuzz.py tests/unit/kafka/test_kafka_fuzz_codecs.py \
        --hypothesis-show-statistics

A hang fails through the per-example deadline and the per-test timeout (scaled to the example
count); memory through the peak-RSS check around every test.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import resource
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.errors import FormatError
from sidecar.kafka.checkpoints import (
    PRODUCER_SNAPSHOT_ENTRY,
    ProducerSnapshotEntry,
    epoch_entries_in_range,
    format_producer_snapshot,
    parse_leader_epoch_checkpoint,
    parse_meta_properties,
    parse_partition_metadata,
    parse_producer_snapshot,
)
from sidecar.kafka.indexes import (
    ABORTED_TXN_ENTRY,
    OFFSET_INDEX_ENTRY,
    TIME_INDEX_ENTRY,
    OffsetIndex,
    TimeIndex,
    TxnIndex,
)
from sidecar.kafka.inspect import run_inspect, verify_partition
from sidecar.kafka.logdir import FileKind, scan_log_dir, scan_partition_dir, segment_file_name
from sidecar.kafka.records import (
    BATCH_HEADER,
    RECORD_BATCH_OVERHEAD,
    Compression,
    ControlRecordType,
    decode_batches,
    decode_records,
    iter_batches,
    parse_batch_header,
)
from sidecar.testing import (
    TestRecord,
    build_batch,
    build_control_batch,
    rebase_batch,
    write_meta_properties,
    write_partition,
)

EXAMPLES = int(os.environ.get("SIDECAR_FUZZ_EXAMPLES", "200"))
LOG_DIR_EXAMPLES = max(EXAMPLES // 4, 50)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=datetime.timedelta(seconds=10),  # a case takes milliseconds; this is a hang
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
    print_blob=True,
)
FUZZ_LOG_DIR = settings(FUZZ, max_examples=LOG_DIR_EXAMPLES)
#: per-test wall-clock limit: generous per case, so only a real hang trips it
TIMEOUT = pytest.mark.timeout(max(600, EXAMPLES // 10))
#: peak RSS may grow this much during one fuzz test (inputs are a few KiB)
MEMORY_GROWTH_LIMIT = 512 * 1024 * 1024

pytestmark = TIMEOUT


def _max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


@pytest.fixture(autouse=True)
def bounded_memory() -> Iterator[None]:
    """No fuzz test raises the process's peak RSS by more than MEMORY_GROWTH_LIMIT."""
    before = _max_rss()
    yield
    grown = _max_rss() - before
    assert grown < MEMORY_GROWTH_LIMIT, f"peak RSS grew {grown >> 20} MiB during the test"


def _records(n: int, seed: int) -> list[TestRecord]:
    return [
        TestRecord(
            key=None if i % 3 == 0 else b"k%d-%d" % (seed, i),
            value=bytes((seed + i + j) % 256 for j in range(20 + i)),
            headers=[(f"h{i}", b"v" if i % 2 else None)],
            timestamp=1_700_000_000_000 + i,
        )
        for i in range(n)
    ]


def _segment(batches: list[bytes]) -> bytes:
    out = bytearray()
    offset = 0
    for b in batches:
        rebased = rebase_batch(b, offset)
        out += rebased
        offset = parse_batch_header(rebased).next_offset
    return bytes(out)


BATCHES = [
    build_batch(_records(4, seed), compression=codec) for seed, codec in enumerate(Compression)
]
BATCHES += [
    build_batch(_records(3, 7), compression=Compression.SNAPPY, xerial=False),
    build_control_batch(ControlRecordType.ABORT, producer_id=4),
]
SEGMENTS = [
    _segment([build_batch(_records(4, seed), compression=codec) for seed in range(3)])
    for codec in Compression
] + [
    _segment(
        [build_batch(_records(2, 9)), build_control_batch(ControlRecordType.ABORT, producer_id=4)]
    )
]

Mutation = tuple[str, int, int]
mutations = st.lists(
    st.tuples(
        st.sampled_from(["flip", "set", "truncate", "insert", "delete", "zeros"]),
        st.integers(min_value=0, max_value=4000),
        st.integers(min_value=0, max_value=255),
    ),
    min_size=1,
    max_size=4,
)


def mutate(data: bytes, ops: list[Mutation]) -> bytes:
    out = bytearray(data)
    for op, where, value in ops:
        at = where % (len(out) + 1)
        if op == "flip" and out:
            out[at % len(out)] ^= 1 << (value % 8)
        elif op == "set" and out:
            out[at % len(out)] = value
        elif op == "truncate":
            del out[at:]
        elif op == "insert":
            out[at:at] = bytes([value]) * (value % 7 + 1)
        elif op == "delete":
            del out[at : at + value % 16 + 1]
        elif op == "zeros":
            out[at : at + value] = bytes(value)
    return bytes(out)


def _recrc(batch: bytes) -> bytes:
    """The batch with its length and CRC made consistent, so the bytes reach the decoder."""
    out = bytearray(batch)
    if len(out) >= RECORD_BATCH_OVERHEAD:
        struct.pack_into(">i", out, 8, len(out) - 12)
        struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def walk_and_decode(data: bytes, *, verify_crc: bool, tolerate_tail: bool) -> None:
    with contextlib.suppress(FormatError):
        for header in iter_batches(data, verify_crc=verify_crc, tolerate_tail=tolerate_tail):
            with contextlib.suppress(FormatError):
                decode_records(data[header.position : header.end_position], verify_crc=verify_crc)
    with contextlib.suppress(FormatError):
        for _header, _records in decode_batches(
            data, verify_crc=verify_crc, tolerate_tail=tolerate_tail
        ):
            pass


class TestFuzzRecords:
    """Batch walks, header parsing and record decoding on generated and mutated bytes."""

    @FUZZ
    @given(st.sampled_from(range(len(SEGMENTS))), mutations, st.booleans(), st.booleans())
    def test_mutated_segments(
        self, which: int, ops: list[Mutation], verify_crc: bool, tolerate_tail: bool
    ) -> None:
        """Any mutation of a valid segment yields headers, records or a FormatError."""
        walk_and_decode(
            mutate(SEGMENTS[which], ops), verify_crc=verify_crc, tolerate_tail=tolerate_tail
        )

    @FUZZ
    @given(st.binary(max_size=400), st.booleans())
    def test_random_bytes(self, data: bytes, verify_crc: bool) -> None:
        """Random bytes as a segment yield nothing but FormatError subclasses."""
        walk_and_decode(data, verify_crc=verify_crc, tolerate_tail=False)
        with contextlib.suppress(FormatError):
            parse_batch_header(data)
        with contextlib.suppress(FormatError):
            decode_records(data, verify_crc=verify_crc)

    @FUZZ
    @given(st.sampled_from(range(len(BATCHES))), mutations)
    def test_mutated_payloads_behind_a_valid_crc(self, which: int, ops: list[Mutation]) -> None:
        """Corrupt records and compressed payloads that pass the CRC reach every codec and the
        record parser, and still yield records or a FormatError."""
        batch = BATCHES[which]
        payload = mutate(batch[RECORD_BATCH_OVERHEAD:], ops)
        data = _recrc(batch[:RECORD_BATCH_OVERHEAD] + payload)
        with contextlib.suppress(FormatError):
            decode_records(data)
        walk_and_decode(data, verify_crc=True, tolerate_tail=True)

    @FUZZ
    @given(
        st.tuples(
            st.integers(-(2**63), 2**63 - 1),  # baseOffset
            st.integers(-(2**31), 2**31 - 1),  # batchLength (fixed up below when asked)
            st.integers(-(2**31), 2**31 - 1),  # partitionLeaderEpoch
            st.sampled_from([2, 2, 2, 0, 1, 3, -1]),  # magic
            st.integers(-(2**15), 2**15 - 1),  # attributes
            st.integers(-(2**31), 2**31 - 1),  # lastOffsetDelta
            st.integers(-(2**63), 2**63 - 1),  # baseTimestamp
            st.integers(-(2**63), 2**63 - 1),  # maxTimestamp
            st.integers(-(2**63), 2**63 - 1),  # producerId
            st.integers(-(2**15), 2**15 - 1),  # producerEpoch
            st.integers(-(2**31), 2**31 - 1),  # baseSequence
            st.integers(-(2**31), 2**31 - 1),  # recordsCount
        ),
        st.binary(max_size=300),
        st.booleans(),
    )
    def test_generated_headers(
        self, fields: tuple[int, ...], payload: bytes, consistent: bool
    ) -> None:
        """Every header field value, with or without a consistent length and CRC."""
        base, length, epoch, magic, attributes, *rest = fields
        data = BATCH_HEADER.pack(base, length, epoch, magic, 0, attributes, *rest) + payload
        if consistent:
            data = _recrc(data)
        with contextlib.suppress(FormatError):
            parse_batch_header(data, available=len(data) + (length % 1000))
        with contextlib.suppress(FormatError):
            decode_records(data, verify_crc=consistent)
        walk_and_decode(data, verify_crc=not consistent, tolerate_tail=consistent)


SNAPSHOT = format_producer_snapshot([ProducerSnapshotEntry(1, 2, 3, 4, 5, 6, 7, -1)] * 2)
int64s = st.integers(-(2**63), 2**63 - 1)
int32s = st.integers(-(2**31), 2**31 - 1)
offsets = st.one_of(st.integers(-5, 300), int64s)


def _parse_small_files(data: bytes) -> None:
    parsers: list[Callable[[], object]] = [
        lambda: OffsetIndex.parse(data, base_offset=10).validate(log_size=100, end_offset=50),
        lambda: TimeIndex.parse(data, base_offset=10).validate(end_offset=50),
        lambda: TxnIndex.parse(data, base_offset=10).validate(),
        lambda: parse_producer_snapshot(data),
        lambda: parse_leader_epoch_checkpoint(data),
        lambda: parse_partition_metadata(data),
        lambda: parse_meta_properties(data),
    ]
    for parse in parsers:
        with contextlib.suppress(FormatError):
            parse()


class TestFuzzSmallFiles:
    """Index, checkpoint, metadata and snapshot parsers on random, mutated and generated bytes."""

    @FUZZ
    @given(st.binary(max_size=200))
    def test_random_bytes(self, data: bytes) -> None:
        """Every small-file parser raises only FormatError subclasses on random bytes."""
        _parse_small_files(data)

    @FUZZ
    @given(
        st.sampled_from(
            [
                SNAPSHOT,
                b"0\n3\n0 0\n1 100\n2 200\n",
                b"version: 0\ntopic_id: ASNFZ4mrze_-3LqYdlQyEA",
                b"#\nnode.id=1\nversion=1\ncluster.id=x\ndirectory.id=ASNFZ4mrze_-3LqYdlQyEA\n",
            ]
        ),
        mutations,
    )
    def test_mutated_files(self, data: bytes, ops: list[Mutation]) -> None:
        """Mutations of valid small files raise only FormatError subclasses."""
        _parse_small_files(mutate(data, ops))

    @FUZZ
    @given(
        st.text(
            alphabet=st.sampled_from(list("0123456789 -+\t\r\n:=#!\\uversiontopic_dA-Z.é")),
            max_size=120,
        ),
        offsets,
        offsets,
    )
    def test_generated_text(self, text: str, start: int, end: int) -> None:
        """Text near the checkpoint, partition.metadata and properties grammars parses or is a
        FormatError, and epoch arithmetic works on whatever parses."""
        data = text.encode()
        _parse_small_files(data)
        with contextlib.suppress(FormatError):
            entries = parse_leader_epoch_checkpoint(data)
            epoch_entries_in_range(entries, start, end)

    @FUZZ
    @given(
        st.lists(
            st.tuples(
                int64s,
                st.integers(-(2**15), 2**15 - 1),
                int32s,
                int64s,
                int32s,
                int64s,
                int32s,
                int64s,
            ),
            max_size=5,
        ),
        st.integers(-3, 8),
        st.binary(max_size=60),
    )
    def test_generated_snapshots(
        self, entries: list[tuple[int, ...]], count_delta: int, tail: bytes
    ) -> None:
        """Snapshots with a valid CRC but a wrong count or trailing bytes are FormatErrors."""
        body = struct.pack(">i", len(entries) + count_delta) + b"".join(
            PRODUCER_SNAPSHOT_ENTRY.pack(*e) for e in entries
        )
        body += tail
        data = struct.pack(">hI", 1, crc32c.crc32c(body)) + body
        with contextlib.suppress(FormatError):
            snapshot = parse_producer_snapshot(data)
            assert len(snapshot.entries) == len(entries) + count_delta

    @FUZZ
    @given(
        st.lists(st.tuples(int32s, int32s), max_size=20),
        st.lists(st.tuples(int64s, int32s), max_size=20),
        st.lists(st.tuples(st.integers(-2, 2), int64s, int64s, int64s, int64s), max_size=5),
        offsets,
        st.integers(0, 30),
        st.lists(st.one_of(int64s, st.integers(-5, 300)), max_size=5),
    )
    def test_generated_indexes(
        self,
        offset_entries: list[tuple[int, int]],
        time_entries: list[tuple[int, int]],
        txns: list[tuple[int, int, int, int, int]],
        base: int,
        zero_tail: int,
        targets: list[int],
    ) -> None:
        """Arbitrary entries (decreasing, negative, huge, zero-padded) parse, validate and look
        up without raising anything but FormatError."""
        base = max(0, base)
        data = b"".join(OFFSET_INDEX_ENTRY.pack(*e) for e in offset_entries)
        data += bytes(OFFSET_INDEX_ENTRY.size * zero_tail)
        index = OffsetIndex.parse(data, base_offset=base)
        index.validate(log_size=1000, end_offset=base + 100)
        list(index)
        times = b"".join(TIME_INDEX_ENTRY.pack(*e) for e in time_entries)
        times += bytes(TIME_INDEX_ENTRY.size * zero_tail)
        time_index = TimeIndex.parse(times, base_offset=base)
        time_index.validate(end_offset=base + 100)
        time_index.last_entry()
        for target in targets:
            index.lookup(target)
            time_index.lookup(target)
        with contextlib.suppress(FormatError):
            txn = TxnIndex.parse(
                b"".join(ABORTED_TXN_ENTRY.pack(*t) for t in txns), base_offset=base
            )
            txn.validate()
            list(txn)


PARTITION_FILES = [
    segment_file_name(0, FileKind.LOG),
    segment_file_name(0, FileKind.INDEX),
    segment_file_name(0, FileKind.TIMEINDEX),
    segment_file_name(0, FileKind.TXNINDEX),
    segment_file_name(5, FileKind.SNAPSHOT),
    segment_file_name(5, FileKind.LOG),
    segment_file_name(5, FileKind.INDEX),
    segment_file_name(5, FileKind.TIMEINDEX),
    "leader-epoch-checkpoint",
    "partition.metadata",
]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log dir (meta.properties, one partition of two segments, a txn index) to copy."""
    from sidecar.kafka.indexes import AbortedTxn

    root = tmp_path_factory.mktemp("fuzz-logdir") / "logs"
    write_meta_properties(root)
    write_partition(
        root,
        "t",
        0,
        [
            [
                build_batch(_records(3, 1), compression=Compression.GZIP),
                build_batch(_records(2, 2)),
            ],
            [build_batch(_records(2, 3), compression=Compression.LZ4)],
        ],
        producers=[ProducerSnapshotEntry(4, 0, 1, 4, 1, 1_700_000_000_000, 0, -1)],
        aborted={0: [AbortedTxn(0, 4, 1, 3, 1)]},
    )
    return root


@contextlib.contextmanager
def _copy(pristine: Path) -> Iterator[Path]:
    target = pristine.parent / f"case-{os.getpid()}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(pristine, target)
    try:
        yield target
    finally:
        shutil.rmtree(target, ignore_errors=True)


def _scan_verify_inspect(root: Path) -> None:
    scan = scan_log_dir(root)
    for partition in scan.partitions:
        verify_partition(partition)
        scan_partition_dir(partition.path)
    targets = [root, *(p.path for p in scan.partitions)]
    targets += [s.log_path for p in scan.partitions for s in p.segments]
    for target in targets:
        for as_json in (True, False):
            code = run_inspect(
                target, as_json=as_json, verify=True, records=True, out=io.StringIO()
            )
            assert code in (0, 1, 2)


FS_OPS = st.lists(
    st.tuples(
        st.sampled_from(["delete", "truncate", "empty", "dir", "junk", "rename-dir", "chmod"]),
        st.sampled_from([*PARTITION_FILES, "meta.properties"]),
        st.sampled_from(
            [
                "00000000000000000003.log",
                "00000000000000000005.log.deleted",
                "00000000000000000000.index.swap",
                "99999999999999999999.log",
                "-1.log",
                "x.snapshot",
                "00000000000000000009.snapshot",
                "leader-epoch-checkpoint.tmp",
                "t-0.abc-delete",
                "t-x",
                "t-0.0123456789abcdef0123456789abcdef-future",
                "__cluster_metadata-0",
                "é-1",
            ]
        ),
        st.integers(0, 200),
    ),
    min_size=1,
    max_size=4,
)


class TestFuzzLogDir:
    """Scans, verify and inspect on a log dir with mutated files and a changed tree."""

    @FUZZ_LOG_DIR
    @given(st.sampled_from(PARTITION_FILES), mutations)
    def test_mutated_file(self, pristine: Path, file_name: str, ops: list[Mutation]) -> None:
        """A corrupt file shows up as a typed problem; nothing is raised."""
        with _copy(pristine) as root:
            path = root / "t-0" / file_name
            path.write_bytes(mutate(path.read_bytes(), ops))
            _scan_verify_inspect(root)

    @FUZZ_LOG_DIR
    @given(FS_OPS)
    def test_changed_tree(self, pristine: Path, ops: list[tuple[str, str, str, int]]) -> None:
        """Deleted, truncated or emptied files, directories in place of files, junk names and
        renamed partition dirs are reported or skipped; nothing is raised."""
        with _copy(pristine) as root:
            part = root / "t-0"
            for op, file_name, junk, size in ops:
                path = (root if file_name == "meta.properties" else part) / file_name
                if op == "rename-dir":
                    if part.exists() and not (root / junk).exists():
                        part.rename(root / junk)
                    continue
                if not path.parent.exists():
                    continue
                if op == "junk":
                    junk_path = path.parent / junk
                    if not junk_path.exists():
                        junk_path.write_bytes(bytes(size))
                elif not path.exists() or path.is_dir():
                    continue
                elif op == "delete":
                    path.unlink()
                elif op == "truncate":
                    with path.open("r+b") as fh:
                        fh.truncate(min(size, path.stat().st_size))
                elif op == "empty":
                    path.write_bytes(b"")
                elif op == "dir":
                    path.unlink()
                    path.mkdir()
                elif op == "chmod":
                    path.chmod(0)  # tests run as root here, so this only exercises the path
            _scan_verify_inspect(root)

    def test_segment_deleted_during_the_scan_is_not_a_problem(
        self, pristine: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A segment the broker deletes mid-scan is listed as vanished and inspect exits 0."""
        import json

        import sidecar.kafka.logdir as logdir_module
        from sidecar.kafka.indexes import index_tail

        def delete_then_read(path: Path, entry_size: int) -> tuple[int, bytes]:
            for sibling in path.parent.glob(path.stem + ".*"):
                sibling.unlink()
            return index_tail(path, entry_size)

        with _copy(pristine) as root:
            monkeypatch.setattr(logdir_module, "index_tail", delete_then_read)
            out = io.StringIO()
            assert run_inspect(root, as_json=True, verify=True, records=False, out=out) == 0
            document = json.loads(out.getvalue())
            assert document["ok"] is True
            assert document["vanished"]
            assert {v["error"] for v in document["vanished"]} == {"SegmentVanishedError"}
