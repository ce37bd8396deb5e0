"""``python -m tests.faults.killpoint_runner --point NAME [--hit N] -- run --config FILE``:
the sidecar's own CLI, with wrappers installed around a few of the daemon's functions from
outside (the production code has no kill-point check) that SIGKILL the process the ``N``-th
time the named step of the copy or delete state machine is reached.

The copy of a segment: COPY_SEGMENT_STARTED published → the ``.log`` (one PUT, or a multipart
upload) → the packed indexes → the manifest → COPY_SEGMENT_FINISHED published. Its delete:
DELETE_SEGMENT_STARTED published → the objects deleted → DELETE_SEGMENT_FINISHED published.
Before the process dies it prints one JSON line ``{"event": "killpoint_reached", ...}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from sidecar.metadata.events import RemoteLogSegmentState, SegmentMetadata, SegmentMetadataUpdate
from sidecar.metadata.publisher import MetadataPublisher
from sidecar.storage.s3 import S3ObjectStore

#: every kill point, in the order a copy and then a delete reach them
POINTS = {
    "after_copy_started": "COPY_SEGMENT_STARTED published, nothing uploaded",
    "mid_multipart": "a part of the .log's multipart upload done, the upload not completed",
    "after_log": "the .log uploaded (multipart completed), before the indexes",
    "after_indexes": "the indexes uploaded, before the manifest",
    "after_manifest": "the manifest uploaded, before COPY_SEGMENT_FINISHED",
    "after_copy_finished": "COPY_SEGMENT_FINISHED published",
    "after_delete_started": "DELETE_SEGMENT_STARTED published, nothing deleted",
    "mid_deletes": "one object of the copy deleted, the others not",
    "after_deletes": "every object deleted, before DELETE_SEGMENT_FINISHED",
}


class _Trigger:
    def __init__(self, point: str, hit: int) -> None:
        self.point = point
        self.hit = hit
        self.seen = 0

    def reached(self, point: str, **detail: Any) -> None:
        if point != self.point:
            return
        self.seen += 1
        if self.seen < self.hit:
            return
        line = {"event": "killpoint_reached", "point": point, "hit": self.seen, **detail}
        sys.stdout.write(json.dumps(line, default=str) + "\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def _state_point(event: Any) -> str | None:
    if isinstance(event, SegmentMetadata):
        return "after_copy_started"
    if isinstance(event, SegmentMetadataUpdate):
        return {
            RemoteLogSegmentState.COPY_SEGMENT_FINISHED: "after_copy_finished",
            RemoteLogSegmentState.DELETE_SEGMENT_STARTED: "after_delete_started",
        }.get(event.state)
    return None


def install(trigger: _Trigger) -> None:
    """Wrap the publisher's and the S3 store's methods (class attributes, every instance)."""
    publish: Callable[..., Any] = MetadataPublisher.publish_and_wait

    @functools.wraps(publish)
    async def publish_and_wait(self: Any, event: Any, **kwargs: Any) -> Any:
        is_delete_finished = (
            isinstance(event, SegmentMetadataUpdate)
            and event.state is RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
        )
        if is_delete_finished:
            trigger.reached("after_deletes", segment_id=event.segment_id.id)
        result = await publish(self, event, **kwargs)
        point = _state_point(event)
        if point is not None:
            trigger.reached(point, segment_id=event.segment_id.id)
        return result

    MetadataPublisher.publish_and_wait = publish_and_wait  # type: ignore[method-assign]

    call: Callable[..., Any] = S3ObjectStore._call

    @functools.wraps(call)
    async def _call(self: Any, op: str, key: str | None, request: Any, **kwargs: Any) -> Any:
        result = await call(self, op, key, request, **kwargs)
        if op == "upload_part":
            trigger.reached("mid_multipart", key=key)
        return result

    S3ObjectStore._call = _call  # type: ignore[method-assign]

    put_file: Callable[..., Any] = S3ObjectStore.put_file

    @functools.wraps(put_file)
    async def put_file_(self: Any, key: str, *args: Any, **kwargs: Any) -> Any:
        result = await put_file(self, key, *args, **kwargs)
        trigger.reached("after_log", key=key)
        return result

    S3ObjectStore.put_file = put_file_  # type: ignore[method-assign]

    put: Callable[..., Any] = S3ObjectStore.put

    @functools.wraps(put)
    async def put_(self: Any, key: str, body: bytes) -> Any:
        result = await put(self, key, body)
        if key.endswith(".indexes"):
            trigger.reached("after_indexes", key=key)
        elif key.endswith(".manifest.json"):
            trigger.reached("after_manifest", key=key)
        return result

    S3ObjectStore.put = put_  # type: ignore[method-assign]

    delete: Callable[..., Any] = S3ObjectStore.delete

    @functools.wraps(delete)
    async def delete_(self: Any, keys: Any) -> Any:
        keys = list(keys)
        if trigger.point == "mid_deletes" and len(keys) > 1:
            await delete(self, keys[:1])
            trigger.reached("mid_deletes", key=keys[0])
        return await delete(self, keys)

    S3ObjectStore.delete = delete_  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", required=True, choices=sorted(POINTS))
    parser.add_argument("--hit", type=int, default=1, help="kill at the N-th time (default 1)")
    parser.add_argument("sidecar_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.sidecar_args[1:] if args.sidecar_args[:1] == ["--"] else args.sidecar_args
    install(_Trigger(args.point, args.hit))
    from sidecar.cli import main as sidecar_main

    return sidecar_main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
