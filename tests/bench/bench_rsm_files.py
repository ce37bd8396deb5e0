"""The read server's CPU per broker-plugin window of cached data: answered with the chunk files'
paths (``"files": true``, the plugin reads them itself) against sent as bytes (``sendfile``),
side by side in one run.

A read server runs in this process over the memory object store, with one segment's ``.log``
(random bytes: a ``fetch-segment`` range is raw bytes, never parsed) read once so that every
chunk is in the disk cache. A client process then asks for the segment's 4 MiB windows in order,
as the plugin's sequential windows do (``readahead_end`` at the segment's end), ``--requests`` of
them, once with ``"files": true`` (and reads each file range it is given, as the plugin would)
and once without; the two alternate ``--runs`` times. Printed per mode: this process's CPU
milliseconds per request (the server alone: the client is another process) and the wall time per
request; and the ratio of the CPU, files / bytes.

    .venv/bin/python tests/bench/bench_rsm_files.py
    .venv/bin/python tests/bench/bench_rsm_files.py --requests 800 --runs 5

Everything lives in a ``/tmp/bench-rsm-files-*`` directory, removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sidecar.kafka.checkpoints import encode_kafka_uuid  # noqa: E402
from sidecar.metadata.store import RemoteSegmentStore  # noqa: E402
from sidecar.observability.metrics import Metrics  # noqa: E402
from sidecar.readserver import ChunkCache, ReadServer, ReadService  # noqa: E402
from sidecar.readserver.rsm import CacheFileOffer  # noqa: E402
from sidecar.storage.keys import KeyLayout, ObjectSuffix  # noqa: E402
from sidecar.storage.memory import MemoryObjectStore  # noqa: E402

WINDOW = 4 * 1024 * 1024
TOPIC_ID = uuid.UUID(int=0x5EED)


def _metadata(segment_id: uuid.UUID, size: int) -> dict[str, Any]:
    return {
        "topic": "bench",
        "topic_id": encode_kafka_uuid(TOPIC_ID),
        "partition": 0,
        "segment_id": encode_kafka_uuid(segment_id),
        "start_offset": 0,
        "end_offset": 999,
        "max_timestamp_ms": 1_700_000_000_000,
        "broker_id": 1,
        "event_timestamp_ms": 1_700_000_000_001,
        "segment_size_in_bytes": size,
        "segment_leader_epochs": [[0, 0]],
    }


async def client(socket: str, meta: dict[str, Any], requests: int, files: bool) -> None:
    """(the client process) ``requests`` windows in order, reading what each answer names."""
    size = meta["segment_size_in_bytes"]
    connector = aiohttp.UnixConnector(path=socket)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(requests):
            start = (i * WINDOW) % (size - WINDOW + 1)
            body = {**meta, "start": start, "end": start + WINDOW - 1, "readahead_end": size - 1}
            if files:
                body["files"] = True
            url = "http://localhost/v1/rsm/fetch-segment"
            async with session.post(url, json=body) as response:
                if response.status != 200:
                    raise SystemExit(f"HTTP {response.status}: {await response.text()}")
                if files and response.content_type != "application/json":
                    raise SystemExit("asked for files, got bytes: the chunks are not all cached")
                data = await response.read()
            got = 0
            if files:
                for entry in json.loads(data)["files"]:
                    with Path(entry["path"]).open("rb") as file:
                        got += len(os.pread(file.fileno(), entry["length"], entry["offset"]))
            else:
                got = len(data)
            if got != WINDOW:
                raise SystemExit(f"{got} bytes for a window of {WINDOW}")


async def serve(args: argparse.Namespace, root: Path) -> dict[str, list[tuple[float, float]]]:
    objects = MemoryObjectStore()
    layout = KeyLayout(prefix="bench/")
    segment_id = uuid.uuid4()
    size = args.segment_mib * 1024 * 1024
    key = layout.segment_key(
        topic="bench",
        topic_id=TOPIC_ID,
        partition=0,
        base_offset=0,
        segment_id=segment_id,
        suffix=ObjectSuffix.LOG,
    )
    await objects.put(key, os.urandom(size))
    chunks = ChunkCache(
        objects=objects, directory=root / "cache", max_bytes=2 * size, chunk_size=WINDOW
    )
    store = RemoteSegmentStore(root / "state")
    service = ReadService(store=store, objects=objects, layout=layout, chunks=chunks)
    server = ReadServer(
        service=service,
        socket_path=root / "r.sock",
        metrics=Metrics(),
        cache_files=CacheFileOffer(chunks.directory),
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(server.run(stopping))
    await server.started.wait()
    meta = _metadata(segment_id, size)
    (root / "meta.json").write_text(json.dumps(meta))
    results: dict[str, list[tuple[float, float]]] = {"files": [], "bytes": []}
    try:
        # the whole segment once: every chunk fetched and written to the cache
        await _run_client(server.socket_path, "bytes", size // WINDOW)
        await chunks.idle()
        for _ in range(args.runs):
            for mode in ("files", "bytes"):
                cpu, wall = time.process_time(), time.perf_counter()
                await _run_client(server.socket_path, mode, args.requests)
                results[mode].append(
                    (
                        (time.process_time() - cpu) / args.requests * 1000,
                        (time.perf_counter() - wall) / args.requests * 1000,
                    )
                )
    finally:
        stopping.set()
        await task
        store.close()
    return results


async def _run_client(socket: Path, mode: str, requests: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", str(socket), mode, str(requests)
    )
    if await proc.wait() != 0:
        raise SystemExit(f"the {mode} client failed")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        socket, mode, requests = sys.argv[2], sys.argv[3], int(sys.argv[4])
        meta = json.loads((Path(socket).parent / "meta.json").read_text())
        uvloop.run(client(socket, meta, requests, mode == "files"))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segment-mib", type=int, default=256, help="the cached segment's size")
    parser.add_argument("--requests", type=int, default=400, help="windows per run and mode")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of each mode")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-rsm-files-"))
    try:
        results = uvloop.run(serve(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"machine: {os.uname().machine}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(
        f"{args.requests} requests of {WINDOW // 1024 // 1024} MiB windows per run, {args.runs}"
        f" runs per mode, a {args.segment_mib} MiB segment in the chunk cache"
    )
    medians = {}
    for mode, runs in results.items():
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        medians[mode] = cpu
        per_run = " ".join(f"{r[0]:.2f}" for r in runs)
        print(
            f"    {mode:5s}  server CPU {cpu:.2f} ms per request (runs: {per_run}),"
            f" wall {wall:.2f} ms"
        )
    print(f"    server CPU per request, files / bytes: {medians['files'] / medians['bytes']:.2f} x")


if __name__ == "__main__":
    main()
