"""Fuzzing: random bytes and mutations of valid files never raise anything but FormatError
subclasses (no IndexError, struct.error, ValueError or codec exceptions leak), and scans and
inspect never raise at all."""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.errors import FormatError
from sidecar.kafka.checkpoints import (
    ProducerSnapshotEntry,
    format_producer_snapshot,
    parse_leader_epoch_checkpoint,
    parse_meta_properties,
    parse_partition_metadata,
    parse_producer_snapshot,
)
from sidecar.kafka.indexes import OffsetIndex, TimeIndex, TxnIndex
from sidecar.kafka.inspect import run_inspect, verify_partition
from sidecar.kafka.logdir import FileKind, scan_log_dir, segment_file_name
from sidecar.kafka.records import (
    Compression,
    ControlRecordType,
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

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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


def walk_and_decode(data: bytes, *, verify_crc: bool, tolerate_tail: bool) -> None:
    with contextlib.suppress(FormatError):
        for header in iter_batches(data, verify_crc=verify_crc, tolerate_tail=tolerate_tail):
            with contextlib.suppress(FormatError):
                decode_records(data[header.position : header.end_position], verify_crc=verify_crc)


class TestFuzzRecords:
    """Batch walks and record decoding on mutated segments."""

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


SNAPSHOT = format_producer_snapshot([ProducerSnapshotEntry(1, 2, 3, 4, 5, 6, 7, -1)] * 2)


class TestFuzzSmallFiles:
    """Index, checkpoint, metadata and snapshot parsers on random and mutated bytes."""

    @FUZZ
    @given(st.binary(max_size=200))
    def test_random_bytes(self, data: bytes) -> None:
        """Every small-file parser raises only FormatError subclasses on random bytes."""
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
        mutated = mutate(data, ops)
        for parse in (
            parse_producer_snapshot,
            parse_leader_epoch_checkpoint,
            parse_partition_metadata,
            parse_meta_properties,
        ):
            with contextlib.suppress(FormatError):
                parse(mutated)


PARTITION_FILES = [
    segment_file_name(0, FileKind.LOG),
    segment_file_name(0, FileKind.INDEX),
    segment_file_name(0, FileKind.TIMEINDEX),
    segment_file_name(5, FileKind.SNAPSHOT),
    segment_file_name(5, FileKind.LOG),
    segment_file_name(5, FileKind.INDEX),
    "leader-epoch-checkpoint",
    "partition.metadata",
]


class TestFuzzLogDir:
    """Scans, verify and inspect on a log dir with one mutated file."""

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(PARTITION_FILES), mutations)
    def test_scan_verify_inspect_never_raise(self, file_name: str, ops: list[Mutation]) -> None:
        """A corrupt file shows up as a typed problem; nothing is raised."""
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            write_meta_properties(root)
            part = write_partition(
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
            )
            path = part / file_name
            path.write_bytes(mutate(path.read_bytes(), ops))
            scan = scan_log_dir(root)
            for partition in scan.partitions:
                verify_partition(partition)
            for target in (root, part, part / segment_file_name(0, FileKind.LOG)):
                code = run_inspect(
                    target, as_json=True, verify=True, records=True, out=io.StringIO()
                )
                assert code in (0, 1)
