"""Benchmark of 1 GiB segments (Kafka's default ``segment.bytes``) against SeaweedFS, in one run:

1. Tiering: ``--segments`` rolled segments of ``--segment-mib`` MiB (one partition each) are
   tiered by the daemon's own uploader (``SegmentUploader``: CRC check of every batch, ``.log``
   in parts, indexes, manifest) with the daemon's defaults from ``sidecar/config.py``
   (``tiering.max_concurrent_uploads`` segments in flight under one semaphore as the engine
   holds it, ``s3.part_size_bytes`` parts, ``s3.max_concurrency`` parts in flight per segment,
   the S3 store built by ``open_store``, the startup heap frozen as the daemon does when
   ready). Side by side, the same bytes in ``--baseline-mib`` MiB segments (the size of the
   earlier benchmarks), in the same number of partitions. The daemon itself (``sidecar run``)
   needs a Kafka cluster for leadership and the metadata topic, so the uploader runs in a
   subprocess of its own, as ``tests/backlog.py`` runs it, with a publisher that keeps the
   events: that process's peak RSS (``VmHWM``; goal <= 300 MB), its CPU seconds per GiB of
   ``.log`` in the tiering window and its MiB/s, and the ratios large / baseline. ``--runs``
   rounds alternate the order (baseline first, then large first, ...).
2. Reads at random offsets of one tiered large segment, from a cold cache: the read server runs
   as its own process (``python -m sidecar.readserver``, as ``bench_read.py`` runs it) against
   a counting proxy in front of SeaweedFS that records every S3 request (object, Range,
   bytes). ``--probes`` one-batch records requests at random offsets (one at a time, a new
   connection each), then, on a fresh server, ``--probes`` raw ``.log`` ranges of
   ``--range-kib`` KiB at random positions (``segments/{id}/log?start=&end=``). Each with the
   default read-ahead (``read_server.prefetch_chunks``) and with it off (0). Printed: the
   chunks the probes need (those holding the returned batch or range, chunk size from
   ``read_server.chunk_size_bytes``), the ranged GETs of the ``.log`` and the bytes fetched,
   split into needed chunks, read-ahead chunks (past a needed chunk) and any other; the GETs
   of the manifest and indexes objects. The same probes then go to a second fresh server that
   reads SeaweedFS directly, for the time to first byte p50/p99 (the first probe apart: for
   records it loads the segment's manifest and offset index); the proxy's is printed too. Each
   server is warmed up on another segment first (S3 connections, code paths).

The log dirs are written with the project's builders (``sidecar.testing``: record batches of
``--batch-kib`` KiB of random values, no compression, offset and time indexes, snapshots, epoch
checkpoint). One partition directory of each size is written and hard-linked under the other
partition directories (each upload still opens and reads its file; the files are in the page
cache, as a freshly rolled segment is). Run from the repository root. At full scale the log
dirs take 2 GiB and SeaweedFS up to 4 GiB per upload run (4 runs by default; the objects of
each run but the last are deleted, yet SeaweedFS reclaims their space only when it vacuums):
check ``df -h /tmp`` first.

    flock /tmp/sidecar-bench.lock .venv/bin/python tests/bench/bench_large_segments.py
    .venv/bin/python tests/bench/bench_large_segments.py --segment-mib 64 --segments 2 --probes 8

Everything lives in a ``/tmp/bench-large-*`` directory, removed at the end unless ``--keep``;
SeaweedFS, the uploader processes and the read servers are stopped by PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import random
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sidecar.config import SidecarConfig, load_config  # noqa: E402
from sidecar.kafka.logdir import scan_partition_dir  # noqa: E402
from sidecar.kafka.records import iter_batches  # noqa: E402
from sidecar.testing import TestRecord, build_batch, write_partition  # noqa: E402
from tests.conftest import stack  # noqa: E402
from tests.sidecar_runner import read_server  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
TOPIC_LARGE = "large"
TOPIC_BASE = "baseline"
BASE = "http://localhost"


def say(text: str = "") -> None:
    print(text, flush=True)


# ---------------------------------------------------------------------------------------------
# log dirs


def templates(batch_kib: int, count: int = 8) -> list[bytes]:
    """A few batches of about ``batch_kib`` KiB of 1 KiB random values (re-based to any offset
    by the segment writer, outside the CRC)."""
    per_batch = max(1, batch_kib * 1024 // 1040)
    return [
        build_batch(
            [TestRecord(f"k{i}".encode(), os.urandom(1000)) for i in range(per_batch)],
            base_timestamp=1_700_000_000_000 + t,
        )
        for t in range(count)
    ]


def write_logs(
    log_dir: Path, topic: str, *, partitions: int, segment_mib: int, total_mib: int, batch_kib: int
) -> int:
    """Partition 0 with ``total_mib / segment_mib`` rolled segments (and a one-batch active
    one), hard-linked under partitions 1 .. ``partitions - 1``; returns the bytes of the rolled
    ``.log`` files of all partitions."""
    batches = templates(batch_kib)
    per_segment = max(1, segment_mib * MiB // len(batches[0]))
    count = max(1, total_mib // segment_mib)
    rolled = [[batches[i % len(batches)] for i in range(per_segment)] for _ in range(count)]
    first = write_partition(
        log_dir, topic, 0, [*rolled, [batches[0]]], topic_id=uuid.UUID(int=len(topic))
    )
    for p in range(1, partitions):
        other = log_dir / f"{topic}-{p}"
        other.mkdir()
        for path in first.iterdir():
            os.link(path, other / path.name)
    scan = scan_partition_dir(first)
    assert scan is not None
    assert len(scan.ready_segments) == count, scan
    return partitions * sum(s.size for s in scan.ready_segments)


# ---------------------------------------------------------------------------------------------
# the uploader's process


async def tier_child(args: argparse.Namespace) -> None:
    """The uploading process: tier every partition directory of ``--child-tier`` as the engine
    does, then print one JSON line of measurements (and record the events in ``--state``)."""
    from sidecar._aio import freeze_startup_heap
    from sidecar.metadata.store import RemoteSegmentStore
    from sidecar.observability.logging import configure_logging
    from sidecar.storage import open_store
    from sidecar.storage.keys import KeyLayout
    from sidecar.tiering.uploader import SegmentUploader
    from tests.backlog import KeptEvents

    configure_logging(level="WARNING", fmt="console")  # the uploader logs every segment
    config = load_config(None, overrides={"s3.prefix": args.prefix})
    log_dir = Path(args.child_tier)
    scans = [scan_partition_dir(d) for d in sorted(log_dir.iterdir())]
    events = KeptEvents()
    async with open_store(config.s3) as objects:
        uploader = SegmentUploader(
            objects=objects,
            publisher=events,  # type: ignore[arg-type]
            layout=KeyLayout(prefix=config.s3.prefix, hash_prefix=config.s3.hash_prefix),
            broker_id=1,
            part_size=config.s3.part_size_bytes,
            concurrency=config.s3.max_concurrency,
        )
        slots = asyncio.Semaphore(config.tiering.max_concurrent_uploads)
        gc.collect()
        freeze_startup_heap()  # as the daemon does when it turns ready
        rss_ready = _status_kib("VmRSS")
        uploads: list[tuple[int, float]] = []

        async def partition(scan: Any) -> None:
            for segment in scan.ready_segments:  # in order, a slot per upload, as the engine
                async with slots:
                    outcome = await uploader.upload(scan, segment)
                uploads.append((outcome.log_bytes, outcome.seconds))

        cpu0, t0 = _cpu(), time.monotonic()
        async with asyncio.TaskGroup() as group:
            for scan in scans:
                group.create_task(partition(scan))
        cpu1, t1 = _cpu(), time.monotonic()
    result = {
        "log_bytes": sum(size for size, _ in uploads),
        "segments": len(uploads),
        "seconds": t1 - t0,
        "cpu_seconds": cpu1 - cpu0,
        "upload_seconds": [seconds for _, seconds in uploads],
        "rss_ready_kib": rss_ready,
        "hwm_kib": _status_kib("VmHWM"),
        "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "part_size": config.s3.part_size_bytes,
        "part_concurrency": config.s3.max_concurrency,
        "max_concurrent_uploads": config.tiering.max_concurrent_uploads,
    }
    if args.state:
        store = RemoteSegmentStore(Path(args.state))
        try:
            applied = store.apply(events.events)
            assert not applied.rejected, applied.rejected
        finally:
            store.close()
    print("RESULT " + json.dumps(result), flush=True)


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _status_kib(field_name: str, pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


@dataclass
class TierRun:
    label: str
    segment_mib: int
    log_bytes: int
    segments: int
    seconds: float
    cpu_seconds: float
    hwm_mib: float
    rss_ready_mib: float
    sampled_peak_mib: float
    upload_seconds: list[float] = field(default_factory=list)

    @property
    def mib_s(self) -> float:
        return self.log_bytes / MiB / self.seconds

    @property
    def cpu_per_gib(self) -> float:
        return self.cpu_seconds * GiB / self.log_bytes


async def tier_run(
    args: argparse.Namespace,
    log_dir: Path,
    prefix: str,
    env: dict[str, str],
    label: str,
    segment_mib: int,
    state: Path | None,
    children: set[int],
) -> tuple[TierRun, dict[str, Any]]:
    """Tier ``log_dir`` in a fresh uploader process; RSS sampled every 20 ms from here too."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child-tier", str(log_dir)]
    command += ["--prefix", prefix] + (["--state", str(state)] if state else [])
    if args.profile:
        out = Path(args.profile) / f"tier-{label}-{prefix.strip('/').replace('/', '-')}.txt"
        command = [
            str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
            "--rate", "50", "-o", str(out), "--", *command,
        ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env
    )
    children.add(proc.pid)
    peak = 0
    sampling = True

    async def sample() -> None:
        nonlocal peak
        while sampling:
            for pid in _process_tree(proc.pid):
                with contextlib.suppress(OSError, ValueError):
                    if "bench_large_segments" in Path(f"/proc/{pid}/cmdline").read_text():
                        peak = max(peak, _status_kib("VmRSS", pid))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        output, _ = await proc.communicate()
    finally:
        sampling = False
        await sampler
        children.discard(proc.pid)
    lines = output.decode(errors="replace").splitlines()
    found = [line for line in lines if line.startswith("RESULT ")]
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"uploader process failed ({proc.returncode}):\n" + "\n".join(lines))
    data = json.loads(found[-1].removeprefix("RESULT "))
    return TierRun(
        label=label,
        segment_mib=segment_mib,
        log_bytes=data["log_bytes"],
        segments=data["segments"],
        seconds=data["seconds"],
        cpu_seconds=data["cpu_seconds"],
        hwm_mib=data["hwm_kib"] / 1024,
        rss_ready_mib=data["rss_ready_kib"] / 1024,
        sampled_peak_mib=peak / 1024,
        upload_seconds=data["upload_seconds"],
    ), data


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its children (py-spy runs the uploader as its child)."""
    found = [pid]
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            found += _process_tree(int(child))
    return found


async def empty_prefix(objects: Any, prefix: str) -> None:
    keys = [o.key async for o in objects.list(prefix)]
    await objects.delete(keys)


# ---------------------------------------------------------------------------------------------
# a counting proxy in front of SeaweedFS


@dataclass
class Exchange:
    """One request through the proxy."""

    method: str
    target: str
    range: tuple[int, int] | None  # inclusive, as in the Range header
    started: float
    body_bytes: int = 0
    status: int = 0


class CountingProxy:
    """Forwards HTTP/1.1 byte for byte to the upstream S3 port (signatures stay valid: the Host
    header is the proxy's, as the client signed it) and records each request. Runs its own
    event loop in a thread, so the bench's client loop does not carry the bytes."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.exchanges: list[Exchange] = []
        self.in_flight = 0
        self.last_activity = time.monotonic()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> None:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def reset(self) -> None:
        self.exchanges = []

    async def settled(self, quiet: float = 0.5) -> None:
        """Wait until no request has been in flight for ``quiet`` seconds (read-ahead done)."""
        while self.in_flight or time.monotonic() - self.last_activity < quiet:
            await asyncio.sleep(0.05)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*self.upstream)
        try:
            while True:
                try:
                    head = await client_r.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                found = headers.get("range", "")
                span = None
                if found.startswith("bytes="):
                    a, _, b = found[6:].partition("-")
                    span = (int(a), int(b)) if b else (int(a), -1)
                exchange = Exchange(method, target, span, time.monotonic())
                self.in_flight += 1
                try:
                    up_w.write(head)
                    await _copy(client_r, up_w, int(headers.get("content-length", "0")))
                    response = await up_r.readuntil(b"\r\n\r\n")
                    client_w.write(response)
                    rlines = response.decode("latin-1").split("\r\n")
                    exchange.status = int(rlines[0].split(" ", 2)[1])
                    rheaders = {
                        k.strip().lower(): v.strip()
                        for k, _, v in (line.partition(":") for line in rlines[1:] if line)
                    }
                    if method == "HEAD" or exchange.status in (204, 304):
                        pass
                    elif "content-length" in rheaders:
                        exchange.body_bytes = await _copy(
                            up_r, client_w, int(rheaders["content-length"])
                        )
                    elif "chunked" in rheaders.get("transfer-encoding", ""):
                        exchange.body_bytes = await _copy_chunked(up_r, client_w)
                    else:
                        exchange.body_bytes = await _copy(up_r, client_w, None)
                        return
                finally:
                    self.in_flight -= 1
                    self.last_activity = time.monotonic()
                    self.exchanges.append(exchange)
        finally:
            up_w.close()
            client_w.close()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, length: int | None) -> int:
    done = 0
    while length is None or done < length:
        piece = await src.read(MiB if length is None else min(MiB, length - done))
        if not piece:
            if length is None:
                break
            raise ConnectionError("short body")
        dst.write(piece)
        await dst.drain()
        done += len(piece)
    return done


