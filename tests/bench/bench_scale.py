"""Benchmark of the daemon at the design's scale: 10,000 partitions in one broker's log dirs.

The partitions:

* ``--broker-partitions`` (default 1,000) come from a real single-node Kafka 4.x of the local
  stack (``deploy/local/stack.py``): one topic with 1 MiB segments, ``remote.storage.enable``
  off (standalone mode; ``tiering.include_topics`` selects it). Before the sidecar starts, every
  partition gets ``--initial-segments`` rolled segments of one record (a short ``segment.ms``,
  one record per partition per round; then ``segment.ms`` goes back to a day, so later rolls
  come from size alone): the backlog the daemon tiers at start.
* the rest (default 9,000) are built with ``sidecar.testing.write_partition`` (one partition
  written, the others hard links to its files, as ``bench_first_scan.py`` does) as partitions
  of a topic ``synthetic`` in a second log dir that the broker does not own; the sidecar
  watches both (``broker.log_dirs``; the broker's comes first, its ``meta.properties`` names the
  node). No broker leads a partition of ``synthetic``, and the daemon uploads only partitions
  its broker leads according to the cluster's metadata, so these are never tiered: they count
  for the scan, idle CPU, memory and status figures only. They are selected too
  (``include_topics``, unless ``--no-select-synthetic``), so the engine walks them on every
  reconcile as it would walk a follower's partitions.

Measured and printed, with the design's targets:

1. startup: from the process start to ``log_dirs_scanned`` (the first full scan merged; the
   log line's timestamp) and to ``/readyz`` answering 200 (polled every 100 ms);
2. catch-up (every rolled segment of the broker's partitions tiered, from the
   ``segment_tiered`` log lines), then idle CPU (``/proc/<pid>/stat``, % of one core over
   ``--idle-seconds``) and RSS (``VmRSS``; ``VmHWM`` too): targets <= 2 % and <= 200 MB. The
   idle window starts ``--settle`` seconds after the catch-up, by default the rescan interval
   plus 15 s: each partition that uploaded is looked at once more ``idle_recheck_s`` (the
   rescan interval) after its upload, a one-time cost of the catch-up that an idle daemon
   does not pay again (the looks after that one are skipped while its metadata is unchanged);
3. roll -> ``COPY_SEGMENT_FINISHED``: ``--rolls`` times, a random partition of the broker's topic
   gets 16 KiB records until its segment rolls (the new ``.log`` appears, polled every 10 ms in
   a thread); FINISHED is seen by this script's reader of the metadata topic
   (``tests.e2e._support.MetadataTopic``). "Beyond transfer" subtracts a PUT of the same three
   objects (``.log``, an indexes blob and a manifest of the same sizes) through the sidecar's own
   S3 client, made right after: target p99 <= 1 s beyond transfer;
4. ``sidecar status`` latency: ``--status-runs`` invocations of the CLI (interpreter start
   included; ``sidecar version`` timed alike as the floor), and as many ``GET /v1/status``.

``--profile-seconds`` then samples the idle daemon with py-spy (``.venv/bin/py-spy``, non-
blocking) and prints the functions it was in most. py-spy is not one of the project's
dependencies: ``.venv/bin/pip install py-spy`` first, or pass ``--profile-seconds 0``.

The daemon runs with the product's defaults for ``kafka.metadata_refresh_interval_s`` (10 s),
``tiering.rescan_interval_s`` (30 s) and the metadata topic's 50 partitions unless told
otherwise.

Run from the repository root (java and the Kafka jars as ``deploy/local/stack.py`` needs them),
under the benchmark lock:

    flock /tmp/sidecar-bench.lock .venv/bin/python tests/bench/bench_scale.py      # 10,000
    .venv/bin/python tests/bench/bench_scale.py --partitions 2000 --broker-partitions 200 \\
        --rolls 5 --idle-seconds 10 --status-runs 5                                # scaled down

Everything lives in a ``/tmp/bench-scale-*`` directory, removed at the end unless ``--keep``;
Kafka, SeaweedFS and the sidecar bind to 127.0.0.1 and are stopped by PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import platform
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
from aiokafka import AIOKafkaProducer  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient  # noqa: E402
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType  # noqa: E402

from sidecar.metadata.events import (  # noqa: E402
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
)
from sidecar.storage.keys import KeyLayout, ObjectSuffix  # noqa: E402
from sidecar.storage.s3 import S3ObjectStore  # noqa: E402
from sidecar.testing import TestRecord, build_batch, write_partition  # noqa: E402
from tests.conftest import stack  # noqa: E402
from tests.e2e._support import MetadataTopic, Sidecar, write_config  # noqa: E402
from tests.helpers import create_topic  # noqa: E402
from tests.sidecar_runner import sidecar_env  # noqa: E402

MiB = 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")
DAY_MS = str(24 * 3600 * 1000)
VALUE_BYTES = 16 * 1024
SYNTHETIC = "synthetic"
PREFIX = "scale/"
TARGET_IDLE_PCT = 2.0
TARGET_RSS_MB = 200.0
TARGET_BEYOND_P99_S = 1.0


def say(*parts: object) -> None:
    """Progress on stderr (the results go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    with Path(f"/proc/{pid}/stat").open() as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def main_thread_cpu_seconds(pid: int) -> float:
    """utime + stime of the process's main thread (the event loop), /proc/<pid>/task/<pid>."""
    with Path(f"/proc/{pid}/task/{pid}/stat").open() as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kib(pid: int, name: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise KeyError(name)


def event_time(event: dict[str, Any]) -> float:
    """The wall-clock time of a structlog JSON event (ISO-8601, UTC)."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------------------------
# the partitions


def build_synthetic(log_dir: Path, partitions: int, segments: int) -> None:
    """``partitions`` directories ``synthetic-<i>`` of one topic id: partition 0 written, the
    others hard links to its files (the detector reads names, sizes and checkpoints)."""
    batches = [[build_batch([TestRecord(b"k", b"v" * 100)])] for _ in range(segments)]
    template = write_partition(log_dir, SYNTHETIC, 0, batches, topic_id=uuid.uuid4())
    files = sorted(template.iterdir())
    for i in range(1, partitions):
        directory = log_dir / f"{SYNTHETIC}-{i}"
        directory.mkdir()
        for path in files:
            os.link(path, directory / path.name)


async def set_segment_ms(bootstrap: str, topic: str, segment_ms: str) -> None:
    """AlterConfigs replaces a topic's whole config: both keys go every time."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        configs = {"segment.bytes": str(MiB), "segment.ms": segment_ms}
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs)])
    finally:
        await admin.close()


