"""A TCP proxy that holds every byte a client sends for ``--delay-ms`` before passing it on, so
each request reaches the server that much later: the first-byte latency of a remote object
store, in front of the loopback SeaweedFS. Responses pass at once; order is kept.

    python tests/bench/_latency_proxy.py --upstream 127.0.0.1:8333 --delay-ms 20

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


def start(endpoint: str, delay_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    """The proxy in front of ``endpoint`` (``http://host:port``), as a process of its own:
    the process (stop it by its PID) and the endpoint to use instead."""
    upstream = endpoint.split("://", 1)[1].rstrip("/")
    proxy = subprocess.Popen(
        [sys.executable, str(Path(__file__)), "--upstream", upstream, "--delay-ms", str(delay_ms)],
        stdout=subprocess.PIPE,
    )
    assert proxy.stdout is not None
    port = proxy.stdout.readline().strip()  # printed once it listens; empty if it died
    if not port.isdigit():
        proxy.kill()
        proxy.wait()
        raise RuntimeError("the latency proxy did not start")
    return proxy, f"http://127.0.0.1:{int(port)}"


async def _pump_now(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while piece := await reader.read(1 << 20):
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


async def _serve(upstream: tuple[str, int], delay_s: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await asyncio.gather(
                _pump_late(reader, up_writer, delay_s), _pump_now(up_reader, writer)
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
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    asyncio.run(_serve((host, int(port)), args.delay_ms / 1000))


if __name__ == "__main__":
    main()
