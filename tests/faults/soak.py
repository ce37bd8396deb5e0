"""``make soak`` (not in CI): the daemon under load for ``SOAK_MINUTES`` (default 20) on a
local stack of its own — a producer, tiering, 32 socket readers, remote retention, one scrub
half-way, one S3 fault a minute through the fault proxy — while its RSS, open files and
threads are sampled every ``SOAK_SAMPLE_S`` seconds. It fails (exit 1) when a resource grows
without bound (the last third's peak above the first third's by more than half, plus a
margin), when a reader gets wrong bytes (a CRC-checked batch decode) or an unexpected status,
or when the daemon exits. It prints a JSON summary.

``SOAK_MINUTES=3 make soak`` is a short run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from sidecar.kafka.records import decode_batches
from tests.conftest import stack
from tests.e2e._support import Sidecar, metric_samples, write_config
from tests.faults._harness import FaultProxy, through
from tests.faults.proxy import FAULTS
from tests.helpers import create_topic
from tests.sidecar_runner import sidecar_env

PARTITIONS = 4
READERS = 32


async def _produce(bootstrap: str, topic: str, stop: asyncio.Event, counts: Counter[str]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        i = 0
        while not stop.is_set():
            for _ in range(200):
                await producer.send(topic, value=os.urandom(1000), key=f"k{i}".encode())
                i += 1
            await producer.flush()
            counts["produced"] += 200
            await asyncio.sleep(0.2)  # about 1 MB/s
    finally:
        await producer.stop()


async def _reader(
    socket_path: Path, topic: str, stop: asyncio.Event, counts: Counter[str], rng: random.Random
) -> None:
    connector = aiohttp.UnixConnector(path=str(socket_path))
    async with aiohttp.ClientSession(connector=connector) as http:
        while not stop.is_set():
            partition = rng.randrange(PARTITIONS)
            base = f"http://localhost/v1/topics/{topic}/partitions/{partition}"
            try:
                async with http.get(base) as response:
                    info = await response.json()
                tiered = info.get("tiered")
                if response.status != 200 or not tiered:
                    counts[f"info_{response.status}"] += 1
                    await asyncio.sleep(0.5)
                    continue
                offset = rng.randint(tiered["start_offset"], tiered["end_offset"])
                params = {"offset": str(offset), "max_bytes": str(256 * 1024)}
                async with http.get(base + "/records", params=params) as response:
                    body = await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                counts[f"client_{type(exc).__name__}"] += 1
                continue
            counts[f"status_{status}"] += 1
            if status == 200:
                try:
                    batches = list(decode_batches(body))  # CRC-checked
                except Exception:  # noqa: BLE001 - counted: a wrong byte is a failure
                    counts["wrong_bytes"] += 1
                    continue
                if batches and batches[0][0].last_offset < offset:
                    counts["wrong_offset"] += 1


def proc_sample(pid: int) -> dict[str, int]:
    """The RSS, threads and open files of process ``pid``, from ``/proc``."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_kib": int(fields["VmRSS"].split()[0]),
        "threads": int(fields["Threads"]),
        "open_files": sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir()),
    }


