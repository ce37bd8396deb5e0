"""A fault-injecting HTTP/1.1 proxy in front of an S3 server, run as its own process.

``python -m tests.faults.proxy --upstream 127.0.0.1:8333 --ready-file ready.json`` listens on
127.0.0.1 (a free port) and forwards every request byte for byte to the upstream, Host header
unchanged: an S3 client signs for the proxy's host:port and the upstream verifies that same
Host (SeaweedFS checks the SigV4 signature, not which host it is called by). A second port
takes the control API, JSON over HTTP:

* ``PUT /rules`` with ``[{"fault": ..., "op": ..., "method": ..., "key": <regex>,
  "count": N, "skip": N, ...}, ...]`` replaces the rules; ``DELETE /rules`` clears them;
* ``GET /stats`` says how many requests went through, per S3 operation, and how many times
  each rule fired.

A rule matches a request by S3 operation (``PutObject``, ``UploadPart``, ``GetObject``, ...),
method and a regular expression searched in the object key; it lets ``skip`` matches pass,
then fires ``count`` times (``null``: forever). Faults:

``internal_error``  500 InternalError, without forwarding
``slow_down``       503 SlowDown, without forwarding
``request_timeout`` 400 RequestTimeout, without forwarding
``truncate``        forwards; the response's body is cut short (``fraction`` of it), then the
                    connection closes (a response without a body is cut inside its head)
``reset``           forwards; a reset (RST) in the middle of the response's body (or head)
``latency``         forwards after ``delay_s``
``bandwidth``       forwards; the request's and the response's body at ``rate_bps`` bytes a
                    second
``blackhole``       accepts the request and never answers (until the client gives up)

The first matching rule that still has firings left applies. The ready file holds the ports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import socket
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

FAULTS = (
    "internal_error",
    "slow_down",
    "request_timeout",
    "truncate",
    "reset",
    "latency",
    "bandwidth",
    "blackhole",
)

_ERRORS = {
    "internal_error": (500, "Internal Server Error", "InternalError", "We encountered an error."),
    "slow_down": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "request_timeout": (
        400,
        "Bad Request",
        "RequestTimeout",
        "Your socket connection to the server was not read from or written to within the "
        "timeout period.",
    ),
}

_MAX_HEAD = 64 * 1024


@dataclass
class Rule:
    fault: str
    op: str | None = None
    method: str | None = None
    key: str | None = None
    count: int | None = 1
    skip: int = 0
    delay_s: float = 0.0
    rate_bps: int = 64 * 1024
    fraction: float = 0.5
    seen: int = 0
    fired: int = 0
    _pattern: re.Pattern[str] | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, spec: dict[str, Any]) -> Rule:
        if spec.get("fault") not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {spec.get('fault')!r}")
        known = {
            "fault",
            "op",
            "method",
            "key",
            "count",
            "skip",
            "delay_s",
            "rate_bps",
            "fraction",
        }
        unknown = set(spec) - known
        if unknown:
            raise ValueError(f"unknown rule fields {sorted(unknown)}")
        rule = cls(**spec)
        rule._pattern = re.compile(rule.key) if rule.key is not None else None
        return rule

    def take(self, method: str, op: str, key: str) -> bool:
        """Whether the rule fires for this request (counting it when it matches)."""
        if self.method is not None and self.method != method:
            return False
        if self.op is not None and self.op != op:
            return False
        if self._pattern is not None and not self._pattern.search(key):
            return False
        if self.count is not None and self.fired >= self.count:
            return False
        self.seen += 1
        if self.seen <= self.skip:
            return False
        self.fired += 1
        return True

    def state(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "op": self.op,
            "method": self.method,
            "key": self.key,
            "count": self.count,
            "skip": self.skip,
            "seen": self.seen,
            "fired": self.fired,
        }


def s3_operation(method: str, target: str) -> tuple[str, str]:
    """The S3 operation and object key of a path-style request (``/bucket/key?query``)."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    _bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
    if not key:
        if method == "GET" and "uploads" in query:
            return "ListMultipartUploads", ""
        if method == "GET":
            return "ListObjects", ""
        if method == "POST" and "delete" in query:
            return "DeleteObjects", ""
        if method == "HEAD":
            return "HeadBucket", ""
        return f"{method}Bucket", ""
    if method == "PUT":
        return ("UploadPart" if "partNumber" in query else "PutObject"), key
    if method == "POST":
        return ("CompleteMultipartUpload" if "uploadId" in query else "CreateMultipartUpload"), key
    if method == "DELETE":
        return ("AbortMultipartUpload" if "uploadId" in query else "DeleteObject"), key
    if method == "HEAD":
        return "HeadObject", key
    if method == "GET" and "uploadId" in query:
        return "ListParts", key
    return "GetObject", key