def rolled_count(partition_dir: Path) -> int:
    return max(0, sum(1 for p in partition_dir.iterdir() if p.suffix == ".log") - 1)


async def build_broker_backlog(
    bootstrap: str, log_dir: Path, topic: str, partitions: int, segments: int
) -> int:
    """Create the topic and roll ``segments`` one-record segments in each partition by time;
    the rolled segments' count."""
    roll_ms = 1000
    await create_topic(
        bootstrap,
        topic,
        partitions=partitions,
        configs={"segment.bytes": str(MiB), "segment.ms": str(roll_ms)},
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20)
    await producer.start()
    try:
        for round_ in range(segments + 1):
            if round_:
                await asyncio.sleep(roll_ms / 1000 + 0.2)  # the active segments are old now
            for p in range(partitions):
                await producer.send(topic, value=b"r%d" % round_, partition=p)
            await producer.flush()
    finally:
        await producer.stop()
    await set_segment_ms(bootstrap, topic, DAY_MS)
    dirs = [log_dir / f"{topic}-{p}" for p in range(partitions)]
    deadline = time.monotonic() + 60
    while (rolled := sum(rolled_count(d) for d in dirs)) < partitions * segments:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {rolled} of {partitions * segments} segments rolled")
        await asyncio.sleep(0.5)
    return rolled


