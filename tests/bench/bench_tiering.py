"""Benchmark of tiering against the real broker and SeaweedFS, in one run, side by side:

1. Throughput: the same rolled Kafka segments (random values, no compression) tiered by
   ``sidecar run`` (a subprocess) vs a plain aiobotocore multipart upload of the same ``.log``
   files (default botocore settings, same part size, same number of parts in flight) and vs
   ``aws s3 cp`` (one process per file, as a per-segment hook would run it, and one
   ``--recursive`` process for the whole set); for reference also the sidecar's own S3 code
   (``S3ObjectStore.put_file``) called in this process. Every contender runs ``--runs`` times,
   interleaved in rotating order; the bucket is emptied between runs; medians are reported.
   The sidecar's time is its tiering window: from the start of its first upload (the
   ``segment_tiered`` event's time minus its ``seconds``) to its last ``segment_tiered``, so
   its startup (imports, Kafka clients, metadata topic, first scan, the new leader's handover
   delay) is not counted.
2. Roll -> COPY_SEGMENT_FINISHED latency beyond transfer time: with the sidecar running and caught
   up, a producer fills 1 MiB segments one at a time. For each segment: (COPY_SEGMENT_FINISHED
   read from the metadata topic by this script) - (the next segment's ``.log`` appeared, polled
   every 10 ms) - (a direct PUT of the same objects through the sidecar's own S3 client code,
   made right after). Only rolls after the sidecar's first upload count. The sidecar's log
   gives the breakdown (detected, upload started, logged).
3. CPU-seconds per GiB of the sidecar process in its tiering window (``/proc/<pid>/stat``
   sampled every 20 ms and interpolated at the window's ends), its idle CPU once caught up, its
   peak RSS (``VmHWM``), and its event-loop lag over its whole run (startup, tiering, idle:
   the ``event_loop_lag_summary`` its watchdog logs when it stops; goal p99 < 100 ms).

Run from the repository root (needs java and the Kafka jars, as ``deploy/local/stack.py``):

    .venv/bin/python tests/bench/bench_tiering.py                  # ~256 MiB, 3 runs
    .venv/bin/python tests/bench/bench_tiering.py --mib 64 --runs 1 --latency-segments 10
    .venv/bin/python tests/bench/bench_tiering.py --sidecar-tree /tmp/patched   # a patched copy

``aws`` is installed on first use into its own virtualenv under
``~/.cache/kafka-tiered-sidecar/awscli-venv`` (awscli pins its own botocore, never in the
project's venv). Everything else lives in a ``/tmp/bench-tiering-*`` directory, removed at the
end unless ``--keep``; Kafka, SeaweedFS and the sidecars are stopped by PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import mmap
import os
import platform
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from aiobotocore.session import get_session  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402

from sidecar.errors import KeyNotFoundError  # noqa: E402
from sidecar.kafka.logdir import scan_partition_dir  # noqa: E402
from sidecar.kafka.records import iter_batches  # noqa: E402
from sidecar.metadata.events import (  # noqa: E402
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
)
from sidecar.metadata.serde import decode  # noqa: E402
from sidecar.storage.keys import KeyLayout, ObjectSuffix  # noqa: E402
from sidecar.storage.s3 import S3ObjectStore  # noqa: E402
from tests.conftest import stack  # noqa: E402
from tests.helpers import create_topic  # noqa: E402
from tests.sidecar_runner import sidecar_env  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
CLK_TCK = os.sysconf("SC_CLK_TCK")
AWSCLI_VENV = Path(stack.CACHE) / "awscli-venv"
VALUE_BYTES = 16 * 1024  # one record's value: few records, little producer overhead
NO_TIME_ROLL = str(24 * 3600 * 1000)  # segment.ms: segments roll by size only


def say(*parts: object) -> None:
    """Progress on stderr (the results table goes to stdout)."""
    print(*parts, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def loop_lag(sidecar: Sidecar) -> dict[str, float]:
    """The event-loop lag the sidecar's watchdog summarised when it stopped (NaN if it did
    not): p99 and max in seconds, intervals over 100 ms, the loop thread's most CPU in one."""
    summary = sidecar.matching("event_loop_lag_summary")
    if not summary:
        return {"lag_p99": math.nan, "lag_max": math.nan, "lag_blocked": math.nan}
    last = summary[-1]
    return {
        "lag_p99": float(last["p99_seconds"]),
        "lag_max": float(last["max_seconds"]),
        "lag_blocked": float(last["blocked"]),
        "lag_cpu_max": float(last.get("max_loop_cpu_seconds", math.nan)),
    }


def lag_line(lag: dict[str, float]) -> str:
    p99 = lag["lag_p99"]
    return (
        f"p99 {p99 * 1000:.1f} ms, max {lag['lag_max'] * 1000:.1f} ms,"
        f" {lag['lag_blocked']:.0f} intervals > 100 ms, loop CPU in one 50 ms interval max"
        f" {lag.get('lag_cpu_max', math.nan) * 1000:.1f} ms"
        f" (goal p99 < 100 ms: {'met' if p99 < 0.1 else 'NOT met'})"
    )


def event_time(event: dict[str, Any]) -> float:
    """The wall-clock time of a structlog JSON event (ISO-8601, UTC)."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process (all its threads) in seconds, from /proc/<pid>/stat."""
    with Path(f"/proc/{pid}/stat").open() as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK  # fields 14 and 15 of proc(5)


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def peak_rss_mib(pid: int) -> float:
    """VmHWM of a process in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------
# the files under test


@dataclass(frozen=True)
class SegmentFile:
    """One rolled segment's ``.log``: ``name`` is ``<topic>-<partition>/<base>.log``."""

    name: str
    path: Path
    size: int


