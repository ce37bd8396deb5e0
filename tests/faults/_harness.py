"""The fault proxy as a process the tests start, and the S3 view through it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sidecar.storage.s3 import S3ObjectStore

REPO = Path(__file__).resolve().parents[2]


class FaultProxy:
    """``python -m tests.faults.proxy`` in front of ``upstream_endpoint``, controlled over HTTP."""

    def __init__(self, upstream_endpoint: str, workdir: Path) -> None:
        parts = urlsplit(upstream_endpoint)
        workdir.mkdir(parents=True, exist_ok=True)
        ready = workdir / "proxy-ready.json"
        ready.unlink(missing_ok=True)
        self.log_path = workdir / "proxy.log"
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.faults.proxy",
                "--upstream",
                parts.netloc,
                "--ready-file",
                str(ready),
            ],
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"fault proxy exited: {self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("fault proxy did not start within 60 s")
            time.sleep(0.05)
        ports = json.loads(ready.read_text())
        self.port: int = ports["port"]
        self.control_port: int = ports["control_port"]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.control_port}{path}", data=data, method=method
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return json.loads(response.read())

    def set(self, *rules: dict[str, Any]) -> dict[str, Any]:
        """Replace the rules (see ``tests.faults.proxy``)."""
        return self._call("PUT", "/rules", list(rules))

    def clear(self) -> dict[str, Any]:
        return self._call("DELETE", "/rules")

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/stats")

    def injected(self) -> int:
        return sum(self.stats()["injected"].values())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def proxied_store(s3: Any, proxy: FaultProxy, **settings: Any) -> S3ObjectStore:
    """The sidecar's S3 store on the test stack's bucket, through ``proxy``, with short
    retry backoffs (``settings`` go to :class:`~sidecar.storage.s3.S3ObjectStore`)."""
    return S3ObjectStore(
        bucket=s3.bucket,
        endpoint_url=proxy.endpoint,
        access_key_id=s3.access_key,
        secret_access_key=s3.secret_key,
        backoff_s=0.01,
        max_backoff_s=0.05,
        **settings,
    )


def through(s3: Any, proxy: FaultProxy) -> Any:
    """The S3 handle of the test stack with its endpoint moved to the proxy."""
    view = _S3View(s3.endpoint, s3.bucket, s3.access_key, s3.secret_key, proxy.endpoint)
    return view


@dataclasses.dataclass
class _S3View:
    upstream: str
    bucket: str
    access_key: str
    secret_key: str
    endpoint: str

    def client(self) -> Any:
        import botocore.config
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=botocore.config.Config(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                read_timeout=5,
                connect_timeout=5,
            ),
        )