async def stop_stack(kafka: Any, s3: Any, root: Path, *, keep: bool) -> None:
    """Stop SeaweedFS and Kafka (those started; by PID), then remove ``root`` unless ``keep``."""
    if s3 is not None:
        await asyncio.to_thread(s3.stop)
    if kafka is not None:
        await asyncio.to_thread(kafka.stop)
    if keep:
        say(f"kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# measurements


async def wait_ready(port: int, sidecar: Sidecar, timeout: float, *, every: float = 0.1) -> float:
    """The wall-clock time /readyz first answered 200 (polled every ``every`` seconds)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            if sidecar.exited:
                raise RuntimeError("the sidecar exited before it was ready\n" + sidecar.tail())
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{port}/readyz") as answer:
                    if answer.status == 200:
                        return time.time()
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready within {timeout} s\n{sidecar.tail()}")
            await asyncio.sleep(every)


def _frame(text: str) -> str:
    """``func (path/to/file.py:12)`` as ``func (to/file.py)``: lines of one function merged."""
    name, _, where = text.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(Path(path).parts[-2:])})"


#: the profiler of ``--profile-seconds``, beside this interpreter (not a project dependency)
PY_SPY = Path(sys.executable).parent / "py-spy"


def profile(pid: int, seconds: float, out: Path) -> list[str]:
    """py-spy samples of the process (non-blocking, idle threads left out): the functions it
    was in most, as leaves and anywhere on the stack."""
    result = subprocess.run(
        [
            str(PY_SPY),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "100",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 or not out.exists():
        return [f"py-spy failed: {(result.stderr or result.stdout).strip()[-300:]}"]
    leaves: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text:
            continue
        count = int(count_text)
        frames = [_frame(f) for f in stack_text.split(";")]
        total += count
        leaves[frames[-1]] += count
        for frame in set(frames):
            anywhere[frame] += count
    lines = [
        f"{total} samples of running threads in {seconds:.0f} s at 100 Hz"
        f" ({total / seconds:.1f} per second: ~{total / seconds:.0f} % of one core if every"
        " sample held the CPU)"
    ]
    lines.append("  leaf functions:")
    lines += [f"    {n / total * 100:5.1f} %  {name}" for name, n in leaves.most_common(8)]
    lines.append("  on the stack (inclusive):")
    skip = ("<module>", "run ", "_run_once", "run_forever", "_bootstrap")
    inclusive = [(k, v) for k, v in anywhere.most_common(60) if not k.startswith(skip)]
    lines += [f"    {n / total * 100:5.1f} %  {name}" for name, n in inclusive[:12]]
    return lines


class RollProbe:
    """Roll one partition's active segment and time it to COPY_SEGMENT_FINISHED."""

    def __init__(self, bench: Bench, metadata: MetadataTopic) -> None:
        self.bench = bench
        self.metadata = metadata
        self.seen = 0  # metadata events looked at
        self.started: dict[Any, SegmentMetadata] = {}
        self.finished: dict[tuple[str, int, int], float] = {}  # (topic, partition, start) → seen
        self.pool = os.urandom(4 * MiB)

    def _take_new_events(self, now: float) -> None:
        events = self.metadata.events
        for event in events[self.seen :]:
            if isinstance(event, SegmentMetadata):
                self.started[event.segment_id] = event
            elif (
                isinstance(event, SegmentMetadataUpdate)
                and event.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED
            ):
                meta = self.started[event.segment_id]
                tip = meta.topic_id_partition
                self.finished.setdefault((tip.topic, tip.partition, meta.start_offset), now)
        self.seen = len(events)

    async def drain(self) -> None:
        """Read what the metadata topic holds so far."""
        await self.metadata.read_to_end()
        self._take_new_events(time.time())

    async def one(self, producer: AIOKafkaProducer, partition: int) -> dict[str, float]:
        topic = self.bench.topic
        directory = self.bench.broker_dir / f"{topic}-{partition}"
        before = {int(p.stem) for p in directory.glob("*.log")}
        active = max(before)
        appeared: list[tuple[int, float]] = []
        stop = threading.Event()

        def poll() -> None:  # a thread: the event loop's hiccups do not delay the clock
            while not stop.is_set():
                for entry in os.scandir(directory):
                    if entry.name.endswith(".log") and int(entry.name[:-4]) not in before:
                        appeared.append((int(entry.name[:-4]), time.time()))
                        return
                stop.wait(0.01)

        poller = threading.Thread(target=poll, name="roll poller", daemon=True)
        poller.start()
        sent = 0
        try:
            while not appeared:
                if sent > 3 * MiB:
                    raise RuntimeError(f"{topic}-{partition} did not roll after {sent} bytes")
                start = random.randrange(len(self.pool) - VALUE_BYTES)
                await producer.send(
                    topic, value=self.pool[start : start + VALUE_BYTES], partition=partition
                )
                sent += VALUE_BYTES
                if sent % (256 * 1024) == 0:
                    await producer.flush()
                    await asyncio.sleep(0.005)  # let the poller see a roll before more goes out
            await producer.flush()
        finally:
            stop.set()
            poller.join(1.0)
        _new_base, rolled_at = appeared[0]
        key = (topic, partition, active)
        deadline = time.monotonic() + 120
        while key not in self.finished:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no COPY_SEGMENT_FINISHED of {key} within 120 s")
            await self.metadata.poll(timeout_ms=100)
            self._take_new_events(time.time())
        seen = self.finished[key]
        transfer = await self.bench.transfer(partition, active, self.started)
        return {
            "partition": partition,
            "base": active,
            "total": seen - rolled_at,
            "transfer": transfer,
            "beyond": seen - rolled_at - transfer,
            "rolled_at": rolled_at,
        }


class Bench:
    def __init__(self, args: argparse.Namespace, root: Path, kafka: Any, s3: Any) -> None:
        self.args = args
        self.root = root
        self.kafka = kafka
        self.s3 = s3
        self.topic = f"scale-{secrets.token_hex(3)}"
        self.metadata_topic = f"__rlm_scale_{secrets.token_hex(3)}"
        self.synthetic_dir = root / "synthetic-logs"
        self.metrics_port = stack.free_port()
        self.config = root / "sidecar.toml"
        self.store: S3ObjectStore | None = None

    @property
    def broker_dir(self) -> Path:
        return Path(self.kafka.log_dirs[0])

    def write_config(self) -> None:
        args = self.args
        includes = [self.topic] + ([SYNTHETIC] if args.select_synthetic else [])
        write_config(
            self.config,
            state_dir=self.root / "state",
            log_dir=self.broker_dir,
            bootstrap=self.kafka.bootstrap_servers,
            s3=self.s3,
            metrics_port=self.metrics_port,
            metadata_topic=self.metadata_topic,
            include_topics=includes,
            prefix=PREFIX,
            broker={"log_dirs": [self.broker_dir, self.synthetic_dir]},
            kafka={"metadata_refresh_interval_s": args.refresh_interval},
            tiering={"rescan_interval_s": args.rescan_interval},
            remote_log_metadata={"num_partitions": args.metadata_partitions},
        )

    async def transfer(
        self, partition: int, base: int, started: dict[Any, SegmentMetadata]
    ) -> float:
        """Seconds to PUT the same three objects as the uploader (one after the other)."""
        assert self.store is not None
        meta = next(
            m
            for m in started.values()
            if m.topic_id_partition.topic == self.topic
            and m.topic_id_partition.partition == partition
            and m.start_offset == base
        )
        tip = meta.segment_id.topic_id_partition
        layout = KeyLayout(prefix=PREFIX)
        sizes = {}
        for suffix in (ObjectSuffix.INDEXES, ObjectSuffix.MANIFEST):
            key = layout.segment_key(
                topic=tip.topic,
                topic_id=tip.topic_id,
                partition=tip.partition,
                base_offset=meta.start_offset,
                segment_id=meta.segment_id.id,
                suffix=suffix,
            )
            sizes[suffix] = (await self.store.head(key)).size
        log_path = self.broker_dir / f"{self.topic}-{partition}" / f"{base:020d}.log"
        t0 = time.perf_counter()
        await self.store.put_file(f"probe/{partition}-{base}.log", log_path, part_size=5 * MiB)
        await self.store.put(
            f"probe/{partition}-{base}.indexes", os.urandom(sizes[ObjectSuffix.INDEXES])
        )
        await self.store.put(
            f"probe/{partition}-{base}.manifest", os.urandom(sizes[ObjectSuffix.MANIFEST])
        )
        return time.perf_counter() - t0

    async def time_cli(self, *command: str) -> list[float]:
        seconds = []
        for _ in range(self.args.status_runs):
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "sidecar",
                *command,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=sidecar_env(self.s3),
                cwd=REPO,
            )
            _, err = await proc.communicate()
            seconds.append(time.perf_counter() - t0)
            if proc.returncode not in (0, 1):  # 1: answered, but not ready
                raise RuntimeError(f"sidecar {' '.join(command)}: {err.decode()[-2000:]}")
        return seconds

    async def time_http_status(self) -> tuple[list[float], int, int]:
        seconds = []
        size = rows = 0
        async with aiohttp.ClientSession() as http:
            for _ in range(self.args.status_runs):
                t0 = time.perf_counter()
                async with http.get(f"http://127.0.0.1:{self.metrics_port}/v1/status") as r:
                    body = await r.read()
                seconds.append(time.perf_counter() - t0)
                size = len(body)
                rows = len(json.loads(body)["partitions"])
        return seconds, size, rows