async def _copy_chunked(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> int:
    done = 0
    while True:
        size_line = await src.readuntil(b"\r\n")
        dst.write(size_line)
        size = int(size_line.split(b";")[0], 16)
        done += await _copy(src, dst, size + 2) - 2
        if size == 0:  # no trailers: the last CRLF was copied above
            return done


# ---------------------------------------------------------------------------------------------
# the read server and its probes


async def timed_get(socket: Path, target: str) -> tuple[float, bytes]:
    """(seconds to the first body byte, the body) of one GET on a new connection."""
    request = f"GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
    started = time.perf_counter()
    reader, writer = await asyncio.open_unix_connection(str(socket))
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace") + (await reader.read()).decode())
        chunked = b"chunked" in head.lower()
        size_line = await reader.readuntil(b"\r\n") if chunked else b""
        first = await reader.read(1)
        seconds = time.perf_counter() - started
        body = size_line + first + await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    return seconds, _dechunk(body) if chunked else body


def _dechunk(raw: bytes) -> bytes:
    """The body of a chunked transfer encoding."""
    out = bytearray()
    at = 0
    while True:
        end = raw.index(b"\r\n", at)
        size = int(raw[at:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += raw[end + 2 : end + 2 + size]
        at = end + 2 + size + 2


@dataclass
class Layout:
    """Where the batches of the probed segment are (from the local ``.log``)."""

    positions: list[int]
    sizes: list[int]
    base_offsets: list[int]
    last_offsets: list[int]
    size: int


def segment_layout(log_path: Path) -> Layout:
    positions, sizes, bases, lasts = [], [], [], []
    for header in iter_batches(log_path, verify_crc=False):
        positions.append(header.position)
        sizes.append(header.size)
        bases.append(header.base_offset)
        lasts.append(header.last_offset)
    return Layout(positions, sizes, bases, lasts, log_path.stat().st_size)


@dataclass
class ProbeResult:
    label: str
    kind: str
    ttfb: list[float]
    needed: set[int]
    exchanges: list[Exchange]
    chunk: int
    log_size: int


async def probe_pass(
    *,
    socket: Path,
    kind: str,
    topic: str,
    segment_id: str,
    layout: Layout,
    probes: int,
    range_bytes: int,
    chunk: int,
    seed: int,
) -> tuple[list[float], set[int]]:
    """``probes`` requests at random places of partition 0's segment; (time to first byte of
    each, the chunks the answers need)."""
    rng = random.Random(seed)
    times: list[float] = []
    needed: set[int] = set()
    base = f"/v1/topics/{topic}/partitions/0"
    for _ in range(probes):
        if kind == "records":
            i = rng.randrange(len(layout.positions))
            offset = rng.randint(layout.base_offsets[i], layout.last_offsets[i])
            seconds, body = await timed_get(socket, f"{base}/records?offset={offset}&max_bytes=1")
            got = int.from_bytes(body[:8], "big")
            if got != layout.base_offsets[i]:
                raise RuntimeError(f"offset {offset}: batch {got}, not {layout.base_offsets[i]}")
            first, last = layout.positions[i], layout.positions[i] + layout.sizes[i] - 1
        else:
            first = rng.randrange(layout.size - range_bytes)
            last = first + range_bytes - 1
            seconds, body = await timed_get(
                socket, f"{base}/segments/{segment_id}/log?start={first}&end={last}"
            )
            if len(body) != range_bytes:
                raise RuntimeError(f"range {first}..{last}: {len(body)} bytes")
        times.append(seconds)
        needed.update(range(first // chunk, last // chunk + 1))
    return times, needed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report_probes(
    result: ProbeResult, probes: int, range_kib: int, *, proxied: list[float]
) -> None:
    """The S3 requests of one pass (through the proxy) and the time to first byte of the same
    probes on a server that reads SeaweedFS directly."""
    chunk = result.chunk
    logs = [e for e in result.exchanges if e.method == "GET" and ".log" in e.target]
    others = [e for e in result.exchanges if not (e.method == "GET" and ".log" in e.target)]
    fetched: dict[str, int] = {"needed": 0, "read-ahead": 0, "other": 0}
    chunks_fetched: list[int] = []
    for e in logs:
        start, end = e.range if e.range else (0, result.log_size - 1)
        for index in range(start // chunk, end // chunk + 1):
            chunks_fetched.append(index)
            piece = min(end, (index + 1) * chunk - 1) - max(start, index * chunk) + 1
            if index in result.needed:
                fetched["needed"] += piece
            elif any(0 < index - n <= 16 for n in result.needed):
                fetched["read-ahead"] += piece
            else:
                fetched["other"] += piece
    twice = len(chunks_fetched) - len(set(chunks_fetched))
    needed_bytes = sum(min(result.log_size, (i + 1) * chunk) - i * chunk for i in result.needed)
    body = sum(e.body_bytes for e in logs)
    what = (
        "one-batch records requests at random offsets"
        if result.kind == "records"
        else f"{range_kib} KiB .log ranges at random positions"
    )
    say(f"    {result.label}: {probes} {what}")
    say(
        f"      chunks needed          {len(result.needed):4d}  ({needed_bytes / MiB:7.1f} MiB;"
        f" chunk {chunk // MiB} MiB, segment {result.log_size / MiB:.0f} MiB ="
        f" {-(-result.log_size // chunk)} chunks)"
    )
    say(
        f"      .log GETs              {len(logs):4d}  ({body / MiB:7.1f} MiB fetched:"
        f" {fetched['needed'] / MiB:.1f} needed, {fetched['read-ahead'] / MiB:.1f} read-ahead,"
        f" {fetched['other'] / MiB:.1f} other; {twice} chunks fetched twice)"
    )
    say(
        f"      fetched / needed      {body / needed_bytes:5.2f} x   "
        f"(of the whole segment: {body / result.log_size * 100:.1f} %)"
    )
    kinds: dict[str, int] = {}
    for e in others:
        name = e.target.split("?")[0].rsplit(".", 1)[-1] if e.method == "GET" else e.method
        kinds[name] = kinds.get(name, 0) + 1
    other_bytes = sum(e.body_bytes for e in others)
    described = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
    say(f"      other S3 requests      {len(others):4d}  ({described}; {other_bytes // 1024} KiB)")
    for name, times in (("time to first byte", result.ttfb), ("  through the proxy", proxied)):
        rest = times[1:] or times
        say(
            f"      {name:<22} first probe {times[0] * 1000:.1f} ms, then p50"
            f" {percentile(rest, 0.5) * 1000:.1f} ms, p99 {percentile(rest, 0.99) * 1000:.1f} ms,"
            f" max {max(rest) * 1000:.1f} ms"
        )


# ---------------------------------------------------------------------------------------------
# the run


async def amain(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="bench-large-", dir="/tmp"))
    children: set[int] = set()
    proxy: CountingProxy | None = None
    s3 = stack.SeaweedS3.create(root / "s3")
    try:
        say(f"working directory {root}")
        say(
            f"machine: {platform.machine()}, {os.cpu_count()} cores,"
            f" {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GiB:.0f} GiB,"
            f" Python {platform.python_version()}; load average"
            f" {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        await asyncio.to_thread(s3.start)
        env = {
            **os.environ,
            "SIDECAR_S3__ENDPOINT_URL": s3.endpoint,
            "SIDECAR_S3__BUCKET": s3.bucket,
            "SIDECAR_S3__ACCESS_KEY_ID": s3.access_key,
            "SIDECAR_S3__SECRET_ACCESS_KEY": s3.secret_key,
        }
        total_mib = args.segments * args.segment_mib
        t0 = time.monotonic()
        large_bytes = await asyncio.to_thread(
            write_logs, root / "logs-large", TOPIC_LARGE, partitions=args.segments,
            segment_mib=args.segment_mib, total_mib=args.segment_mib, batch_kib=args.batch_kib,
        )  # fmt: skip
        base_bytes = await asyncio.to_thread(
            write_logs, root / "logs-base", TOPIC_BASE, partitions=args.segments,
            segment_mib=args.baseline_mib, total_mib=args.segment_mib, batch_kib=args.batch_kib,
        )  # fmt: skip
        gc.collect()
        say(
            f"log dirs: {args.segments} partitions x 1 segment of {args.segment_mib} MiB"
            f" ({large_bytes / MiB:.0f} MiB) and {args.segments} partitions x"
            f" {max(1, args.segment_mib // args.baseline_mib)} segments of {args.baseline_mib} MiB"
            f" ({base_bytes / MiB:.0f} MiB); batches of {len(templates(args.batch_kib, 1)[0])}"
            f" bytes; written in {time.monotonic() - t0:.1f} s (total {total_mib} MiB each)"
        )
        config = load_config(None, overrides={"s3.bucket": s3.bucket})
        say(
            f"uploader: tiering.max_concurrent_uploads={config.tiering.max_concurrent_uploads},"
            f" s3.part_size_bytes={config.s3.part_size_bytes // MiB} MiB,"
            f" s3.max_concurrency={config.s3.max_concurrency} (daemon defaults); one process per"
            " run, RSS sampled every 20 ms, CPU over the tiering window"
        )
        from sidecar.storage.s3 import S3ObjectStore

        objects = S3ObjectStore(
            bucket=s3.bucket,
            endpoint_url=s3.endpoint,
            access_key_id=s3.access_key,
            secret_access_key=s3.secret_key,
        )
        await objects.__aenter__()
        try:
            runs = await tiering(args, root, env, objects, children)
            read_prefix = runs["read_prefix"]
        finally:
            await objects.aclose()
        if args.probes <= 0:
            return 0
        proxy = CountingProxy("127.0.0.1", s3.s3_port)
        proxy.start()
        await reads(args, root, env, s3, proxy, read_prefix)
        return 0
    finally:
        for pid in list(children):  # only on an error: each run waits for its processes
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if proxy is not None:
            proxy.stop()
        await asyncio.to_thread(s3.stop)
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


async def tiering(
    args: argparse.Namespace, root: Path, env: dict[str, str], objects: Any, children: set[int]
) -> dict[str, Any]:
    results: dict[str, list[TierRun]] = {"large": [], "base": []}
    read_prefix = ""
    order = []
    for run in range(args.runs):
        pair = ["base", "large"] if run % 2 == 0 else ["large", "base"]
        order += [(run, which) for which in pair]
    last_large = max(i for i, (_, which) in enumerate(order) if which == "large")
    state = root / "state"
    for i, (run, which) in enumerate(order):
        prefix = f"bench-large/{which}-{run}/"
        keep = i == last_large
        log_dir = root / ("logs-large" if which == "large" else "logs-base")
        mib = args.segment_mib if which == "large" else args.baseline_mib
        found, _ = await tier_run(
            args, log_dir, prefix, env, which, mib, state if keep else None, children
        )
        results[which].append(found)
        say(
            f"  run {run + 1} {which:<5} {found.segments:3d} x {mib:4d} MiB:"
            f" {found.log_bytes / MiB:6.0f} MiB in {found.seconds:6.2f} s ="
            f" {found.mib_s:6.1f} MiB/s, {found.cpu_per_gib:.2f} CPU-s/GiB,"
            f" peak RSS {found.hwm_mib:.0f} MiB (sampled {found.sampled_peak_mib:.0f},"
            f" {found.rss_ready_mib:.0f} before the first upload);"
            f" per upload {statistics.median(found.upload_seconds):.2f} s median"
        )
        if keep:
            read_prefix = prefix
        else:
            await empty_prefix(objects, prefix)
    large, base = results["large"], results["base"]

    def med(runs: list[TierRun], attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in runs)

    say(f"(1) tiering {large[0].log_bytes / MiB:.0f} MiB, medians of {args.runs} run(s)")
    say(f"    {'':<26}{'MiB/s':>8}{'CPU-s/GiB':>11}{'peak RSS MiB':>14}")
    for label, runs in ((f"{args.segment_mib} MiB segments", large),
                        (f"{args.baseline_mib} MiB segments (baseline)", base)):  # fmt: skip
        say(
            f"    {label:<26}{med(runs, 'mib_s'):8.1f}{med(runs, 'cpu_per_gib'):11.2f}"
            f"{max(r.hwm_mib for r in runs):14.0f}"
        )
    ratio_speed = med(large, "mib_s") / med(base, "mib_s")
    ratio_cpu = med(large, "cpu_per_gib") / med(base, "cpu_per_gib")
    peak = max(r.hwm_mib for r in large) * MiB / 1e6
    say(
        f"    ratio large / baseline    {ratio_speed:8.2f}{ratio_cpu:11.2f}"
        f"{max(r.hwm_mib for r in large) / max(r.hwm_mib for r in base):14.2f}"
    )
    say(
        f"    peak RSS of the uploading process with {args.segment_mib} MiB segments:"
        f" {peak:.0f} MB (goal <= 300 MB: {'met' if peak <= 300 else 'NOT met'})"
    )
    return {"read_prefix": read_prefix, "large": large, "base": base}


async def reads(
    args: argparse.Namespace,
    root: Path,
    env: dict[str, str],
    s3: Any,
    proxy: CountingProxy,
    prefix: str,
) -> None:
    state = root / "state"
    configs = {}
    for name, endpoint in (("counted", f"http://127.0.0.1:{proxy.port}"), ("direct", s3.endpoint)):
        path = root / f"read-{name}.toml"
        path.write_text(
            f'state_dir = "{state}"\n'
            f'[s3]\nendpoint_url = "{endpoint}"\nbucket = "{s3.bucket}"\nprefix = "{prefix}"\n'
            f'[logging]\nformat = "json"\nlevel = "INFO"\n'
        )
        configs[name] = path
    defaults: SidecarConfig = load_config(None, overrides={"s3.bucket": s3.bucket})
    chunk = defaults.read_server.chunk_size_bytes
    layout = await asyncio.to_thread(
        segment_layout, root / "logs-large" / f"{TOPIC_LARGE}-0" / "00000000000000000000.log"
    )
    say(
        f"(2) reads of one tiered {layout.size / MiB:.0f} MiB segment ({len(layout.positions)}"
        f" batches), cold cache; read_server defaults: chunk_size_bytes={chunk // MiB} MiB,"
        f" prefetch_chunks={defaults.read_server.prefetch_chunks}; S3 requests counted by a"
        " proxy in front of SeaweedFS"
    )
    # the endpoint comes from each config file (SIDECAR_* variables would override it)
    env = {k: v for k, v in env.items() if k != "SIDECAR_S3__ENDPOINT_URL"}
    ids: dict[int, str] = {}
    n = 0
    for seed, kind in enumerate(("records", "ranges")):
        for label, settings in (
            ("default read-ahead", ()),
            ("read-ahead off", ("read_server.prefetch_chunks=0",)),
        ):
            found: dict[str, tuple[list[float], set[int], list[Exchange]]] = {}
            for which in ("counted", "direct"):  # the same probes, through the proxy and not
                n += 1
                async with read_server(root, configs[which], env, f"r{n}", *settings) as (
                    socket,
                    _pid,
                ):
                    if not ids:
                        for p in (0, 1):
                            _, listing = await timed_get(
                                socket, f"/v1/topics/{TOPIC_LARGE}/partitions/{p}/segments"
                            )
                            ids[p] = json.loads(listing)["segments"][0]["segment_id"]
                    # warm up on partition 1's segment (S3 connections, code paths): its
                    # manifest and indexes, no .log
                    await timed_get(
                        socket,
                        f"/v1/topics/{TOPIC_LARGE}/partitions/1/segments/{ids[1]}/indexes/offset",
                    )
                    await proxy.settled()
                    proxy.reset()
                    times, needed = await probe_pass(
                        socket=socket, kind=kind, topic=TOPIC_LARGE, segment_id=ids[0],
                        layout=layout, probes=args.probes, range_bytes=args.range_kib * 1024,
                        chunk=chunk, seed=seed,
                    )  # fmt: skip
                    await proxy.settled()
                    found[which] = (times, needed, list(proxy.exchanges))
            counted, direct = found["counted"], found["direct"]
            report_probes(
                ProbeResult(label, kind, direct[0], counted[1], counted[2], chunk, layout.size),
                args.probes,
                args.range_kib,
                proxied=counted[0],
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segment-mib", type=int, default=1024, help="the large segment size")
    parser.add_argument("--segments", type=int, default=4, help="large segments (partitions)")
    parser.add_argument("--baseline-mib", type=int, default=32, help="baseline segment size")
    parser.add_argument("--batch-kib", type=int, default=16, help="record batch size (KiB)")
    parser.add_argument("--runs", type=int, default=2, help="rounds of baseline + large")
    parser.add_argument("--probes", type=int, default=32, help="reads per pass (0: no reads)")
    parser.add_argument("--range-kib", type=int, default=64, help="size of each .log range read")
    parser.add_argument("--profile", metavar="DIR", help="record the uploaders with py-spy")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--child-tier", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile and not (Path(sys.executable).parent / "py-spy").exists():
        parser.error("--profile needs py-spy beside this interpreter: pip install py-spy")
    if args.child_tier:
        asyncio.run(tier_child(args))
        return 0
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
