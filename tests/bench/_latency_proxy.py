"""A TCP proxy that holds every byte a client sends for ``--delay-ms`` before passing it on, so
each request reaches the server that much later: the first-byte latency of a remote object
store, in front of the loopback SeaweedFS. Responses pass at once, or with ``--mb-per-s`` at
most that many MB (10^6 bytes) per second on each connection, as an object store's per-
connection throughput (Amazon S3 documents about 85-90 MB/s per connection for large GETs);
order is kept.

    python tests/bench/_latency_proxy.py --upstream 127.0.0.1:8333 --delay-ms 20
    python tests/bench/_latency_proxy.py --upstream 127.0.0.1:8333 --delay-ms 20 --mb-per-s 90

Binds 127.0.0.1 on a free port and prints it (one line) once listening; runs until killed.
The benchmarks start it with :func:`start`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path


def start(
    endpoint: str, delay_ms: float, mb_per_s: float = 0
) -> tuple[subprocess.Popen[bytes], str]:
    """The proxy in front of ``endpoint`` (``http://host:port``), as a process of its own:
    the process (stop it by its PID) and the endpoint to use instead."""
    upstream = endpoint.split("://", 1)[1].rstrip("/")
    command = [sys.executable, str(Path(__file__)), "--upstream", upstream]
    command += ["--delay-ms", str(delay_ms), "--mb-per-s", str(mb_per_s)]
    proxy = subprocess.Popen(command, stdout=subprocess.PIPE)
    assert proxy.stdout is not None
    port = proxy.stdout.readline().strip()  # printed once it listens; empty if it died
    if not port.isdigit():
        proxy.kill()
        proxy.wait()
        raise RuntimeError("the latency proxy did not start")
    return proxy, f"http://127.0.0.1:{int(port)}"


async def _pump_now(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, bytes_per_s: float
) -> None:
    due = time.monotonic()  # when the bytes passed so far may all have left, at the cap
    try:
        while piece := await reader.read(1 << 16 if bytes_per_s else 1 << 20):
            if bytes_per_s:
                now = time.monotonic()
                due = max(due, now) + len(piece) / bytes_per_s
                if due - now > 0.002:  # timers are coarser than one 64 KiB piece at 90 MB/s
                    await asyncio.sleep(due - now)
            writer.write(piece)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def _pump_late(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float
) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, piece = await queue.get()
            if not piece:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(piece)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            piece = await reader.read(1 << 20)
            queue.put_nowait((time.monotonic() + delay_s, piece))
            if not piece:
                break
        await sender
    finally:
        sender.cancel()
        with contextlib.suppress(OSError):
            writer.close()


async def _serve(upstream: tuple[str, int], delay_s: float, bytes_per_s: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await asyncio.gather(
                _pump_late(reader, up_writer, delay_s), _pump_now(up_reader, writer, bytes_per_s)
            )

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="host:port")
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--mb-per-s", type=float, default=0, help="per connection; 0: no cap")
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    asyncio.run(_serve((host, int(port)), args.delay_ms / 1000, args.mb_per_s * 1e6))


if __name__ == "__main__":
    main()