# ---------------------------------------------------------------------------------------------


def quantiles(values: list[float]) -> str:
    return (
        f"p50 {percentile(values, 0.5):.3f}  p99 {percentile(values, 0.99):.3f}"
        f"  max {max(values, default=math.nan):.3f} s"
    )


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


async def amain(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="bench-scale-", dir="/tmp"))
    say(f"working directory {root}")
    synthetic = args.partitions - args.broker_partitions
    if synthetic < 0:
        raise SystemExit("--partitions must be at least --broker-partitions")
    kafka = s3 = sidecar = None
    out: list[str] = []
    loads: dict[str, str] = {"start": load()}
    try:
        kafka = stack.KafkaCluster.create(root / "kafka", nodes=1)
        s3 = stack.SeaweedS3.create(root / "s3")
        t = time.monotonic()
        await asyncio.to_thread(s3.start)
        await asyncio.to_thread(kafka.start)
        say(f"Kafka and SeaweedFS up in {time.monotonic() - t:.1f} s")
        bench = Bench(args, root, kafka, s3)

        t = time.monotonic()
        backlog = await build_broker_backlog(
            kafka.bootstrap_servers,
            bench.broker_dir,
            bench.topic,
            args.broker_partitions,
            args.initial_segments,
        )
        say(
            f"broker topic {bench.topic}: {backlog} rolled segments in {time.monotonic() - t:.1f} s"
        )
        t = time.monotonic()
        bench.synthetic_dir.mkdir()
        if synthetic:
            await asyncio.to_thread(build_synthetic, bench.synthetic_dir, synthetic, 3)
        say(f"{synthetic} synthetic partitions x 3 segments in {time.monotonic() - t:.1f} s")
        bench.write_config()

        # 1. startup
        loads["sidecar start"] = load()
        started = time.time()
        sidecar = await Sidecar.start(
            bench.config, sidecar_env(s3), root / "sidecar.log", name="sidecar"
        )
        ready_at = await wait_ready(bench.metrics_port, sidecar, args.timeout)
        scanned = (await sidecar.wait_for("log_dirs_scanned", timeout=args.timeout))[0]
        starting = sidecar.matching("sidecar_starting")
        say(f"ready after {ready_at - started:.1f} s: {scanned}")

        # 2. catch-up, idle, memory
        tiered = await sidecar.wait_for(
            "segment_tiered", count=backlog, timeout=args.timeout, topic=bench.topic
        )
        caught_up = max(event_time(e) for e in tiered)
        first_upload = min(event_time(e) - float(e["seconds"]) for e in tiered)
        settle = args.rescan_interval + 15.0 if args.settle is None else args.settle
        say(f"caught up {caught_up - started:.1f} s after start; settling {settle:.0f} s")
        await asyncio.sleep(settle)
        pid = sidecar.proc.pid
        loads["idle start"] = load()
        cpu0, loop0, t0 = cpu_seconds(pid), main_thread_cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(args.idle_seconds)
        idle_s = time.monotonic() - t0
        idle_pct = (cpu_seconds(pid) - cpu0) / idle_s * 100
        loop_pct = (main_thread_cpu_seconds(pid) - loop0) / idle_s * 100
        loads["idle end"] = load()
        rss_kib, hwm_kib = status_kib(pid, "VmRSS"), status_kib(pid, "VmHWM")
        threads = status_kib(pid, "Threads")
        failures = sum(
            len(sidecar.matching(name))
            for name in ("partition_tiering_failed", "segment_upload_failed")
        )
        say(f"idle {idle_pct:.2f} % of a core, RSS {rss_kib / 1024:.0f} MiB")
        profile_lines: list[str] = []
        if args.profile_seconds > 0:
            say(f"py-spy for {args.profile_seconds:.0f} s")
            profile_lines = await asyncio.to_thread(
                profile, pid, args.profile_seconds, root / "idle.pyspy.txt"
            )

        # 4. status
        say(f"status: {args.status_runs} x 3")
        version_s = await bench.time_cli("version")
        status_cli_s = await bench.time_cli("status", "--config", str(bench.config))
        http_s, http_bytes, http_rows = await bench.time_http_status()

        # 3. rolls
        say(f"{args.rolls} rolls in random partitions of {bench.topic}")
        rng = random.Random(args.seed)
        rows: list[dict[str, float]] = []
        bench.store = S3ObjectStore(
            bucket=s3.bucket,
            endpoint_url=s3.endpoint,
            access_key_id=s3.access_key,
            secret_access_key=s3.secret_key,
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap_servers,
            acks=1,
            linger_ms=5,
            max_batch_size=256 * 1024,
        )
        async with (
            bench.store,
            MetadataTopic(kafka.bootstrap_servers, bench.metadata_topic, root / "reader") as meta,
        ):
            await bench.store.put("probe/warm-up", b"x" * 1024)  # open the connection
            probe = RollProbe(bench, meta)
            await probe.drain()
            await producer.start()
            try:
                for partition in rng.sample(range(args.broker_partitions), args.rolls):
                    row = await probe.one(producer, partition)
                    rows.append(row)
                    say(
                        f"  {bench.topic}-{partition}: {row['total']:.3f} s,"
                        f" transfer {row['transfer']:.3f} s"
                    )
            finally:
                await producer.stop()
        loads["end"] = load()
        ready_events = {
            (e["partition"], e["base_offset"]): event_time(e)
            for e in sidecar.matching("segment_ready", topic=bench.topic)
        }
        tiered_events = {
            (e["partition"], e["base_offset"]): e
            for e in sidecar.matching("segment_tiered", topic=bench.topic)
        }
        for row in rows:
            key = (row["partition"], row["base"])
            if key in ready_events:
                row["detect"] = ready_events[key] - row["rolled_at"]
            if key in tiered_events:
                event = tiered_events[key]
                row["upload"] = float(event["seconds"])
                row["wait"] = (
                    event_time(event) - float(event["seconds"]) - ready_events.get(key, math.nan)
                )
        await sidecar.stop()
        lag = sidecar.matching("event_loop_lag_summary")

        # report
        out.append(
            f"machine: {platform.machine()}, {os.cpu_count()} cores (shared), "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB,"
            f" Python {platform.python_version()}, Kafka {kafka.version}"
        )
        out.append(
            "load average (1, 5, 15 min): " + "; ".join(f"{k} {v}" for k, v in loads.items())
        )
        out.append(
            f"partitions: {args.partitions} = {args.broker_partitions} of the broker (topic"
            f" {bench.topic}, 1 MiB segments, {backlog} rolled segments to tier at start)"
            f" + {synthetic} synthetic x 3 segments in a second log dir"
            f" ({'selected' if args.select_synthetic else 'not selected'}, never led: not tiered)"
        )
        out.append(
            f"sidecar: metadata_refresh_interval_s {args.refresh_interval},"
            f" rescan_interval_s {args.rescan_interval}, metadata topic"
            f" {args.metadata_partitions} partitions; everything else default"
        )
        out.append("(1) startup")
        sidecar_start = event_time(starting[0]) if starting else math.nan
        out.append(
            f"    process start -> sidecar_starting logged   {sidecar_start - started:7.2f} s"
            " (imports, config)"
        )
        out.append(
            f"    process start -> log_dirs_scanned          {event_time(scanned) - started:7.2f} s"
            f" ({scanned['partitions']} partitions, {scanned['segments']} segments,"
            f" {scanned['ready']} ready)"
        )
        out.append(f"    process start -> /readyz 200                {ready_at - started:7.2f} s")
        out.append("(2) catch-up, then idle")
        out.append(
            f"    first upload {first_upload - started:.1f} s after start (includes the new"
            f" leader's handover delay, refresh + 1 s); all {backlog} tiered"
            f" {caught_up - started:.1f} s after start ({caught_up - first_upload:.1f} s of"
            f" uploads, {backlog / max(caught_up - first_upload, 1e-9):.1f} segments/s);"
            f" failures logged {failures}"
        )
        out.append(
            f"    idle CPU over {args.idle_seconds:.0f} s        {idle_pct:6.2f} % of one core"
            f"   (target <= {TARGET_IDLE_PCT:.0f} %: {verdict(idle_pct <= TARGET_IDLE_PCT)});"
            f" from {settle:.0f} s after the catch-up; the event loop's thread"
            f" {loop_pct:.2f} %, the other threads {idle_pct - loop_pct:.2f} %"
        )
        rss_mb = rss_kib * 1024 / 1e6
        out.append(
            f"    RSS (VmRSS)                 {rss_mb:6.0f} MB ({rss_kib / 1024:.0f} MiB); peak"
            f" VmHWM {hwm_kib * 1024 / 1e6:.0f} MB; {threads} threads"
            f"   (target <= {TARGET_RSS_MB:.0f} MB: {verdict(rss_mb <= TARGET_RSS_MB)})"
        )
        if profile_lines:
            out.append(f"    py-spy of the idle daemon, {args.profile_seconds:.0f} s:")
            out += ["      " + line for line in profile_lines]
        out.append(f"(3) roll -> COPY_SEGMENT_FINISHED seen, {len(rows)} rolls of ~1 MiB segments")
        names = {
            "beyond": "beyond transfer",
            "total": "roll -> FINISHED seen",
            "transfer": "transfer (PUT of the same 3 objects)",
            "detect": "  roll -> segment_ready (detector)",
            "wait": "  segment_ready -> upload starts",
            "upload": "  upload (segment_tiered seconds)",
        }
        for key, label in names.items():
            values = [r[key] for r in rows if key in r and not math.isnan(r[key])]
            out.append(f"    {label:40s} {quantiles(values)}")
        beyond_p99 = percentile([r["beyond"] for r in rows], 0.99)
        out.append(
            f"    target p99 beyond transfer <= {TARGET_BEYOND_P99_S:.0f} s:"
            f" {verdict(beyond_p99 <= TARGET_BEYOND_P99_S)}"
        )
        out.append(f"(4) status, {args.status_runs} each")
        out.append(f"    sidecar version (CLI floor)              {quantiles(version_s)}")
        out.append(f"    sidecar status                           {quantiles(status_cli_s)}")
        out.append(
            f"    GET /v1/status                           {quantiles(http_s)}"
            f" ({http_bytes / 1e6:.1f} MB, {http_rows} partitions)"
        )
        overflows = sum("Inotify queue overflowed" in line for line in sidecar.raw)
        out.append(f"inotify queue overflows logged by watchdog: {overflows}")
        if lag:
            last = lag[-1]
            out.append(
                f"event-loop lag over the run: p99 {float(last['p99_seconds']) * 1000:.0f} ms,"
                f" max {float(last['max_seconds']) * 1000:.0f} ms, {last['blocked']} intervals"
                f" > 100 ms of {last['measurements']}"
            )
        print("\n".join(out), flush=True)
        return 0
    finally:
        if sidecar is not None and not sidecar.exited:
            await sidecar.stop()
        await stop_stack(kafka, s3, root, keep=args.keep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000, help="in all")
    parser.add_argument("--broker-partitions", type=int, default=1_000, help="of the real broker")
    parser.add_argument(
        "--initial-segments", type=int, default=1, help="rolled segments per broker partition"
    )
    parser.add_argument(
        "--select-synthetic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="include the synthetic topic in tiering.include_topics",
    )
    parser.add_argument("--rolls", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=120.0)
    parser.add_argument(
        "--settle",
        type=float,
        default=None,
        help="seconds between catch-up and idle (default: the rescan interval + 15)",
    )
    parser.add_argument("--status-runs", type=int, default=20)
    parser.add_argument("--profile-seconds", type=float, default=20.0, help="0: no py-spy")
    parser.add_argument("--refresh-interval", type=float, default=10.0)
    parser.add_argument("--rescan-interval", type=float, default=30.0)
    parser.add_argument("--metadata-partitions", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=900.0, help="per phase, seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the /tmp working directory")
    args = parser.parse_args(argv)
    if args.profile_seconds > 0 and not PY_SPY.exists():
        parser.error(f"{PY_SPY} is missing: pip install py-spy, or pass --profile-seconds 0")
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
