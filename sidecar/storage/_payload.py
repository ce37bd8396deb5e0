"""How aiohttp sends a :class:`~sidecar.storage._parts.PartBody`: slices of its buffer.

aiohttp's own payloads copy: a ``BytesIO`` body is read into a new 256 KiB ``bytes`` at a time,
and a ``bytes`` body is written whole (the transport then buffers what the socket did not take).
This payload writes 1 MiB memoryview slices of the part's buffer and lets the stream writer
drain between them, so a part goes from the page cache to the socket with one copy (the read)
and the writer's buffer stays small. Imported (and registered) by the S3 backend only.
"""

from __future__ import annotations

from typing import Any

from aiohttp import payload
from aiohttp.abc import AbstractStreamWriter

from sidecar.storage._parts import PartBody

__all__ = ["PartBodyPayload"]

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


payload.PAYLOAD_REGISTRY.register(PartBodyPayload, PartBody)