def bounded(samples: list[dict[str, int]], key: str, margin: int) -> bool:
    """Whether ``key`` stayed bounded: the last third's peak is at most the first third's by
    half, plus ``margin``."""
    third = max(1, len(samples) // 3)
    first = max(s[key] for s in samples[:third])
    last = max(s[key] for s in samples[-third:])
    return last <= first * 1.5 + margin


async def soak(minutes: float, sample_s: float, root: Path) -> dict[str, Any]:
    kafka = stack.KafkaCluster.create(root / "kafka", nodes=1)
    s3 = stack.SeaweedS3.create(root / "s3")
    kafka.start()
    s3.start()
    proxy = FaultProxy(s3.endpoint, root / "proxy")
    topic = "soak"
    counts: Counter[str] = Counter()
    samples: list[dict[str, int]] = []
    faults: list[str] = []
    sidecar = None
    try:
        bootstrap = kafka.bootstrap_servers
        await create_topic(
            bootstrap,
            topic,
            partitions=PARTITIONS,
            configs={
                "segment.bytes": "1048576",
                "retention.bytes": str(24 * 1024 * 1024),  # remote retention deletes too
            },
        )
        port = stack.free_port()
        config = write_config(
            root / "sidecar.toml",
            state_dir=root / "state",
            log_dir=kafka.log_dirs[0],
            bootstrap=bootstrap,
            s3=through(s3, proxy),
            metrics_port=port,
            metadata_topic="__rlm_soak",
            include_topics=[topic],
            prefix="soak/",
            retention={"interval_s": 10},
            read_server={"cache_size_bytes": 64 * 1024 * 1024},
        )
        sidecar = await Sidecar.start(config, sidecar_env(s3), root / "sidecar.log")
        await sidecar.wait_for("sidecar_ready", timeout=120)
        stop = asyncio.Event()
        rng = random.Random(7)
        socket_path = root / "state" / "read.sock"
        tasks = [asyncio.create_task(_produce(bootstrap, topic, stop, counts))]
        tasks += [
            asyncio.create_task(_reader(socket_path, topic, stop, counts, random.Random(i)))
            for i in range(READERS)
        ]
        started = time.monotonic()
        end = started + minutes * 60
        next_fault = started + 60
        scrubbed = False
        while time.monotonic() < end:
            if sidecar.exited:
                raise AssertionError("the sidecar exited\n" + sidecar.tail(60))
            samples.append(proc_sample(sidecar.proc.pid))
            now = time.monotonic()
            if now >= next_fault:
                fault = FAULTS[len(faults) % len(FAULTS)]
                op = rng.choice(["PutObject", "GetObject", "DeleteObjects"])
                proxy.set({"fault": fault, "op": op, "count": 3, "delay_s": 0.5})
                faults.append(f"{fault}:{op}")
                next_fault = now + 60
            if not scrubbed and now >= started + minutes * 30:
                scrub = await asyncio.to_thread(
                    subprocess.run,
                    [
                        sys.executable,
                        "-m",
                        "sidecar",
                        "scrub",
                        "--execute",
                        "--config",
                        str(config),
                        "--json",
                    ],
                    env=sidecar_env(s3),
                    capture_output=True,
                    text=True,
                    check=False,
                )
                counts[f"scrub_exit_{scrub.returncode}"] += 1
                scrubbed = True
            await asyncio.sleep(sample_s)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        metrics = await metric_samples(port)
        tiered = sum(
            v for (n, _), v in metrics.items() if n == "kafka_tiered_sidecar_segments_copied_total"
        )
        deleted = sum(
            v
            for (n, _), v in metrics.items()
            if n == "kafka_tiered_sidecar_retention_deleted_segments_total"
        )
        exit_code = await sidecar.stop()
        limits = {
            "rss_kib": bounded(samples, "rss_kib", 32 * 1024),
            "open_files": bounded(samples, "open_files", 32),
            "threads": bounded(samples, "threads", 8),
        }
        return {
            "minutes": minutes,
            "faults": faults,
            "counts": dict(counts),
            "segments_tiered": tiered,
            "segments_deleted_by_retention": deleted,
            "samples": len(samples),
            "first": samples[0] if samples else None,
            "peak": {k: max(s[k] for s in samples) for k in samples[0]} if samples else None,
            "last": samples[-1] if samples else None,
            "bounded": limits,
            "exit_code": exit_code,
            "ok": all(limits.values())
            and exit_code == 0
            and counts["wrong_bytes"] == 0
            and counts["wrong_offset"] == 0,
        }
    finally:
        if sidecar is not None and sidecar.proc.returncode is None:
            await sidecar.kill()
        proxy.stop()
        s3.stop()
        kafka.stop()


def run_soak(
    soak_fn: Callable[[float, float, Path], Awaitable[dict[str, Any]]], prefix: str
) -> int:
    """Run ``soak_fn`` for ``SOAK_MINUTES``, sampling every ``SOAK_SAMPLE_S`` seconds, in a
    new directory; print its JSON summary; exit 0 when it says ``ok``."""
    minutes = float(os.environ.get("SOAK_MINUTES", "20"))
    sample_s = float(os.environ.get("SOAK_SAMPLE_S", "10"))
    root = Path(tempfile.mkdtemp(prefix=prefix))
    summary = asyncio.run(soak_fn(minutes, sample_s, root))
    summary["root"] = str(root)
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


def main() -> int:
    return run_soak(soak, "sidecar-soak-")


if __name__ == "__main__":
    sys.exit(main())
