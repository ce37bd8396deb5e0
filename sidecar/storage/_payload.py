"""How aiohttp sends the S3 backend's part bodies without copying them into Python objects.

* :class:`~sidecar.storage._parts.FilePartBody`: a part streamed from its file. On a plain
  (not TLS) connection, when the body allows it, with ``sendfile``: the headers are sent, the
  transport flushed, then the file range goes from the page cache to the socket in the kernel
  (``sidecar._sendfile``). Otherwise a chunk at a time (each chunk read in a worker thread,
  checked against the part's CRC-32C before the last one goes out). No buffer the size of a
  part exists either way.
* :class:`~sidecar.storage._parts.PartBody`: a part read whole into a pooled buffer (used when
  the payload is SHA-256 signed, which reads the body on the event loop), written as 1 MiB
  memoryview slices of its buffer.

aiohttp's own payloads copy (a ``BytesIO`` body is read into a new 256 KiB ``bytes`` at a time).
Both payloads let the stream writer drain between writes, so its buffer stays small. Imported
(and registered) by the S3 backend only.
"""

from __future__ import annotations

from typing import Any

from aiohttp import payload
from aiohttp.abc import AbstractStreamWriter

from sidecar._sendfile import flushed, plain_socket
from sidecar.storage._parts import FilePartBody, PartBody

__all__ = ["FilePartPayload", "PartBodyPayload"]

#: bytes handed to the stream writer at a time
SLICE_BYTES = 1024 * 1024


class PartBodyPayload(payload.Payload):
    """An aiohttp payload over a part body's buffer; it can be sent again (retries)."""

    _value: PartBody
    _autoclose = True  # nothing to close: the uploader releases the buffer

    def __init__(self, value: PartBody, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("content_type", "application/octet-stream")
        super().__init__(value, *args, **kwargs)
        self._size = len(value)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self._value.view.tobytes().decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self._value.view.tobytes()

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        view = self._value.view
        end = len(view) if content_length is None else min(len(view), content_length)
        for start in range(0, end, SLICE_BYTES):
            await writer.write(view[start : min(end, start + SLICE_BYTES)])


class FilePartPayload(payload.Payload):
    """An aiohttp payload that streams a part from its file; it can be sent again (retries)."""

    _value: FilePartBody
    _autoclose = True  # nothing to close: the uploader closes the file

    def __init__(self, value: FilePartBody, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("content_type", "application/octet-stream")
        super().__init__(value, *args, **kwargs)
        self._size = len(value)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        raise TypeError("a part streamed from a file is not decoded in memory")

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        chunks: list[bytes] = []

        async def collect(data: bytes) -> None:
            chunks.append(data)

        await self._value.send(collect, None)
        return b"".join(chunks)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        body = self._value
        if body.zero_copy and (content_length is None or content_length >= len(body)):
            transport = getattr(writer, "transport", None)
            send_headers = getattr(writer, "send_headers", None)
            sock = plain_socket(transport)
            if transport is not None and sock is not None and send_headers is not None:
                send_headers()  # aiohttp holds them back to go with the first body write
                await flushed(transport, writer.drain)
                await body.send_zero_copy(sock)
                return
        await body.send(writer.write, content_length)


payload.PAYLOAD_REGISTRY.register(PartBodyPayload, PartBody)
payload.PAYLOAD_REGISTRY.register(FilePartPayload, FilePartBody)
