"""Benchmark of the read path against SeaweedFS, in one run, side by side:

1. Cold sequential read: a consumer reads a partition from offset 0 to the end through the Unix
   socket (``records?offset=N&max_bytes=32 MiB``, streamed; the next offset follows the batch
   headers as they arrive), each run on a freshly started read server with an empty cache
   (warmed up on another partition first: S3 connections, imports; with ``--full-cache-mib``,
   a cache of that budget filled with other data first, a long-running server's steady state in
   which every chunk written evicts one), vs direct ranged GETs of
   the same ``.log`` objects from this process (one GET of ``chunk_size`` at a time, in order:
   what a client reading the bucket itself would do) through botocore (an SDK's client: the
   goal's baseline) and through the sidecar's raw HTTP client (``s3.raw_range_gets``, what the
   read server's own GETs use), and whole-object GETs. Interleaved runs, medians; the ratio
   per run, and the CPU seconds per GiB read of this process, the read server and SeaweedFS
   for each contender (from ``/proc``). The first run starts once the tiered data is written
   back and SeaweedFS is idle (:func:`settle`).
2. Warm read: the same read again with every chunk in the disk cache (records, and raw
   ``segments/{id}/log`` ranges), in GiB/s, and one 64 MiB records response read by ``curl``
   (when installed: the server without this script's Python client); and the time to first
   byte of one-batch requests at random offsets (a new connection each), p50/p99. Side by
   side: the default server (planned responses sent from the chunk files with ``sendfile``)
   and one with ``read_server.sendfile=false`` (every response read through memory, CRC
   walk included: the path before planned responses).
3. 64 concurrent readers, each on its own partition, cold: errors (must be none), aggregate
   throughput and the slowest reader.
4. JSON readers: ``--json-readers`` concurrent readers of ``format=json`` (records decoded and
   encoded by the server), each on its own partition, and one on the sequential partition, on a
   fresh server (cold cache), while a probe requests ``/v1/version`` every 20 ms (as the
   kubelet's probe would ask ``/healthz``). The server's event-loop lag comes from its watchdog
   (``event_loop_lag_summary`` when it stops): p99 and max, goal p99 < 100 ms.

The read server runs as its own process (``python -m sidecar.readserver``), as the daemon's read
server would, so client and server do not share a core's event loop. Segments are real Kafka
record batches (``sidecar.testing`` builders, 16 KiB batches of 1 KiB random values, no
compression), tiered the way the uploader tiers them (``.log``, packed indexes, manifest) and
recorded as COPY_SEGMENT_FINISHED in the state dir's metadata store.

    .venv/bin/python tests/bench/bench_read.py                 # 256 MiB + 64 x 2 MiB, 3 runs
    .venv/bin/python tests/bench/bench_read.py --mib 64 --runs 1 --readers-mib 1
    .venv/bin/python tests/bench/bench_read.py --cold-only --runs 5 \
        --server-set read_server.prefetch_chunks=4              # part 1, another setting
    .venv/bin/python tests/bench/bench_read.py --cold-only --runs 3 --mib 1024 \
        --server-set read_server.max_concurrent_fetches=4    # read-ahead never past 2 GETs
    .venv/bin/python tests/bench/bench_read.py --json-only --mib 64 --readers 8   # part 4 only
    .venv/bin/python tests/bench/bench_read.py --cold-only --s3-latency-ms 20      # a far S3
    .venv/bin/python tests/bench/bench_read.py --cold-only --s3-latency-ms 20 \
        --s3-mb-per-s 90 --direct-in-flight 2       # and 90 MB/s per connection, GETs ahead

``--s3-latency-ms`` puts ``_latency_proxy`` between SeaweedFS and the readers (the read server
and the direct GETs): every request reaches SeaweedFS that much later, the first-byte latency
of an object store that is not on loopback, where how many GETs a reader keeps in flight
decides its throughput. ``--s3-mb-per-s`` caps each connection's responses too (Amazon S3
gives a connection about 85-90 MB/s), and ``--direct-in-flight`` lets the direct GETs keep
that many GETs ahead, as the read server does, for a baseline that is not latency bound.

Everything lives in a ``/tmp/bench-read-*`` directory, removed at the end unless ``--keep``;
SeaweedFS and the read servers are stopped by PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import platform
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from sidecar.metadata.events import TopicIdPartition  # noqa: E402
from sidecar.metadata.store import RemoteSegmentStore  # noqa: E402
from sidecar.storage.keys import KeyLayout, ObjectSuffix  # noqa: E402
from sidecar.storage.s3 import S3ObjectStore  # noqa: E402
from sidecar.testing import TestRecord, build_batch  # noqa: E402
from tests.bench import _latency_proxy as latency_proxy  # noqa: E402
from tests.conftest import stack  # noqa: E402
from tests.sidecar_runner import read_server  # noqa: E402
from tests.unit.readserver._tiered import Remote  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
SEGMENT_MIB = 16
BATCH_RECORDS = 16
CHUNK = 4 * MiB
BASE = "http://localhost"


def say(text: str) -> None:
    print(text, flush=True)


def templates(count: int = 8) -> list[bytes]:
    """A few 16 KiB batches of random 1 KiB values; re-based to any offset (outside the CRC)."""
    return [
        build_batch(
            [
                TestRecord(key=f"k{i}".encode(), value=os.urandom(1000), headers=[("h", b"v")])
                for i in range(BATCH_RECORDS)
            ],
            base_timestamp=1_700_000_000_000 + t,
        )
        for t in range(count)
    ]


async def tier(
    remote: Remote, tp: TopicIdPartition, mib: float, segment_mib: float, batches: list[bytes]
) -> int:
    """Tier ``mib`` of batches into segments of ``segment_mib``; returns the log bytes."""
    per_segment = max(1, int(segment_mib * MiB) // len(batches[0]))
    total_batches = max(1, int(mib * MiB) // len(batches[0]))
    offset = 0
    size = 0
    done = 0
    while done < total_batches:
        n = min(per_segment, total_batches - done)
        chosen = [batches[(done + i) % len(batches)] for i in range(n)]
        segment = await remote.upload(offset, chosen, tp=tp)
        offset = segment.end_offset + 1
        size += segment.segment_size_in_bytes
        done += n
        remote.logs.clear()  # keep memory flat: the bench compares bytes by size only
    return size


# ---------------------------------------------------------------------------------------------
# the read server as a process


def session(socket: Path, limit: int = 8) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(socket), limit=limit),
        timeout=aiohttp.ClientTimeout(total=None, sock_read=120),
        auto_decompress=False,
    )


class NextOffset:
    """Follows the batch headers of a raw records stream piece by piece (nothing accumulated):
    after the stream, ``next_offset`` is the offset after its last batch."""

    HEAD = 27  # baseOffset .. lastOffsetDelta

    def __init__(self) -> None:
        self.received = 0
        self.next_header = 0
        self.next_offset: int | None = None
        self._tail = b""  # the stream's last bytes, for a header cut between pieces

    def feed(self, piece: bytes) -> None:
        start = self.received
        end = self.received = start + len(piece)
        while self.next_header + self.HEAD <= end:
            at = self.next_header - start
            if at >= 0:
                head = piece[at : at + self.HEAD]
            else:
                early = self._tail[len(self._tail) + at :]
                head = early + piece[: self.HEAD - len(early)]
            base, length = struct.unpack_from(">qi", head)
            (delta,) = struct.unpack_from(">i", head, 23)
            self.next_offset = base + delta + 1
            self.next_header += length + 12
        self._tail = bytes(piece[-64:]) if len(piece) >= 64 else (self._tail + piece)[-64:]


async def read_partition(
    http: aiohttp.ClientSession, topic: str, partition: int, *, max_bytes: int = 32 * MiB
) -> int:
    """A sequential consumer: records from offset 0 to the end, streamed (batch boundaries are
    followed as the bytes arrive, nothing is accumulated); returns the bytes read."""
    offset = 0
    total = 0
    url = f"{BASE}/v1/topics/{topic}/partitions/{partition}/records"
    while True:
        params = {"offset": str(offset), "max_bytes": str(max_bytes)}
        tracker = NextOffset()
        async with http.get(url, params=params) as response:
            if response.status == 416:
                await response.read()
                return total
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {await response.text()}")
            async for piece in response.content.iter_chunked(4 * MiB):
                tracker.feed(piece)
        if tracker.received == 0:  # right after the tiered range: the end of the log
            return total
        total += tracker.received
        if tracker.next_offset is None or tracker.next_header != tracker.received:
            raise RuntimeError(f"a truncated response at offset {offset}")
        offset = tracker.next_offset


async def read_partition_json(
    http: aiohttp.ClientSession, topic: str, partition: int, *, max_bytes: int = 8 * MiB
) -> int:
    """A sequential consumer of ``format=json``: pages from offset 0 to the end (the next offset
    from each page's tail); returns the JSON bytes read."""
    offset = 0
    total = 0
    url = f"{BASE}/v1/topics/{topic}/partitions/{partition}/records"
    while True:
        params = {"offset": str(offset), "max_bytes": str(max_bytes), "format": "json"}
        async with http.get(url, params=params) as response:
            if response.status == 416:
                await response.read()
                return total
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {await response.text()}")
            tail = b""
            async for piece in response.content.iter_chunked(4 * MiB):
                total += len(piece)
                tail = (tail + piece[-64:])[-64:]
        at = tail.rfind(b'"next_offset":')
        if at < 0 or not tail.endswith(b"}"):
            raise RuntimeError(f"a truncated JSON response at offset {offset}")
        following = int(tail[at + len(b'"next_offset":') : -1])
        if following == offset:
            return total  # no records: the end of the tiered range, like a fetch at the log end
        if following < offset:
            raise RuntimeError(f"next offset {following} went back from {offset}")
        offset = following


async def json_readers(
    args: argparse.Namespace, root: Path, config: Path, env: dict[str, str]
) -> None:
    """Part (4): concurrent JSON readers and a /v1/version probe; the server's loop lag."""
    logs: list[dict[str, Any]] = []
    probes: list[float] = []
    readers = min(args.json_readers, args.readers)
    async with (
        read_server(root, config, env, "json", *args.server_set, logs=logs) as (socket, _pid),
        session(socket, limit=readers + 2) as http,
    ):
        done = asyncio.Event()

        async def probe() -> None:
            async with session(socket, limit=1) as own:
                while not done.is_set():
                    t0 = time.perf_counter()
                    async with own.get(f"{BASE}/v1/version") as response:
                        await response.read()
                    probes.append(time.perf_counter() - t0)
                    await asyncio.sleep(0.02)

        async def reader(topic: str, p: int) -> tuple[int, str | None]:
            try:
                return await read_partition_json(http, topic, p), None
            except Exception as exc:  # noqa: BLE001 - counted as an error
                return 0, repr(exc)

        prober = asyncio.create_task(probe())
        t0 = time.perf_counter()
        results = await asyncio.gather(
            reader("bench", 0), *(reader("readers", p) for p in range(readers))
        )
        wall = time.perf_counter() - t0
        done.set()
        await prober
    summary = [e for e in logs if e.get("event") == "event_loop_lag_summary"]
    blocked = [e for e in logs if e.get("event") == "event_loop_blocked"]
    errors = [e for _, e in results if e]
    total = sum(got for got, _ in results)
    say(
        f"(4) {readers} JSON readers (one partition each) + one on the {args.mib:.0f} MiB one, cold"
    )
    say(f"    errors                                   {len(errors)}{errors[:3] if errors else ''}")
    say(
        f"    JSON read                                {mib_s(total, wall)} ({total / MiB:.0f} MiB)"
    )
    if summary:
        lag = summary[-1]
        p99, worst = float(lag["p99_seconds"]), float(lag["max_seconds"])
        busy = float(lag.get("max_loop_cpu_seconds", 0.0))
        say(
            f"    server event-loop lag                    p99 {p99 * 1000:.1f} ms, max"
            f" {worst * 1000:.1f} ms over {lag['measurements']} measurements,"
            f" {len(blocked)} blocked > 100 ms   (goal p99 < 100 ms:"
            f" {'met' if p99 < 0.1 else 'NOT met'})"
        )
        cpu = ", ".join(f"{e['lag_seconds']}/{e['loop_cpu_seconds']}" for e in blocked[:8])
        say(
            f"    loop thread CPU in one 50 ms interval    max {busy * 1000:.1f} ms"
            f"{'; blocked lag/CPU s: ' + cpu if cpu else ''}"
        )
    else:
        say("    server event-loop lag                    (no event_loop_lag_summary logged)")
    say(
        f"    /v1/version probe, {len(probes)} requests    p50 {percentile(probes, 0.5) * 1000:.1f}"
        f" ms, p99 {percentile(probes, 0.99) * 1000:.1f} ms, max {max(probes) * 1000:.1f} ms"
        " (this client's loop included)"
    )


async def read_ranges(
    http: aiohttp.ClientSession, topic: str, partition: int, segments: list[dict[str, Any]]
) -> int:
    """Each segment's whole .log through ``segments/{id}/log`` (fetchLogSegment)."""
    total = 0
    for segment in segments:
        url = (
            f"{BASE}/v1/topics/{topic}/partitions/{partition}/segments/{segment['segment_id']}/log"
        )
        async with http.get(url) as response:
            response.raise_for_status()
            async for piece in response.content.iter_chunked(4 * MiB):
                total += len(piece)
    return total


async def direct_gets(
    objects: S3ObjectStore, keys: list[tuple[str, int]], chunk: int, in_flight: int = 1
) -> int:
    """Every object in ranges of ``chunk``, in order, with ``in_flight`` GETs started ahead
    (1: one at a time); a reader would consume each range in order as its GET ends."""
    ranges = [
        (key, start, min(start + chunk, size) - 1)
        for key, size in keys
        for start in range(0, size, chunk)
    ]
    total = 0
    pending: collections.deque[asyncio.Task[bytes | memoryview]] = collections.deque()
    for key, start, end in ranges:
        pending.append(asyncio.create_task(objects.get_range(key, start, end)))
        if len(pending) >= in_flight:
            total += len(await pending.popleft())
    while pending:
        total += len(await pending.popleft())
    return total


async def ttfb(socket: Path, topic: str, offsets: list[int]) -> list[float]:
    """Seconds to the first body byte of one-batch records requests, a new connection each."""
    found = []
    for offset in offsets:
        request = (
            f"GET /v1/topics/{topic}/partitions/0/records?offset={offset}&max_bytes=1 HTTP/1.1\r\n"
            "Host: localhost\r\nConnection: close\r\n\r\n"
        ).encode()
        started = time.perf_counter()
        reader, writer = await asyncio.open_unix_connection(str(socket))
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:100]
        if b"chunked" in head.lower():
            await reader.readuntil(b"\r\n")  # the first chunk's size
        first = await reader.read(1)  # planned responses have a Content-Length
        found.append(time.perf_counter() - started)
        assert first, head
        await reader.read()
        writer.close()
        await writer.wait_closed()
    return found