async def produce_big_set(
    bootstrap: str, topic: str, log_dir: Path, *, mib: int, partitions: int, segment_mib: int
) -> list[SegmentFile]:
    """Fill ``partitions`` partitions until together they hold ``mib`` MiB of rolled segments."""
    per_partition = max(1, math.ceil(mib / partitions / segment_mib))
    await create_topic(
        bootstrap,
        topic,
        partitions=partitions,
        configs={"segment.bytes": str(segment_mib * MiB), "segment.ms": NO_TIME_ROLL},
    )
    pool = os.urandom(8 * MiB)  # values are random slices of it: nothing compresses
    # each partition gets its segments plus one more MiB, so that the last one rolls
    records = (per_partition * segment_mib * MiB + MiB) // VALUE_BYTES + 1
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=5, max_batch_size=512 * 1024
    )
    await producer.start()
    try:
        for i in range(records):
            for partition in range(partitions):
                start = (i * 7919 + partition * 104729) % (len(pool) - VALUE_BYTES)
                await producer.send(
                    topic, value=pool[start : start + VALUE_BYTES], partition=partition
                )
        await producer.flush()
    finally:
        await producer.stop()
    files: list[SegmentFile] = []
    deadline = time.monotonic() + 60
    for partition in range(partitions):
        while True:
            scan = scan_partition_dir(log_dir / f"{topic}-{partition}")
            rolled = [] if scan is None else [s for s in scan.segments if not s.is_active]
            if len(rolled) >= per_partition and all(s.ready for s in rolled):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}-{partition}: only {len(rolled)} segments rolled")
            await asyncio.sleep(0.2)
        files += [
            SegmentFile(f"{topic}-{partition}/{s.log_path.name}", s.log_path, s.size)
            for s in rolled
        ]
    return files


# ---------------------------------------------------------------------------------------------
# the sidecar as a subprocess


def write_sidecar_config(
    path: Path,
    *,
    state_dir: Path,
    log_dir: Path,
    bootstrap: str,
    s3: Any,
    prefix: str,
    metadata_topic: str,
    include_topics: list[str],
    part_size: int,
    part_concurrency: int,
    uploads: int,
    refresh_interval_s: float,
) -> Path:
    """The TOML of ``tests.sidecar_runner.sidecar_config``, with the bench's upload settings."""
    path.write_text(
        f'state_dir = "{state_dir}"\n'
        f'[broker]\nlog_dirs = ["{log_dir}"]\n'
        f'[kafka]\nbootstrap_servers = ["{bootstrap}"]\n'
        f"metadata_refresh_interval_s = {refresh_interval_s}\n"
        f'[s3]\nendpoint_url = "{s3.endpoint}"\nbucket = "{s3.bucket}"\nprefix = "{prefix}"\n'
        f"part_size_bytes = {part_size}\nmax_concurrency = {part_concurrency}\n"
        f"[metrics]\nport = {stack.free_port()}\n"
        f"[tiering]\nrescan_interval_s = 5\ninclude_topics = {json.dumps(include_topics)}\n"
        f"max_concurrent_uploads = {uploads}\n"
        f"[remote_log_metadata]\nreplication_factor = 1\nnum_partitions = 5\n"
        f'topic = "{metadata_topic}"\n'
    )
    return path


