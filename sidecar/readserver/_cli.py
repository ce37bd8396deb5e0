"""``sidecar read``: print tiered records from the read socket, one line per record, as kcat does.

The default line is kcat's ``-f 'Offset: %o  Timestamp: %T  Key: %k  Headers: %h  Value: %s\\n'``
(a null key or value prints as ``NULL``, as kcat ``-Z``); ``--json`` prints kcat ``-J``'s envelope,
one object per line. Bytes that are not UTF-8 are shown with backslash escapes. Control records
(transaction markers) are never printed. Argument parsing stays in ``sidecar.cli``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TextIO

from sidecar.kafka.records import Record, TimestampType
from sidecar.readserver._txn import IsolationLevel
from sidecar.readserver.client import ReadClient

__all__ = ["format_record", "read_command"]


def _text(data: bytes | None) -> str:
    return "NULL" if data is None else data.decode("utf-8", errors="backslashreplace")


def format_record(record: Record, *, topic: str, partition: int, as_json: bool) -> str:
    """One record as ``sidecar read`` prints it (kcat's default line, or its ``-J`` object)."""
    if as_json:
        headers: list[str | None] = []
        for key, value in record.headers:
            headers += [key, None if value is None else _text(value)]
        return json.dumps(
            {
                "topic": topic,
                "partition": partition,
                "offset": record.offset,
                "tstype": "logappend"
                if record.timestamp_type is TimestampType.LOG_APPEND_TIME
                else "create",
                "ts": record.timestamp,
                "broker": -1,
                "headers": headers,
                "key": None if record.key is None else _text(record.key),
                "payload": None if record.value is None else _text(record.value),
            }
        )
    headers_text = ",".join(f"{k}={_text(v)}" for k, v in record.headers)
    return (
        f"Offset: {record.offset}  Timestamp: {record.timestamp}  Key: {_text(record.key)}  "
        f"Headers: {headers_text}  Value: {_text(record.value)}"
    )


def read_command(
    *,
    socket_path: Path | None,
    url: str | None,
    topic: str,
    partition: int,
    offset: int | None,
    timestamp: int | None,
    count: int | None,
    as_json: bool,
    out: TextIO,
    err: TextIO,
    isolation: str = IsolationLevel.READ_UNCOMMITTED.value,
) -> int:
    """Run ``sidecar read``; ReadErrors propagate (the CLI prints them and exits 1).
    ``isolation`` is a Kafka consumer's ``isolation.level`` (read_uncommitted by default, as
    Kafka's consumers: read_committed leaves out the records of aborted transactions)."""
    return asyncio.run(
        _read(
            socket_path=socket_path,
            url=url,
            topic=topic,
            partition=partition,
            offset=offset,
            timestamp=timestamp,
            count=count,
            as_json=as_json,
            out=out,
            err=err,
            isolation=IsolationLevel(isolation),
        )
    )


async def _read(
    *,
    socket_path: Path | None,
    url: str | None,
    topic: str,
    partition: int,
    offset: int | None,
    timestamp: int | None,
    count: int | None,
    as_json: bool,
    out: TextIO,
    err: TextIO,
    isolation: IsolationLevel,
) -> int:
    async with ReadClient(socket_path=socket_path, url=url) as client:
        if offset is None:
            if timestamp is None:
                raise ValueError("sidecar read needs --offset or --timestamp")
            answer = await client.offset_for_timestamp(topic, partition, timestamp)
            if answer["offset"] is None:
                print(
                    f"no tiered record of {topic}-{partition} at or after timestamp {timestamp}",
                    file=err,
                )
                return 0
            offset = int(answer["offset"])
            tiered = answer.get("tiered")
            if tiered is not None and offset > int(tiered["end_offset"]):
                # LATEST (-1): the end of the tiered data, nothing after it; say so, since an
                # empty output alone looks like a failure
                print(
                    f"{topic}-{partition}: offset {offset} is the end of the tiered data"
                    f" (last tiered offset {tiered['end_offset']}); nothing to print",
                    file=err,
                )
                return 0
        records = client.iter_records(topic, partition, offset, count=count, isolation=isolation)
        async for record in records:
            line = format_record(record, topic=topic, partition=partition, as_json=as_json)
            print(line, file=out)
    return 0
