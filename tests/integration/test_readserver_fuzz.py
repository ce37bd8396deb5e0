"""10,000 generated requests against the running read server, checked against its OpenAPI
document: malformed and random paths, queries, methods and headers (Hypothesis), plus raw bytes
that are not HTTP. No response is an undeclared status, no 5xx at all on healthy data, every
error of ours is JSON with a code, nothing outside the API is ever served, and the server stays
up and keeps answering correctly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import string
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.readserver import ChunkCache, ReadServer, ReadService
from sidecar.readserver.routes import OPENAPI_PATH
from sidecar.storage.memory import MemoryObjectStore
from tests.unit.readserver._tiered import LAYOUT, Remote, three_segments

pytestmark = pytest.mark.integration

EXAMPLES = 10_000
SECRET = "FUZZ-SENTINEL-7b1f"


def _operations() -> list[tuple[re.Pattern[str], set[int]]]:
    """(path regex, declared statuses) for every GET operation of the document."""
    document = yaml.safe_load(OPENAPI_PATH.read_text())
    found = []
    for template, item in document["paths"].items():
        pattern = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(template))
        if "get" in item:  # the plugin's POST routes are covered by their own tests
            found.append((re.compile(pattern + r"\Z"), {int(s) for s in item["get"]["responses"]}))
    return found


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


texts = st.text(
    alphabet=st.one_of(
        st.sampled_from(string.ascii_letters + string.digits + "._-/%?&=#+ \\\"'<>{}[]|^~`"),
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
    ),
    max_size=40,
)
numbers = st.one_of(
    st.integers(-(2**64), 2**64).map(str),
    st.sampled_from(["0", "1", "60", "81", "179", "180", "-1", "", "1e3", "0x10", " 1", "1.5"]),
)


def requests(segment_ids: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Requests: a method, a raw request target (percent-encoded), headers. The strategies are
    built once (building them per draw costs Hypothesis more than the draws)."""
    topics = st.one_of(st.sampled_from(["orders"] * 6 + ["..", "%2e%2e", "nope"]), texts)
    partitions = st.one_of(st.sampled_from(["0"] * 6 + ["1", "-1"]), numbers, texts)
    segments = st.one_of(st.sampled_from(segment_ids), texts)
    indexes = st.one_of(
        st.sampled_from(["offset", "timestamp", "transaction", "producer_snapshot"]),
        st.sampled_from(["leader_epoch", "..", "../../etc/passwd"]),
        texts,
    )
    fixed_paths = st.sampled_from(
        [
            "/v1/version",
            "/v1/openapi.yaml",
            "/v1/topics",
            "/",
            "/v1",
            "/v1/../../etc/passwd",
            f"/v1/topics/..%2F..%2F{SECRET}",
        ]
    )
    random_paths = texts.map(lambda t: "/" + urllib.parse.quote(t, safe="/%"))
    suffixes = st.sampled_from(["", "/records", "/offsets", "/segments"])
    segment_suffixes = st.sampled_from(["", "/log", "/indexes/"])
    kinds = st.sampled_from(["fixed", "random", "partition", "segment", "segment", "valid"])
    near = st.integers(-3, 100_000).map(str)
    valid_targets = st.one_of(
        near.map(lambda n: f"/records?offset={n}"),
        st.tuples(near, near).map(lambda t: f"/records?offset={t[0]}&max_bytes={t[1]}"),
        near.map(lambda n: f"/records?format=json&max_records=3&offset={n}"),
        st.tuples(near, near, st.sampled_from(["raw", "json"])).map(
            lambda t: (
                f"/records?isolation=read_committed&offset={t[0]}&max_bytes={t[1]}&format={t[2]}"
            )
        ),
        st.integers(1_699_999_999_000, 1_700_000_002_000).map(lambda n: f"/offsets?timestamp={n}"),
        st.integers(-5, 0).map(lambda n: f"/offsets?timestamp={n}"),
        st.tuples(st.sampled_from(segment_ids), near, near).map(
            lambda t: f"/segments/{t[0]}/log?start={t[1]}&end={t[2]}"
        ),
    )
    names = st.one_of(
        st.sampled_from(
            [
                "offset",
                "max_bytes",
                "max_records",
                "format",
                "timestamp",
                "state",
                "start",
                "end",
                "topic_id",
                "isolation",
            ]
        ),
        texts,
    )
    values = st.one_of(
        numbers,
        st.sampled_from(
            [
                "raw",
                "json",
                "COPY_SEGMENT_FINISHED",
                "GONE",
                "read_committed",
                "read_uncommitted",
                "READ_COMMITTED",
                *segment_ids,
            ]
        ),
        texts,
    )
    plausible = st.lists(
        st.tuples(
            st.sampled_from(["offset", "max_bytes", "timestamp", "start", "end", "format"]),
            numbers,
        ),
        max_size=3,
    )
    queries = st.one_of(plausible, st.lists(st.tuples(names, values), max_size=4))
    methods = st.sampled_from(["GET"] * 12 + ["HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
    headers = st.one_of(
        st.just({}),
        st.dictionaries(
            st.sampled_from(["X-A", "X-B", "X-Long-Header-Name", "Accept", "Range"]),
            st.sampled_from([0, 1, 100, 3000, 7000]).map(lambda n: "v" * n),
            max_size=3,
        ),
    )

    @st.composite
    def request(draw: st.DrawFn) -> dict[str, Any]:
        kind = draw(kinds)
        if kind == "valid":
            path = "/v1/topics/orders/partitions/0" + draw(valid_targets)
            return {"method": "GET", "target": path, "headers": {}}
        if kind == "fixed":
            path = draw(fixed_paths)
        elif kind == "random":
            path = draw(random_paths)
        else:
            path = f"/v1/topics/{_quote(draw(topics))}/partitions/{_quote(draw(partitions))}"
            if kind == "partition":
                path += draw(suffixes)
            else:
                path += f"/segments/{_quote(draw(segments))}"
                suffix = draw(segment_suffixes)
                path += suffix + (_quote(draw(indexes)) if suffix == "/indexes/" else "")
        query = draw(queries)
        if query:
            path += "?" + "&".join(f"{_quote(k)}={_quote(v)}" for k, v in query)
        return {"method": draw(methods), "target": path, "headers": draw(headers)}

    return request()


def _generate(segment_ids: list[str]) -> list[dict[str, Any]]:
    generated: list[dict[str, Any]] = []

    @settings(
        max_examples=EXAMPLES,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(requests(segment_ids))
    def collect(request: dict[str, Any]) -> None:
        generated.append(request)

    collect()
    return generated


@contextlib.asynccontextmanager
async def _server(remote: Remote, tmp_path: Path) -> AsyncIterator[Path]:
    chunks = ChunkCache(
        objects=remote.objects,
        directory=tmp_path / "cache",
        max_bytes=1 << 20,
        chunk_size=16 * 1024,
    )
    service = ReadService(store=remote.store, objects=remote.objects, layout=LAYOUT, chunks=chunks)
    socket_path = tmp_path / "fuzz.sock"
    server = ReadServer(service=service, socket_path=socket_path)
    stopping = asyncio.Event()
    task = asyncio.create_task(server.run(stopping))
    await server.started.wait()
    try:
        yield socket_path
    finally:
        stopping.set()
        await task


async def test_generated_requests_get_declared_answers(tmp_path, caplog):
    """10,000 generated requests: only declared statuses, no 5xx, JSON errors, server up."""
    store = RemoteSegmentStore(tmp_path / "state")
    remote = Remote(store, MemoryObjectStore(), tmp_path / "segments")
    (tmp_path / SECRET).write_text(SECRET)
    try:
        expected = await three_segments(remote)
        segment_ids = [encode_kafka_uuid(s.segment_id.id) for s in remote.segments]
        generated = await asyncio.to_thread(_generate, segment_ids)
        assert len(generated) == EXAMPLES
        operations = _operations()
        statuses: dict[int, int] = {}
        async with _server(remote, tmp_path) as socket_path:
            connector = aiohttp.UnixConnector(path=str(socket_path), limit=8)
            async with aiohttp.ClientSession(connector=connector) as session:
                queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
                for request in generated:
                    queue.put_nowait(request)
                failures: list[str] = []
                await asyncio.gather(
                    *(_worker(session, queue, operations, statuses, failures) for _ in range(8))
                )
                assert failures[:5] == []
                # the daemon is still up and still right
                async with session.get("http://localhost/v1/version") as response:
                    assert response.status == 200
                url = "http://localhost/v1/topics/orders/partitions/0/records"
                params = {"offset": "0", "format": "json", "max_bytes": "100000000"}
                async with session.get(url, params=params) as response:
                    records = (await response.json())["records"]
                assert [r["offset"] for r in records] == [r.offset for r in expected]
            await _raw_garbage(socket_path)
            async with (
                aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket_path))) as s,
                s.get("http://localhost/v1/version") as response,
            ):
                assert response.status == 200
        assert not [r for r in caplog.records if "read_request_failed" in r.getMessage()]
        # the generator reached the interesting answers, not only 400s
        assert {200, 400, 404, 405, 416}.issubset(statuses), statuses
    finally:
        store.close()