async def curl_records(socket: Path, topic: str, runs: int) -> tuple[int, float]:
    """(bytes, seconds) of the fastest of ``runs`` 64 MiB records responses read by curl: the
    server's side without this script's Python client."""
    best: tuple[int, float] | None = None
    url = f"http://localhost/v1/topics/{topic}/partitions/0/records?offset=0&max_bytes={64 * MiB}"
    for _ in range(runs):
        proc = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--unix-socket", str(socket), url, "-o", "/dev/null",
            "-w", "%{size_download} %{time_total}", stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await proc.communicate()
        size, seconds = out.decode().split()
        found = (int(size), float(seconds))
        if best is None or found[0] / found[1] > best[0] / best[1]:
            best = found
    assert best is not None
    return best


def ratios(direct: list[float], cold: list[float]) -> str:
    return " ".join(f"{d / c:.2f}" for d, c in zip(direct, cold, strict=True))


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def settle(pid: int | None, *, idle_share: float = 0.05, timeout: float = 60.0) -> float:
    """Flush the page cache's dirty pages and wait until ``pid`` (SeaweedFS) uses less than
    ``idle_share`` of a core over half a second: the data just tiered is on disk and the
    store done with it, so the first contender of the first run does not read while the
    kernel writes back and the store compacts. Returns the seconds waited."""
    started = time.monotonic()
    await asyncio.to_thread(os.sync)
    while time.monotonic() - started < timeout:
        before = cpu_seconds(pid)
        await asyncio.sleep(0.5)
        if cpu_seconds(pid) - before < idle_share * 0.5:
            break
    return time.monotonic() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def gib_s(size: int, seconds: float) -> str:
    return f"{size / GiB / seconds:6.2f} GiB/s"