@dataclass
class Sidecar:
    """A running ``python -m sidecar run``: its JSON log read continuously (a full pipe would
    stall it), and its CPU time sampled every 20 ms."""

    proc: asyncio.subprocess.Process
    log_path: Path
    started_at: float
    metadata_topic: str = ""
    server_pid: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    #: (wall time, sidecar user CPU-seconds, sidecar system CPU-seconds, S3 server CPU-seconds)
    samples: list[tuple[float, float, float, float]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def start(
        cls,
        config: Path,
        env: dict[str, str],
        log_path: Path,
        *,
        tree: Path = REPO,
        server_pid: int | None = None,
    ) -> Sidecar:
        started_at = time.time()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sidecar",
            "run",
            "--config",
            str(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tree,  # `python -m` puts the working directory first on sys.path
        )
        sidecar = cls(proc, log_path, started_at, server_pid=server_pid)
        sidecar._tasks = [
            asyncio.create_task(sidecar._read(), name="sidecar log"),
            asyncio.create_task(sidecar._sample(), name="sidecar cpu"),
        ]
        return sidecar

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.log_path.open("a") as out:
            while line := await self.proc.stdout.readline():
                text = line.decode(errors="replace")
                out.write(text)
                with contextlib.suppress(json.JSONDecodeError):
                    event = json.loads(text)
                    if isinstance(event, dict):
                        self.events.append(event)
                        self._changed.set()
        self._changed.set()

    async def _sample(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # the process is gone
            while self.proc.returncode is None:
                server = cpu_seconds(self.server_pid) if self.server_pid else math.nan
                self.samples.append((time.time(), *cpu_times(self.pid), server))
                await asyncio.sleep(0.02)

    def cpu_at(self, when: float, column: int | None = None) -> float:
        """CPU time at wall-clock ``when``, interpolated between samples: the sidecar's
        (``column`` None), its user (1) or system (2) time, or the S3 server's (3)."""
        if column is None:
            return self.cpu_at(when, 1) + self.cpu_at(when, 2)
        samples = self.samples
        if not samples:
            return math.nan
        if when <= samples[0][0]:
            return samples[0][column]
        for before, after in itertools.pairwise(samples):
            t0, c0, t1, c1 = before[0], before[column], after[0], after[column]
            if t0 <= when <= t1:
                return c0 + (c1 - c0) * (when - t0) / (t1 - t0) if t1 > t0 else c1
        return samples[-1][column]

    def failures(self) -> int:
        """Warnings that mean an upload did not go through at the first attempt."""
        names = ("partition_tiering_failed", "segment_upload_failed", "tiering_leadership_lost")
        return sum(len(self.matching(name)) for name in names)

    def matching(self, name: str, **match: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e.get("event") == name and all(e.get(k) == v for k, v in match.items())
        ]

    async def wait_for(
        self, name: str, *, count: int = 1, timeout: float = 120, **match: Any
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(found := self.matching(name, **match)) < count:
            if self.proc.returncode is not None or self._tasks[0].done():
                raise RuntimeError(f"the sidecar exited; see {self.log_path}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"{len(found)}/{count} {name} {match} after {timeout} s; see {self.log_path}"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
        return found[:count]

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 60 s; idempotent."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, 5)


# ---------------------------------------------------------------------------------------------
# S3 helpers and the contenders


def default_client(s3: Any) -> Any:
    """An aiobotocore S3 client with botocore's default settings (an async context manager)."""
    return get_session().create_client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
    )


async def empty_bucket(client: Any, bucket: str) -> int:
    """Delete every object and abort every multipart upload; return the objects deleted."""
    deleted = 0
    paginator = client.get_paginator("list_objects_v2")
    async for page in paginator.paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            await client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            deleted += len(keys)
    uploads = await client.list_multipart_uploads(Bucket=bucket)
    for upload in uploads.get("Uploads", []):
        await client.abort_multipart_upload(
            Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
        )
    return deleted


def _read_part(path: Path, offset: int, length: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read(length)


async def aiobotocore_upload(
    client: Any,
    bucket: str,
    prefix: str,
    files: list[SegmentFile],
    *,
    part_size: int,
    files_at_once: int,
    parts_at_once: int,
) -> None:
    """What a plain aiobotocore user writes: multipart uploads, parts read in a thread."""
    gate = asyncio.Semaphore(files_at_once)

    async def one(item: SegmentFile) -> None:
        key = prefix + item.name
        async with gate:
            if item.size <= part_size:
                body = await asyncio.to_thread(_read_part, item.path, 0, item.size)
                await client.put_object(Bucket=bucket, Key=key, Body=body)
                return
            created = await client.create_multipart_upload(Bucket=bucket, Key=key)
            upload_id = created["UploadId"]
            plan = iter(
                enumerate(
                    ((o, min(part_size, item.size - o)) for o in range(0, item.size, part_size)),
                    start=1,
                )
            )
            done: dict[int, dict[str, Any]] = {}

            async def worker() -> None:
                for number, (offset, length) in plan:
                    body = await asyncio.to_thread(_read_part, item.path, offset, length)
                    answer = await client.upload_part(
                        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
                    )
                    done[number] = {
                        "PartNumber": number,
                        "ETag": answer["ETag"],
                        **{k: v for k, v in answer.items() if k.startswith("Checksum")},
                    }

            await asyncio.gather(*(worker() for _ in range(parts_at_once)))
            await client.complete_multipart_upload(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": [done[n] for n in sorted(done)]},
            )

    await asyncio.gather(*(one(f) for f in files))


def ensure_awscli(spec: str) -> tuple[Path, str]:
    """``aws`` from its own virtualenv (created and installed with pip on first use)."""
    aws = AWSCLI_VENV / "bin" / "aws"
    if not aws.exists():
        say(f"installing {spec} into {AWSCLI_VENV} ...")
        AWSCLI_VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(AWSCLI_VENV)], check=True)
        subprocess.run(
            [str(AWSCLI_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", spec],
            check=True,
        )
    version = (
        subprocess.run(
            [str(aws), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        or "?"
    )
    return aws, version


def awscli_env(s3: Any, home: Path, checksum: str | None) -> dict[str, str]:
    """Credentials and region in the environment; no user config or credentials files."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config").write_text("[default]\n")
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    if checksum:
        env["AWS_REQUEST_CHECKSUM_CALCULATION"] = checksum
    return env


async def run_checked(*cmd: str, env: dict[str, str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        *cmd, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed: {err.decode()[-2000:]}")


# ---------------------------------------------------------------------------------------------
# phase 1 and 3: throughput, CPU, RSS


@dataclass
class Run:
    contender: str
    seconds: float
    bytes: int
    cpu: float | None = None  # client CPU-seconds in the timed window
    server_cpu: float | None = None  # SeaweedFS CPU-seconds in the timed window
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def mib_s(self) -> float:
        return self.bytes / MiB / self.seconds


@dataclass
class Bench:
    args: argparse.Namespace
    root: Path
    kafka: Any
    s3: Any
    files: list[SegmentFile] = field(default_factory=list)
    topic: str = ""
    aws: Path | None = None
    aws_version: str = ""
    sidecars: list[Sidecar] = field(default_factory=list)
    check_cpu: tuple[float, float] = (math.nan, math.nan)

    @property
    def log_dir(self) -> Path:
        return Path(self.kafka.log_dirs[0])

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def weed_cpu(self) -> float:
        pid = stack.read_pid(self.s3.pid_file)
        return cpu_seconds(pid) if pid else math.nan

    async def start_sidecar(
        self, name: str, *, include: list[str], prefix: str, refresh_interval_s: float
    ) -> Sidecar:
        run_dir = self.root / name
        run_dir.mkdir()
        metadata_topic = f"__rlm_{name}_{secrets.token_hex(3)}"
        config = write_sidecar_config(
            run_dir / "sidecar.toml",
            state_dir=run_dir / "state",
            log_dir=self.log_dir,
            bootstrap=self.kafka.bootstrap_servers,
            s3=self.s3,
            prefix=prefix,
            metadata_topic=metadata_topic,
            include_topics=include,
            part_size=self.args.part_mib * MiB,
            part_concurrency=self.args.part_concurrency,
            uploads=self.args.uploads,
            refresh_interval_s=refresh_interval_s,
        )
        sidecar = await Sidecar.start(
            config,
            sidecar_env(self.s3),
            run_dir / "sidecar.log",
            tree=self.args.sidecar_tree,
            server_pid=stack.read_pid(self.s3.pid_file),
        )
        sidecar.metadata_topic = metadata_topic
        self.sidecars.append(sidecar)
        return sidecar

    async def run_sidecar(self, index: int) -> Run:
        sidecar = await self.start_sidecar(
            f"tier-{index}",
            include=[self.topic],
            prefix="sidecar/",
            refresh_interval_s=self.args.refresh_interval,
        )
        try:
            tiered = await sidecar.wait_for(
                "segment_tiered", count=len(self.files), timeout=900, topic=self.topic
            )
            seen = time.time()
            rss = peak_rss_mib(sidecar.pid)
            ends = [event_time(e) for e in tiered]
            starts = [t - float(e["seconds"]) for t, e in zip(ends, tiered, strict=True)]
            t0, t1 = min(starts), max(ends)
            await asyncio.sleep(max(0.0, t1 + 0.1 - time.time()))  # a sample after t1
            cpu_window = sidecar.cpu_at(t1) - sidecar.cpu_at(t0)
            server_cpu = sidecar.cpu_at(t1, 3) - sidecar.cpu_at(t0, 3)
            system_cpu = sidecar.cpu_at(t1, 2) - sidecar.cpu_at(t0, 2)
            cpu_total = sidecar.cpu_at(t1)
            # idle: everything is tiered, the sidecar should only wait
            await asyncio.sleep(1.0)
            idle0, idle_t0 = cpu_seconds(sidecar.pid), time.monotonic()
            await asyncio.sleep(self.args.idle_seconds)
            idle = (cpu_seconds(sidecar.pid) - idle0) / (time.monotonic() - idle_t0)
            failures = sidecar.failures()
            bases = {(e["partition"], e["base_offset"]) for e in tiered}
            if len(bases) != len(self.files):
                raise RuntimeError(f"the sidecar tiered {len(bases)} distinct segments")
            tiered_bytes = sum(int(e["bytes"]) for e in tiered)
        finally:
            await sidecar.stop()
        lag = loop_lag(sidecar)
        say(
            f"  sidecar: first upload {t0 - sidecar.started_at:.1f} s after start,"
            f" last event seen {seen - t1:.2f} s after it was logged"
        )
        return Run(
            "sidecar",
            t1 - t0,
            tiered_bytes,
            cpu=cpu_window,
            server_cpu=server_cpu,
            extra={
                "cpu_total": cpu_total,
                "cpu_system": system_cpu,
                "cpu_startup": sidecar.cpu_at(t0),
                "startup_s": t0 - sidecar.started_at,
                "rss_mib": rss,
                "idle_core_pct": idle * 100,
                # what the sidecar spends anyway (probes, refreshes, tailer), per GiB here
                "cpu_net": cpu_window - idle * (t1 - t0),
                "failures": failures,
                "upload_s_p50": percentile([float(e["seconds"]) for e in tiered], 0.5),
                **lag,
            },
        )

    async def run_aiobotocore(self, _index: int) -> Run:
        async with default_client(self.s3) as client:
            await client.list_objects_v2(Bucket=self.s3.bucket, MaxKeys=1)  # connect, sign
            cpu0, weed0, t0 = self_cpu(), self.weed_cpu(), time.perf_counter()
            await aiobotocore_upload(
                client,
                self.s3.bucket,
                "aiobotocore/",
                self.files,
                part_size=self.args.part_mib * MiB,
                files_at_once=self.args.uploads,
                parts_at_once=self.args.part_concurrency,
            )
            seconds = time.perf_counter() - t0
            cpu, weed = self_cpu() - cpu0, self.weed_cpu() - weed0
        return Run("aiobotocore", seconds, self.total_bytes, cpu=cpu, server_cpu=weed)

    async def run_store(self, _index: int) -> Run:
        """The sidecar's own S3 code (S3ObjectStore.put_file: CRC-32C, unsigned payload) in
        this process, with the same concurrency: the floor under the sidecar's uploads."""
        store = S3ObjectStore(
            bucket=self.s3.bucket,
            endpoint_url=self.s3.endpoint,
            access_key_id=self.s3.access_key,
            secret_access_key=self.s3.secret_key,
        )
        gate = asyncio.Semaphore(self.args.uploads)

        async def one(item: SegmentFile) -> None:
            async with gate:
                await store.put_file(
                    "store/" + item.name,
                    item.path,
                    part_size=self.args.part_mib * MiB,
                    concurrency=self.args.part_concurrency,
                )

        async with store:
            await store.put("store/warm-up", b"x")  # connect
            cpu0, weed0, t0 = self_cpu(), self.weed_cpu(), time.perf_counter()
            await asyncio.gather(*(one(f) for f in self.files))
            seconds = time.perf_counter() - t0
            cpu, weed = self_cpu() - cpu0, self.weed_cpu() - weed0
        return Run("store", seconds, self.total_bytes, cpu=cpu, server_cpu=weed)

    def batch_check_cpu(self) -> tuple[float, float]:
        """CPU-seconds per GiB of the uploader's pass over every batch (CRC-32C checked), as
        it reads today (from the file) and over an mmap of the file (no read copies)."""
        t0 = time.process_time()
        for item in self.files:
            for _ in iter_batches(item.path, verify_crc=True):
                pass
        t1 = time.process_time()
        for item in self.files:
            with (
                item.path.open("rb") as handle,
                mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
                memoryview(mapped) as view,
            ):
                for _ in iter_batches(view, verify_crc=True):
                    pass
        t2 = time.process_time()
        gib = self.total_bytes / GiB
        return (t1 - t0) / gib, (t2 - t1) / gib

    async def run_aws_files(self, _index: int) -> Run:
        assert self.aws is not None
        env = awscli_env(self.s3, self.root / "aws", self.args.aws_checksum)
        cpu0, weed0, t0 = children_cpu(), self.weed_cpu(), time.perf_counter()
        for item in self.files:
            await run_checked(
                str(self.aws),
                "s3",
                "cp",
                str(item.path),
                f"s3://{self.s3.bucket}/awscli-files/{item.name}",
                "--endpoint-url",
                self.s3.endpoint,
                "--only-show-errors",
                env=env,
            )
        seconds = time.perf_counter() - t0
        cpu, weed = children_cpu() - cpu0, self.weed_cpu() - weed0
        return Run("aws-files", seconds, self.total_bytes, cpu=cpu, server_cpu=weed)

    async def run_aws_recursive(self, _index: int) -> Run:
        assert self.aws is not None
        env = awscli_env(self.s3, self.root / "aws", self.args.aws_checksum)
        staging = self.root / "aws-staging"
        if not staging.exists():
            for item in self.files:
                link = staging / item.name
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(item.path)
        cpu0, weed0, t0 = children_cpu(), self.weed_cpu(), time.perf_counter()
        await run_checked(
            str(self.aws),
            "s3",
            "cp",
            str(staging),
            f"s3://{self.s3.bucket}/awscli-recursive/",
            "--recursive",
            "--endpoint-url",
            self.s3.endpoint,
            "--only-show-errors",
            env=env,
        )
        seconds = time.perf_counter() - t0
        cpu, weed = children_cpu() - cpu0, self.weed_cpu() - weed0
        return Run("aws-recursive", seconds, self.total_bytes, cpu=cpu, server_cpu=weed)

    async def empty(self) -> None:
        async with default_client(self.s3) as client:
            await empty_bucket(client, self.s3.bucket)

    async def throughput(self) -> dict[str, list[Run]]:
        contenders: dict[str, Callable[[int], Awaitable[Run]]] = {
            "sidecar": self.run_sidecar,
            "aiobotocore": self.run_aiobotocore,
            "store": self.run_store,
        }
        if self.aws is not None:
            contenders["aws-files"] = self.run_aws_files
            contenders["aws-recursive"] = self.run_aws_recursive
        names = list(contenders)
        results: dict[str, list[Run]] = {n: [] for n in names}
        say("warm-up: one untimed aiobotocore upload of the set (page cache, SeaweedFS volumes)")
        await self.run_aiobotocore(-1)
        await self.empty()
        for index in range(self.args.runs):
            order = names[index % len(names) :] + names[: index % len(names)]
            for name in order:
                run = await contenders[name](index)
                results[name].append(run)
                say(
                    f"run {index + 1}/{self.args.runs} {name:14s} {run.seconds:6.2f} s"
                    f" {run.mib_s:7.1f} MiB/s"
                    + (f" client CPU {run.cpu / (run.bytes / GiB):.2f} s/GiB" if run.cpu else "")
                )
                await self.empty()
                await asyncio.sleep(self.args.pause)
        return results

    # -----------------------------------------------------------------------------------------
    # phase 2: roll -> FINISHED latency

    async def latency(self) -> dict[str, Any]:
        args = self.args
        topic = f"bench-latency-{secrets.token_hex(3)}"
        await create_topic(
            self.kafka.bootstrap_servers,
            topic,
            partitions=1,
            configs={"segment.bytes": str(MiB), "segment.ms": NO_TIME_ROLL},
        )
        partition_dir = self.log_dir / f"{topic}-0"
        appeared: dict[int, float] = {}
        stop_polling = threading.Event()

        def poll() -> None:  # a thread: the event loop's hiccups do not delay the clock
            while not stop_polling.is_set():
                with contextlib.suppress(FileNotFoundError):
                    for entry in os.scandir(partition_dir):
                        if entry.name.endswith(".log"):
                            base = int(entry.name[:-4])
                            if base not in appeared:
                                appeared[base] = time.time()
                stop_polling.wait(0.01)

        poller = threading.Thread(target=poll, name="log dir poller", daemon=True)
        poller.start()
        sidecar = await self.start_sidecar(
            "latency", include=[topic], prefix="latency/", refresh_interval_s=args.refresh_interval
        )
        started: dict[Any, SegmentMetadata] = {}
        finished: dict[int, tuple[float, SegmentMetadata]] = {}  # start offset -> seen, meta
        finished_event = asyncio.Event()
        stop = asyncio.Event()

        async def tail_metadata() -> None:
            await sidecar.wait_for("metadata_topic_created", timeout=120)
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.kafka.bootstrap_servers, enable_auto_commit=False
            )
            await consumer.start()
            try:
                tps = [TopicPartition(sidecar.metadata_topic, p) for p in range(5)]
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                while not stop.is_set():
                    batch = await consumer.getmany(timeout_ms=200)
                    now = time.time()
                    for records in batch.values():
                        for record in records:
                            event = decode(record.value)
                            if isinstance(event, SegmentMetadata):
                                started[event.segment_id] = event
                            elif (
                                isinstance(event, SegmentMetadataUpdate)
                                and event.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED
                            ):
                                meta = started[event.segment_id]
                                finished[meta.start_offset] = (now, meta)
                                finished_event.set()
            finally:
                await consumer.stop()

        async def produce() -> None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.kafka.bootstrap_servers, acks=1, linger_ms=0
            )
            await producer.start()
            pool = os.urandom(4 * MiB)
            per_segment = MiB // (VALUE_BYTES + 100)
            interval = args.roll_every / per_segment
            try:
                i = 0
                next_at = time.monotonic()
                while not stop.is_set():
                    start = (i * 7919) % (len(pool) - VALUE_BYTES)
                    await producer.send_and_wait(topic, pool[start : start + VALUE_BYTES])
                    i += 1
                    next_at += interval
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            finally:
                await producer.stop()

        probe_store = S3ObjectStore(
            bucket=self.s3.bucket,
            endpoint_url=self.s3.endpoint,
            access_key_id=self.s3.access_key,
            secret_access_key=self.s3.secret_key,
        )
        layout = KeyLayout(prefix="latency/")
        transfers: dict[int, float] = {}

        async def probe(meta: SegmentMetadata) -> float:
            """The same three objects, PUT one after the other as the uploader does."""
            tip = meta.segment_id.topic_id_partition
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
                sizes[suffix] = (await probe_store.head(key)).size
            log_path = partition_dir / f"{meta.start_offset:020d}.log"
            t0 = time.perf_counter()
            await probe_store.put_file(
                f"probe/{meta.start_offset}.log",
                log_path,
                part_size=args.part_mib * MiB,
                concurrency=args.part_concurrency,
            )
            await probe_store.put(
                f"probe/{meta.start_offset}.indexes", os.urandom(sizes[ObjectSuffix.INDEXES])
            )
            await probe_store.put(
                f"probe/{meta.start_offset}.manifest", os.urandom(sizes[ObjectSuffix.MANIFEST])
            )
            return time.perf_counter() - t0

        tasks = [
            asyncio.create_task(tail_metadata(), name="metadata tail"),
            asyncio.create_task(produce(), name="producer"),
        ]
        warmup = args.latency_warmup
        wanted = warmup + args.latency_segments
        deadline = time.monotonic() + 120 + wanted * (args.roll_every * 4 + 2)
        abandoned = 0
        caught_up_at: float | None = None
        counted = 0
        try:
            async with probe_store:
                await probe_store.put("probe/warm-up", b"x" * 1024)  # open the connection
                probed: set[int] = set()
                while len(transfers) < args.latency_segments:
                    for task in tasks:
                        if task.done():
                            task.result()
                            raise RuntimeError(f"{task.get_name()} ended early")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"only {len(finished)} segments finished in time")
                    finished_event.clear()
                    for base in sorted(set(finished) - probed):
                        probed.add(base)
                        seen, meta = finished[base]
                        if caught_up_at is None:
                            caught_up_at = seen  # the sidecar has started uploading
                        rolled = appeared.get(meta.end_offset + 1)
                        # only rolls after that: startup (handover delay) is not latency
                        if rolled is None or rolled <= caught_up_at:
                            continue
                        counted += 1
                        if counted <= warmup:
                            continue
                        try:
                            transfers[base] = await probe(meta)
                        except KeyNotFoundError:  # the copy was abandoned after FINISHED
                            abandoned += 1
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(finished_event.wait(), 1.0)
                stop.set()
                await asyncio.gather(*tasks)
        finally:
            stop.set()
            stop_polling.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            tiered_events = sidecar.matching("segment_tiered", topic=topic)
            ready_events = sidecar.matching("segment_ready", topic=topic)
            failures = sidecar.failures()
            await sidecar.stop()
            lag = loop_lag(sidecar)
            poller.join(1.0)
        tiered = {int(e["base_offset"]): e for e in tiered_events}
        ready = {int(e["base_offset"]): event_time(e) for e in ready_events}
        rows: list[dict[str, float]] = []
        for base, transfer in sorted(transfers.items()):
            seen, meta = finished[base]
            rolled = appeared.get(meta.end_offset + 1)
            previous = [b for b in finished if b < base]
            event = tiered.get(base)
            if rolled is None or event is None or base not in ready:
                continue
            logged = event_time(event)
            upload_start = logged - float(event["seconds"])
            rows.append(
                {
                    "total": seen - rolled,
                    "transfer": transfer,
                    "beyond": seen - rolled - transfer,
                    "detect": ready[base] - rolled,
                    "wait": upload_start - ready[base],
                    "upload": float(event["seconds"]),
                    "upload_beyond": float(event["seconds"]) - transfer,
                    "visible": seen - logged,
                    # the previous segment was still on its way when this one rolled
                    "queued": float(bool(previous) and finished[max(previous)][0] > rolled),
                }
            )
        return {
            "rows": rows,
            "failures": failures,
            "topic": topic,
            "abandoned": abandoned,
            "lag": lag,
        }


# ---------------------------------------------------------------------------------------------
# report


def report(bench: Bench, results: dict[str, list[Run]], latency: dict[str, Any] | None) -> str:
    args = bench.args
    lines: list[str] = []
    out = lines.append
    out(
        f"machine: {platform.machine()}, {os.cpu_count()} cores (shared), "
        f"Python {platform.python_version()}, load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    if bench.aws_version:
        out(f"aws: {bench.aws_version}")
    out(f"this script's event loop: {'uvloop' if args.uvloop else 'asyncio'} (the sidecar: uvloop)")
    if args.sidecar_tree != REPO:
        out(f"sidecar package from {args.sidecar_tree} (not this checkout)")
    if results:
        sizes = [f.size for f in bench.files]
        out(
            f"(1) tiering throughput: {len(bench.files)} rolled segments of"
            f" {min(sizes) / MiB:.1f}-{max(sizes) / MiB:.1f} MiB, {bench.total_bytes / MiB:.0f} MiB"
            f" of .log in {args.partitions} partitions; part size {args.part_mib} MiB,"
            f" {args.uploads} segments x {args.part_concurrency} parts in flight;"
            f" median of {args.runs} interleaved runs"
        )
        medians = {n: statistics.median(r.mib_s for r in runs) for n, runs in results.items()}
        labels = {
            "sidecar": "sidecar run (tiering window)",
            "aiobotocore": "aiobotocore MPU, defaults",
            "aws-files": "aws s3 cp, one per file",
            "aws-recursive": "aws s3 cp --recursive",
            "store": "S3ObjectStore.put_file, here",
        }
        goals = {"aiobotocore": "0.9", "aws-files": "1.5", "aws-recursive": "1.5"}
        out(
            f"    {'contender':30s} {'MiB/s':>7s}  {'runs':22s} {'client CPU':>10s}"
            f" {'S3 CPU':>7s}  {'sidecar/x':>9s}  goal"
        )
        for name, runs in results.items():
            each = " ".join(f"{r.mib_s:.0f}" for r in runs)
            cpu = statistics.median((r.cpu or 0) / (r.bytes / GiB) for r in runs)
            weed = statistics.median((r.server_cpu or 0) / (r.bytes / GiB) for r in runs)
            ratio = medians["sidecar"] / medians[name]
            goal = goals.get(name)
            verdict = ""
            if goal is not None:
                verdict = f">= {goal}x {'met' if ratio >= float(goal) else 'NOT met'}"
            out(
                f"    {labels[name]:30s} {medians[name]:7.1f}  {each:22s} {cpu:6.2f} s/GiB"
                f" {weed:5.2f}  {ratio:8.2f}x  {verdict}"
            )
        sc = results["sidecar"]
        per_gib = [r.cpu / (r.bytes / GiB) for r in sc if r.cpu is not None]
        out("(3) sidecar process, per run:")
        out(
            "    CPU in tiering window    "
            + " ".join(f"{x:.2f}" for x in per_gib)
            + f" CPU-s/GiB, median {statistics.median(per_gib):.2f}"
            + f"  (goal <= 0.5: {'met' if statistics.median(per_gib) <= 0.5 else 'NOT met'})"
        )
        out(
            "    net of the idle rate     "
            + " ".join(f"{r.extra['cpu_net'] / (r.bytes / GiB):.2f}" for r in sc)
            + " CPU-s/GiB (window CPU minus idle CPU/s x window)"
        )
        out(
            "    of which system time     "
            + " ".join(f"{r.extra['cpu_system'] / (r.bytes / GiB):.2f}" for r in sc)
            + " CPU-s/GiB; the uploader's batch CRC pass alone (measured here):"
            + f" {bench.check_cpu[0]:.2f} CPU-s/GiB from the file,"
            + f" {bench.check_cpu[1]:.2f} over an mmap"
        )
        out(
            "    startup CPU, startup time "
            + " ".join(f"{r.extra['cpu_startup']:.2f}" for r in sc)
            + " CPU-s, "
            + " ".join(f"{r.extra['startup_s']:.1f}" for r in sc)
            + " s (not counted above)"
        )
        out(
            "    CPU incl. startup        "
            + " ".join(f"{r.extra['cpu_total'] / (r.bytes / GiB):.2f}" for r in sc)
            + " CPU-s/GiB"
        )
        out(
            "    peak RSS (VmHWM)         "
            + " ".join(f"{r.extra['rss_mib']:.0f}" for r in sc)
            + " MiB"
        )
        out(
            "    idle once caught up      "
            + " ".join(f"{r.extra['idle_core_pct']:.1f}" for r in sc)
            + f" % of one core (over {args.idle_seconds:.0f} s)"
        )
        out(
            "    upload seconds per segment, p50 "
            + " ".join(f"{r.extra['upload_s_p50']:.2f}" for r in sc)
            + "; failures logged "
            + " ".join(f"{r.extra['failures']:.0f}" for r in sc)
        )
        for r in sc:
            out("    event-loop lag, whole run " + lag_line(r.extra))
    if latency is not None:
        rows = latency["rows"]
        out(
            f"(2) roll -> COPY_SEGMENT_FINISHED visible, {len(rows)} segments of 1 MiB, one roll"
            f" every ~{args.roll_every:.1f} s, metadata_refresh_interval_s ="
            f" {args.refresh_interval}"
        )
        out(f"    {'seconds':44s} {'p50':>7s} {'p99':>7s} {'max':>7s}")
        names = {
            "beyond": "beyond transfer (roll -> visible - transfer)",
            "total": "roll -> FINISHED visible",
            "transfer": "transfer (direct PUTs of the same objects)",
            "detect": "  roll -> segment_ready (detector)",
            "wait": "  segment_ready -> upload starts",
            "upload": "  upload (segment_tiered seconds)",
            "upload_beyond": "  upload - transfer (metadata round trips)",
            "visible": "  FINISHED seen here - segment_tiered logged",
        }
        for key, label in names.items():
            values = [r[key] for r in rows]
            out(
                f"    {label:44s} {percentile(values, 0.5):7.3f} {percentile(values, 0.99):7.3f}"
                f" {max(values, default=math.nan):7.3f}"
            )
        beyond = [r["beyond"] for r in rows]
        p50, p99 = percentile(beyond, 0.5), percentile(beyond, 0.99)
        out(
            f"    goal p50 <= 0.3 s: {'met' if p50 <= 0.3 else 'NOT met'};"
            f" goal p99 <= 1 s: {'met' if p99 <= 1.0 else 'NOT met'};"
            f" segments that rolled before the previous one finished:"
            f" {sum(int(r['queued']) for r in rows)}; failures logged: {latency['failures']};"
            f" copies gone after FINISHED: {latency['abandoned']}"
        )
        out("    event-loop lag, whole run " + lag_line(latency["lag"]))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


async def amain(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="bench-tiering-", dir="/tmp"))
    say(f"working directory {root}")
    kafka = s3 = None
    bench: Bench | None = None
    try:
        aws = aws_version = None
        if not args.no_awscli:
            aws, aws_version = await asyncio.to_thread(ensure_awscli, args.awscli_spec)
        kafka = stack.KafkaCluster.create(root / "kafka", nodes=1)
        s3 = stack.SeaweedS3.create(root / "s3")
        t = time.monotonic()
        await asyncio.to_thread(s3.start)
        await asyncio.to_thread(kafka.start)
        say(f"Kafka and SeaweedFS up in {time.monotonic() - t:.1f} s")
        bench = Bench(args, root, kafka, s3, aws=aws, aws_version=aws_version or "")
        results: dict[str, list[Run]] = {}
        latency = None
        if args.runs > 0:
            bench.topic = f"bench-tier-{secrets.token_hex(3)}"
            t = time.monotonic()
            bench.files = await produce_big_set(
                kafka.bootstrap_servers,
                bench.topic,
                bench.log_dir,
                mib=args.mib,
                partitions=args.partitions,
                segment_mib=args.segment_mib,
            )
            say(
                f"produced {len(bench.files)} rolled segments, {bench.total_bytes / MiB:.0f} MiB,"
                f" in {time.monotonic() - t:.1f} s"
            )
            bench.check_cpu = bench.batch_check_cpu()
            results = await bench.throughput()
        if args.latency_segments > 0:
            say("latency: single 1 MiB segments rolling one at a time")
            latency = await bench.latency()
        print(report(bench, results, latency))
        return 0
    finally:
        if bench is not None:
            for sidecar in bench.sidecars:
                await sidecar.stop()
        if s3 is not None:
            await asyncio.to_thread(s3.stop)
        if kafka is not None:
            await asyncio.to_thread(kafka.stop)
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB of rolled segments to tier")
    parser.add_argument("--segment-mib", type=int, default=32, help="segment.bytes in MiB")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--part-mib", type=int, default=16, help="multipart part size")
    parser.add_argument(
        "--uploads", type=int, default=4, help="segments at once (max_concurrent_uploads)"
    )
    parser.add_argument("--part-concurrency", type=int, default=2, help="parts at once per segment")
    parser.add_argument("--runs", type=int, default=3, help="runs of each contender (0: none)")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between runs")
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    parser.add_argument("--latency-segments", type=int, default=40, help="0: skip phase 2")
    parser.add_argument(
        "--latency-warmup",
        type=int,
        default=1,
        help="segments not measured after the sidecar's first upload (startup waits are not"
        " latency: a new leader waits metadata_refresh_interval_s + 1 s before uploading)",
    )
    parser.add_argument("--roll-every", type=float, default=2.5, help="seconds per 1 MiB")
    parser.add_argument(
        "--refresh-interval",
        type=float,
        default=1.0,
        help="the sidecar's kafka.metadata_refresh_interval_s (tests use 1.0; default 10)",
    )
    parser.add_argument("--no-awscli", action="store_true")
    parser.add_argument("--awscli-spec", default="awscli")
    parser.add_argument(
        "--aws-checksum",
        default=None,
        help="AWS_REQUEST_CHECKSUM_CALCULATION for aws (e.g. when_required); unset by default",
    )
    parser.add_argument("--keep", action="store_true", help="keep the /tmp working directory")
    parser.add_argument(
        "--sidecar-tree",
        type=Path,
        default=REPO,
        help="run `python -m sidecar` from this directory (to bench a patched copy)",
    )
    parser.add_argument(
        "--uvloop",
        action="store_true",
        help="run this script (the in-process contenders) on uvloop, as the sidecar runs",
    )
    args = parser.parse_args(argv)
    if args.uvloop:
        import uvloop

        return uvloop.run(amain(args))
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