async def _worker(
    session: aiohttp.ClientSession,
    queue: asyncio.Queue[dict[str, Any]],
    operations: list[tuple[re.Pattern[str], set[int]]],
    statuses: dict[int, int],
    failures: list[str],
) -> None:
    while not queue.empty():
        problem = await _check(session, queue.get_nowait(), operations, statuses)
        if problem:
            failures.append(problem)


async def _check(
    session: aiohttp.ClientSession,
    request: dict[str, Any],
    operations: list[tuple[re.Pattern[str], set[int]]],
    statuses: dict[int, int],
) -> str | None:
    target = request["target"]
    url = URL("http://localhost" + target, encoded=True)
    try:
        async with session.request(
            request["method"], url, headers=request["headers"], allow_redirects=False
        ) as response:
            body = await response.read()
            status = response.status
            content_type = response.headers.get("Content-Type", "")
    except aiohttp.ClientError as exc:
        return f"{request}: the connection failed: {exc!r}"
    statuses[status] = statuses.get(status, 0) + 1
    where = f"{request['method']} {target[:200]} -> {status} {body[:200]!r}"
    if status >= 500:
        return f"5xx: {where}"
    if SECRET.encode() in body and b"FUZZ-SENTINEL" in body and b"code" not in body:
        return f"served a file: {where}"
    if status >= 400:
        if content_type.startswith("text/plain"):
            return None if status == 400 else f"plain-text error: {where}"  # aiohttp's parser
        if request["method"] == "HEAD":
            return None
        try:
            document = json.loads(body)
        except ValueError:
            return f"error that is not JSON: {where}"
        if not document.get("code") or not document.get("message"):
            return f"error without code/message: {where}"
    path = urllib.parse.urlsplit(target).path
    if request["method"] in ("GET", "HEAD") and status not in (413, 414, 429, 431):
        for pattern, declared in operations:
            if pattern.match(path) and status not in declared and status != 404:
                return f"undeclared status: {where}"
    elif request["method"] not in ("GET", "HEAD") and status not in (404, 405, 413, 414, 431):
        return f"{request['method']} answered {status}: {where}"
    return None


async def _raw_garbage(socket_path: Path) -> None:
    """Bytes that are not HTTP, or broken HTTP: answered 4xx or closed, never a crash."""
    payloads = [
        b"\x00\x01\x02garbage\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET /v1/version HTTP/9.9\r\n\r\n",
        b"GET /v1/version HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"GET /v1/version HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
        b"GET /v1/version HTTP/1.1\r\n" + b"X: y\r\n" * 500 + b"\r\n",
        b"\xff" * 5000,
    ]
    for payload in payloads:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        try:
            writer.write(payload)
            await writer.drain()
            head = await asyncio.wait_for(reader.read(200), timeout=10)
            assert head == b"" or re.match(rb"HTTP/1\.[01] 4", head), (payload[:40], head)
        finally:
            writer.close()
            await writer.wait_closed()