def mib_s(size: int, seconds: float) -> str:
    return f"{size / MiB / seconds:7.1f} MiB/s"


async def main_async(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-read-"))
    s3 = stack.SeaweedS3.create(root / "s3")
    s3.start()
    args.weed_pid_file = s3.pid_file
    proxy: subprocess.Popen[bytes] | None = None
    args.read_endpoint = s3.endpoint
    try:
        if args.s3_latency_ms > 0 or args.s3_mb_per_s > 0:
            proxy, args.read_endpoint = latency_proxy.start(
                s3.endpoint, args.s3_latency_ms, args.s3_mb_per_s
            )
        await bench(args, root, s3)
    finally:
        if proxy is not None:
            proxy.kill()
            proxy.wait()
        s3.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            say(f"kept {root}")


async def s3_store(s3: Any, endpoint: str, *, raw: bool = True) -> S3ObjectStore:
    """The sidecar's S3 client for SeaweedFS at ``endpoint``, its ranged GETs through the raw
    client or (``raw=False``) botocore (the caller closes it)."""
    objects = S3ObjectStore(
        bucket=s3.bucket,
        endpoint_url=endpoint,
        access_key_id=s3.access_key,
        secret_access_key=s3.secret_key,
        raw_range_gets=raw,
    )
    await objects.__aenter__()
    return objects


async def bench(args: argparse.Namespace, root: Path, s3: Any) -> None:
    prefix = f"bench-read-{uuid.uuid4().hex[:6]}/"
    layout = KeyLayout(prefix=prefix)
    state = root / "state"
    store = RemoteSegmentStore(state)
    objects = await s3_store(s3, s3.endpoint)
    try:
        remote = Remote(store, objects, root / "segments", layout=layout)  # type: ignore[arg-type]
        batches = templates()
        big = TopicIdPartition(uuid.uuid4(), "bench", 0)
        started = time.monotonic()
        size = await tier(remote, big, args.mib, SEGMENT_MIB, batches)
        if args.full_cache_mib:
            filler = TopicIdPartition(uuid.uuid4(), "filler", 0)
            await tier(remote, filler, args.full_cache_mib, SEGMENT_MIB, batches)
        many = [TopicIdPartition(big.topic_id, "bench", p) for p in range(1, args.readers + 1)]
        many_topic = TopicIdPartition(uuid.uuid4(), "readers", 0).topic_id
        for p in range(args.readers):
            await tier(
                remote,
                TopicIdPartition(many_topic, "readers", p),
                args.readers_mib,
                args.readers_mib,
                batches,
            )
        shutil.rmtree(root / "segments", ignore_errors=True)
        # as the read server does once it serves (and the daemon once ready): the startup heap
        # (botocore's S3 model) out of the cyclic GC's walks, so the direct GETs of this
        # process do not pay full collections the server does not pay
        gc.collect()
        gc.freeze()
        del many
        say(
            f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}; load average {os.getloadavg()[0]:.1f}"
        )
        say(
            f"tiered {size / MiB:.0f} MiB in {SEGMENT_MIB} MiB segments + {args.readers} "
            f"partitions x {args.readers_mib} MiB in {time.monotonic() - started:.1f} s"
        )
        keys = [
            (
                layout.segment_key(
                    topic=s.segment_id.topic_id_partition.topic,
                    topic_id=s.segment_id.topic_id_partition.topic_id,
                    partition=s.segment_id.topic_id_partition.partition,
                    base_offset=s.start_offset,
                    segment_id=s.segment_id.id,
                    suffix=ObjectSuffix.LOG,
                ),
                s.segment_size_in_bytes,
            )
            for s in remote.segments
            if s.segment_id.topic_id_partition == big
        ]
        config = root / "read.toml"
        config.write_text(
            f'state_dir = "{state}"\n'
            f'[s3]\nendpoint_url = "{args.read_endpoint}"\n'
            f'bucket = "{s3.bucket}"\nprefix = "{prefix}"\n'
            f"[read_server]\ncache_size_bytes = {4 * GiB}\nchunk_size_bytes = {CHUNK}\n"
            f'[logging]\nformat = "json"\nlevel = "INFO"\n'
        )
        env = {
            **os.environ,
            "SIDECAR_S3__ACCESS_KEY_ID": s3.access_key,
            "SIDECAR_S3__SECRET_ACCESS_KEY": s3.secret_key,
        }
        # the direct GETs go through the proxy too, when there is one
        reading = await s3_store(s3, args.read_endpoint)
        sdk = await s3_store(s3, args.read_endpoint, raw=False)
        try:
            if not args.json_only:
                await run_bench(args, root, config, env, {"raw": reading, "sdk": sdk}, keys, size)
        finally:
            await reading.aclose()
            await sdk.aclose()
        if not args.cold_only:
            await json_readers(args, root, config, env)
    finally:
        await objects.aclose()
        store.close()


