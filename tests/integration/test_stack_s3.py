"""The local stack's S3: SeaweedFS with credentials enforced, verifying checksums."""

from __future__ import annotations

import base64
import hashlib

import crc32c
import pytest
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import ClientError

pytestmark = pytest.mark.integration


def _client(s3, *, secret: str | None = None):
    return get_session().create_client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=secret or s3.secret_key,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def _crc32c_b64(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


class TestSeaweedS3:
    async def test_put_get_with_verified_crc32c(self, s3, s3_prefix):
        """An object put with a correct CRC-32C comes back byte-identical with that checksum."""
        body = hashlib.sha256(b"seed").digest() * 40000  # 1.28 MB
        key = f"{s3_prefix}object.bin"
        async with _client(s3) as client:
            put = await client.put_object(
                Bucket=s3.bucket, Key=key, Body=body, ChecksumCRC32C=_crc32c_b64(body)
            )
            assert put["ChecksumCRC32C"] == _crc32c_b64(body)
            got = await client.get_object(Bucket=s3.bucket, Key=key, ChecksumMode="ENABLED")
            async with got["Body"] as stream:
                assert await stream.read() == body
            await client.delete_object(Bucket=s3.bucket, Key=key)

    async def test_wrong_checksum_is_rejected(self, s3, s3_prefix):
        """SeaweedFS refuses a PUT whose CRC-32C does not match the body (BadDigest)."""
        body = b"the bytes the broker wrote" * 1000
        key = f"{s3_prefix}corrupt.bin"
        async with _client(s3) as client:
            with pytest.raises(ClientError) as info:
                await client.put_object(
                    Bucket=s3.bucket, Key=key, Body=body, ChecksumCRC32C=_crc32c_b64(body + b"x")
                )
            assert info.value.response["Error"]["Code"] in {
                "BadDigest",
                "XAmzContentChecksumMismatch",
            }
            with pytest.raises(ClientError) as missing:
                await client.head_object(Bucket=s3.bucket, Key=key)
            assert missing.value.response["Error"]["Code"] in {"404", "NoSuchKey"}

    async def test_credentials_are_enforced(self, s3):
        """A wrong secret key is refused: the test server checks signatures like S3 does."""
        async with _client(s3, secret="not-the-secret") as client:
            with pytest.raises(ClientError) as info:
                await client.list_objects_v2(Bucket=s3.bucket)
        assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_a_session_ended_by_sigterm_stops_its_servers(tmp_path):
    """SIGTERM to pytest (a CI runner's cancel) ends the session as Ctrl-C does: the fixtures
    tear down and the SeaweedFS the session started is stopped, not left running in its own
    process session."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    from tests.conftest import stack
    from tests.helpers import wait_for

    repo = Path(__file__).resolve().parents[2]
    held = tmp_path / "test_held.py"
    held.write_text(
        textwrap.dedent(
            """
            import os
            import threading
            from pathlib import Path

            def test_held(s3):
                Path(os.environ["HELD_PID_FILE"]).write_text(s3.pid_file.read_text())
                threading.Event().wait(600)  # until the signal
            """
        )
    )
    out = tmp_path / "pid"
    env = {**os.environ, "HELD_PID_FILE": str(out)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p"]
    command += ["no:cacheprovider", "--rootdir", str(tmp_path), str(held)]
    with subprocess.Popen(
        command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as session:
        try:
            # a copy of its PID file, read once whole (the file exists before it is written)
            wait_for(
                lambda: stack.read_pid(out) is not None, timeout=120, what="the held SeaweedFS"
            )
            pid = stack.read_pid(out)
            assert pid is not None
            assert stack.pid_alive(pid)
            session.send_signal(signal.SIGTERM)
            session.wait(timeout=60)
        finally:
            if session.poll() is None:
                session.kill()
                held_pid = stack.read_pid(out)
                if held_pid is not None:  # the session could not stop it: not left behind
                    stack.stop_pid(held_pid, timeout=20.0)
    outlived = stack.pid_alive(pid)
    if outlived:
        stack.stop_pid(pid, timeout=20.0)  # not left behind by this test either
    assert session.returncode != 0  # interrupted, not passed
    assert not outlived, "SeaweedFS outlived the session"