class Head:
    """An HTTP/1.1 message head: the start line and the header lines, as received."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        lines = raw.decode("latin-1").split("\r\n")
        self.start = lines[0]
        self.headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                self.headers.append((name.strip(), value.strip()))

    def get(self, name: str) -> str | None:
        lower = name.lower()
        for key, value in self.headers:
            if key.lower() == lower:
                return value
        return None

    def without(self, *names: str) -> bytes:
        drop = {n.lower() for n in names}
        lines = [self.start] + [f"{k}: {v}" for k, v in self.headers if k.lower() not in drop]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_head(reader: asyncio.StreamReader) -> Head | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        return None
    return Head(raw)


async def _body(reader: asyncio.StreamReader, head: Head) -> list[bytes]:
    """The message body as it was framed on the wire (Content-Length or chunked)."""
    if (head.get("Transfer-Encoding") or "").lower() == "chunked":
        out = []
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            out.append(line + data)
            if size == 0:
                if data != b"\r\n":  # trailers
                    out.append(await reader.readuntil(b"\r\n\r\n"))
                return out
    length = int(head.get("Content-Length") or 0)
    return [await reader.readexactly(length)] if length else []


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed server or a middlebox does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.rules: list[Rule] = []
        self.requests: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.open_connections = 0

    def pick(self, method: str, op: str, key: str) -> Rule | None:
        for rule in self.rules:
            if rule.take(method, op, key):
                self.injected[rule.fault] += 1
                print(
                    json.dumps(
                        {"event": "fault_injected", "fault": rule.fault, "op": op, "key": key}
                    ),
                    flush=True,
                )
                return rule
        return None

    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                method, target, _ = head.start.split(" ", 2)
                op, key = s3_operation(method, target)
                self.requests[op] += 1
                rule = self.pick(method, op, key)
                expect = (head.get("Expect") or "").lower() == "100-continue"
                if expect:
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = await _body(reader, head)
                if rule is not None and rule.fault == "blackhole":
                    await reader.read()  # until the client gives up and closes
                    return
                if rule is not None and rule.fault in _ERRORS:
                    writer.write(_error(rule.fault, target))
                    await writer.drain()
                    continue
                if rule is not None and rule.fault == "latency":
                    await asyncio.sleep(rule.delay_s)
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.upstream)
                up_reader, up_writer = upstream
                up_writer.write(head.without("Expect"))
                if rule is not None and rule.fault == "bandwidth":
                    await _paced(up_writer, b"".join(body), rule.rate_bps)
                for piece in body if rule is None or rule.fault != "bandwidth" else ():
                    up_writer.write(piece)
                await up_writer.drain()
                if not await self._relay(method, up_reader, writer, rule):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            self.open_connections -= 1
            if upstream is not None:
                upstream[1].close()
            if not writer.transport.is_closing():
                writer.close()

    async def _relay(
        self,
        method: str,
        up_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        rule: Rule | None,
    ) -> bool:
        """Forward one response (with the rule's body fault); whether the connection lives on."""
        head = await _read_head(up_reader)
        if head is None:
            raise ConnectionError("upstream closed")
        status = int(head.start.split(" ", 2)[1])
        no_body = method == "HEAD" or status in (204, 304) or 100 <= status < 200
        body = [] if no_body else await _body(up_reader, head)
        data = b"".join(body)
        fault = rule.fault if rule is not None else None
        if fault in ("truncate", "reset"):
            assert rule is not None
            # cut inside the body; a response without one (a PUT's) is cut inside its head
            sent = head.raw + data
            start = len(head.raw) if len(data) > 1 else 0
            cut = start + max(1, int((len(sent) - start - 1) * rule.fraction))
            writer.write(sent[:cut])
            await writer.drain()
            if fault == "reset":
                _reset(writer)
            else:
                writer.close()
            return False
        writer.write(head.raw)
        if fault == "bandwidth":
            assert rule is not None
            await _paced(writer, data, rule.rate_bps)
        else:
            writer.write(data)
        await writer.drain()
        return (head.get("Connection") or "").lower() != "close"

    def stats(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "injected": dict(self.injected),
            "rules": [r.state() for r in self.rules],
            "open_connections": self.open_connections,
        }


async def _paced(writer: asyncio.StreamWriter, data: bytes, rate_bps: int) -> None:
    """Write ``data`` at about ``rate_bps`` bytes a second (20 slices a second)."""
    step = max(1, rate_bps // 20)
    for i in range(0, len(data), step):
        writer.write(data[i : i + step])
        await writer.drain()
        await asyncio.sleep(0.05)


def _error(fault: str, target: str) -> bytes:
    status, reason, code, message = _ERRORS[fault]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{urlsplit(target).path}</Resource><RequestId>fault-proxy</RequestId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nx-amz-request-id: fault-proxy\r\n"
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S GMT', time.gmtime())}\r\n\r\n"
    )
    return head.encode() + body


async def _control(
    proxy: Proxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """One control request (connection closed after the answer)."""
    try:
        head = await _read_head(reader)
        if head is None:
            return
        method, target, _ = head.start.split(" ", 2)
        body = b"".join(await _body(reader, head))
        status, answer = 200, {}
        try:
            if method == "PUT" and target == "/rules":
                proxy.rules = [Rule.parse(r) for r in json.loads(body)]
                answer = proxy.stats()
            elif method == "DELETE" and target == "/rules":
                proxy.rules = []
                answer = proxy.stats()
            elif method == "GET" and target == "/stats":
                answer = proxy.stats()
            else:
                status, answer = 404, {"error": f"no {method} {target}"}
        except (ValueError, TypeError) as exc:
            status, answer = 400, {"error": str(exc)}
        data = json.dumps(answer).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
    finally:
        writer.close()


async def main(upstream: str, ready_file: Path, port: int) -> None:
    host, _, up_port = upstream.rpartition(":")
    proxy = Proxy((host, int(up_port)))
    server = await asyncio.start_server(proxy.client, "127.0.0.1", port, limit=_MAX_HEAD)
    control = await asyncio.start_server(
        lambda r, w: _control(proxy, r, w), "127.0.0.1", 0, limit=_MAX_HEAD
    )
    ports = {
        "port": server.sockets[0].getsockname()[1],
        "control_port": control.sockets[0].getsockname()[1],
    }
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(ports))
    tmp.rename(ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    control.close()


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="host:port of the S3 server")
    parser.add_argument("--ready-file", required=True, type=Path)
    parser.add_argument("--port", type=int, default=0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = _args(sys.argv[1:])
    asyncio.run(main(args.upstream, args.ready_file, args.port))