async def run_bench(
    args: argparse.Namespace,
    root: Path,
    config: Path,
    env: dict[str, str],
    stores: dict[str, S3ObjectStore],
    keys: list[tuple[str, int]],
    size: int,
) -> None:
    objects = stores["raw"]
    cold: list[float] = []
    direct: list[float] = []
    raw: list[float] = []
    whole: list[float] = []
    weed = stack.read_pid(args.weed_pid_file)
    #: CPU seconds per contender: (this process, the read server, SeaweedFS)
    cpu: dict[str, list[tuple[float, float, float]]] = {
        "socket": [],
        "direct": [],
        "raw": [],
        "whole": [],
    }
    orders: list[str] = []
    settled = await settle(weed)
    say(f"settled in {settled:.1f} s (dirty pages written, SeaweedFS idle)")
    for run in range(args.runs):
        order = ["socket", "direct", "raw", "whole"]
        order = order[run % 4 :] + order[: run % 4]
        orders.append(" ".join(order))
        for contender in order:
            t0 = time.perf_counter()
            c0 = (time.process_time(), 0.0, cpu_seconds(weed))
            if contender == "socket":
                settings = list(args.server_set)
                if args.full_cache_mib:
                    settings.append(f"read_server.cache_size_bytes={args.full_cache_mib * MiB}")
                async with (
                    read_server(root, config, env, f"cold{run}", *settings) as (socket, pid),
                    session(socket) as http,
                ):
                    # the process is warmed up on other data (S3 connections, imports): only
                    # the data read is cold
                    await read_partition(http, "readers", run % args.readers)
                    if args.full_cache_mib:  # a cache at its budget: each chunk evicts one
                        await read_partition(http, "filler", 0)
                    c0 = (time.process_time(), cpu_seconds(pid), cpu_seconds(weed))
                    t0 = time.perf_counter()
                    got = await read_partition(http, "bench", 0)
                    cold.append(time.perf_counter() - t0)
                    c1 = (time.process_time(), cpu_seconds(pid), cpu_seconds(weed))
            elif contender in ("direct", "raw"):
                client = stores["sdk" if contender == "direct" else "raw"]
                got = await direct_gets(client, keys, CHUNK, args.direct_in_flight)
                (direct if contender == "direct" else raw).append(time.perf_counter() - t0)
                c1 = (time.process_time(), 0.0, cpu_seconds(weed))
            else:
                got = sum([len(await objects.get(key)) for key, _ in keys])
                whole.append(time.perf_counter() - t0)
                c1 = (time.process_time(), 0.0, cpu_seconds(weed))
            cpu[contender].append((c1[0] - c0[0], c1[1] - c0[1], c1[2] - c0[2]))
            assert got == size, (contender, got, size)
    ranged = statistics.median(direct)
    say(f"(1) cold sequential read of {size / MiB:.0f} MiB, medians of {args.runs} runs")
    cache = "full cache" if args.full_cache_mib else "empty cache"
    say(f"    socket records ({cache})             {mib_s(size, statistics.median(cold))}")
    flight = "in order" if args.direct_in_flight == 1 else f"{args.direct_in_flight} ahead"
    say(f"    direct ranged GETs of {CHUNK // MiB} MiB, {flight:<9}  {mib_s(size, ranged)}")
    say(f"      the same, the raw HTTP client            {mib_s(size, statistics.median(raw))}")
    say(f"    direct whole-object GETs, in order       {mib_s(size, statistics.median(whole))}")
    ratio = ranged / statistics.median(cold)
    say(f"    ratio socket / ranged GETs               {ratio:7.2f} x   (goal >= 0.8)")
    say(f"    ratios per run                           {ratios(direct, cold)}")
    raws = statistics.median(raw) / statistics.median(cold)
    say(f"    ratio socket / raw-client ranged GETs    {raws:7.2f} x")
    say(f"    ratios per run                           {ratios(raw, cold)}")
    per_run = " / ".join(
        f"{size / MiB / c:.0f} {size / MiB / d:.0f} {size / MiB / r:.0f}"
        for c, d, r in zip(cold, direct, raw, strict=True)
    )
    say(f"    MiB/s per run (socket direct raw)        {per_run}")
    say(f"    order of the contenders per run          {' / '.join(orders)}")
    wholes = statistics.median(whole) / statistics.median(cold)
    say(f"    ratio socket / whole-object GETs         {wholes:7.2f} x   (the server's GETs of a")
    say("        sequential reader are groups of 4 chunks: 16 MiB, here whole segments)")
    say("    CPU seconds per GiB (client, read server, SeaweedFS), medians:")
    for contender, label in (
        ("socket", "socket"),
        ("direct", "ranged GETs"),
        ("raw", "raw client"),
        ("whole", "whole"),
    ):
        per = [statistics.median(c[i] for c in cpu[contender]) * GiB / size for i in range(3)]
        say(f"        {label:<12} {per[0]:5.2f}  {per[1]:5.2f}  {per[2]:5.2f}")
    if args.cold_only:
        return

    # warm: the default server (planned responses, sendfile) and, side by side, one with
    # read_server.sendfile=false (every response read through memory: the earlier path)
    found: dict[str, dict[str, Any]] = {}
    for name, settings in (("warm", ()), ("memory", ("read_server.sendfile=false",))):
        every = (*args.server_set, *settings)
        async with read_server(root, config, env, name, *every) as (socket, _pid):
            async with session(socket) as http:
                await read_partition(http, "bench", 0)  # fills the cache
                async with http.get(f"{BASE}/v1/topics/bench/partitions/0/segments") as response:
                    listing = await response.json()
                segments = listing["segments"]
                warm, ranges = [], []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    assert await read_partition(http, "bench", 0) == size
                    warm.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    assert await read_ranges(http, "bench", 0, segments) == size
                    ranges.append(time.perf_counter() - t0)
            curl = await curl_records(socket, "bench", args.runs) if shutil.which("curl") else None
            end = listing["tiered"]["end_offset"]
            rng = random.Random(5)
            offsets = [rng.randrange(0, end + 1) for _ in range(args.ttfb)]
            await ttfb(socket, "bench", offsets[:50])  # the indexes into memory
            times = await ttfb(socket, "bench", offsets)
        found[name] = {"warm": warm, "ranges": ranges, "curl": curl, "times": times}
    say(f"(2) warm cache ({size / MiB:.0f} MiB on disk), best of {args.runs}")
    fast, slow = found["warm"], found["memory"]

    def row(label: str, a: str, b: str, goal: str = "") -> None:
        say(f"    {label:<37}{a:>14}   {b:>14}   {goal}".rstrip())

    row("", "sendfile", "sendfile=false")

    row("socket records", gib_s(size, min(fast["warm"])), gib_s(size, min(slow["warm"])),
        "(goal >= 1)")  # fmt: skip
    row("socket segment log ranges", gib_s(size, min(fast["ranges"])),
        gib_s(size, min(slow["ranges"])))  # fmt: skip
    if fast["curl"] is not None:
        row("socket records, curl, 64 MiB", gib_s(*fast["curl"]), gib_s(*slow["curl"]))
    say(f"    time to first byte, {args.ttfb} one-batch requests, new connection each:")
    for name, label in (("warm", "sendfile"), ("memory", "sendfile=false")):
        times = found[name]["times"]
        p50, p99 = percentile(times, 0.5) * 1000, percentile(times, 0.99) * 1000
        say(f"        {label:<15} p50 {p50:.2f} ms, p99 {p99:.2f} ms   (goal p99 <= 5 ms)")

    async with (
        read_server(root, config, env, "readers", *args.server_set) as (socket, _pid),
        session(socket, limit=args.readers) as http,
    ):

        async def reader(p: int) -> tuple[int, float, str | None]:
            t0 = time.perf_counter()
            try:
                got = await read_partition(http, "readers", p)
            except Exception as exc:  # noqa: BLE001 - counted as an error
                return 0, time.perf_counter() - t0, repr(exc)
            return got, time.perf_counter() - t0, None

        t0 = time.perf_counter()
        results = await asyncio.gather(*(reader(p) for p in range(args.readers)))
        wall = time.perf_counter() - t0
    errors = [e for _, _, e in results if e]
    total = sum(got for got, _, _ in results)
    shown = f"  {errors[:3]}" if errors else ""
    amount = f"({total / MiB:.0f} MiB in {wall:.2f} s)"
    say(f"(3) {args.readers} concurrent readers, one partition each, cold")
    say(f"    errors                                   {len(errors)}{shown}")
    say(f"    aggregate                                {mib_s(total, wall)} {amount}")
    say(f"    slowest reader                           {max(t for _, t, _ in results):.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=256, help="MiB in the sequential partition")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--readers", type=int, default=64)
    parser.add_argument("--readers-mib", type=float, default=2, help="MiB per reader partition")
    parser.add_argument("--ttfb", type=int, default=1000, help="requests for time to first byte")
    parser.add_argument(
        "--s3-latency-ms",
        type=float,
        default=0,
        help="hold each request to S3 this long (a proxy): the read server's and the direct GETs",
    )
    parser.add_argument(
        "--s3-mb-per-s",
        type=float,
        default=0,
        help="cap each S3 connection at this many MB/s (the proxy): an object store's"
        " per-connection throughput",
    )
    parser.add_argument(
        "--direct-in-flight",
        type=int,
        default=1,
        help="part (1): the direct ranged GETs keep this many in flight (1: one at a time)",
    )
    parser.add_argument(
        "--full-cache-mib",
        type=float,
        default=0,
        help="part (1): a chunk cache of this budget, filled with other data before the timed"
        " read (a long-running server's steady state: every chunk written evicts one)",
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--cold-only", action="store_true", help="part (1) only")
    parser.add_argument("--json-only", action="store_true", help="part (4) only")
    parser.add_argument("--json-readers", type=int, default=16, help="part (4): JSON readers")
    parser.add_argument(
        "--server-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of every read server started (e.g. read_server.max_concurrent_fetches=4)",
    )
    args = parser.parse_args()
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
