#!/usr/bin/env python3
"""The README's demo: the sidecar's main job on the local stack, start to finish.

1. start Kafka (KRaft) and SeaweedFS on loopback (``deploy/local/stack.py``);
2. create a topic with 1 MiB segments and produce a few MiB so segments roll;
3. start ``sidecar run`` beside the broker and wait until it is ready;
4. show the partitions and segments the sidecar sees (from its logs and ``/metrics``),
   then ``sidecar inspect`` of the broker's log dir;
5. stop the sidecar with SIGTERM (it must exit 0) and stop the stack.

Exit code 0 when every step worked. ``--keep`` leaves the stack running for exploration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack

TOPIC = "demo.orders"
PARTITIONS = 3
RECORDS = 7500
VALUE_BYTES = 1024


def say(text: str) -> None:
    print(f"==> {text}", flush=True)


async def create_and_produce(bootstrap: str) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(TOPIC, PARTITIONS, 1, topic_configs={"segment.bytes": str(1024 * 1024)})]
        )
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5
    )
    await producer.start()
    try:
        for i in range(RECORDS):
            value = json.dumps({"order": i, "pad": "x" * (VALUE_BYTES - 40)}).encode()
            await producer.send(TOPIC, value=value, key=f"customer-{i % 97}".encode())
        await producer.flush()
    finally:
        await producer.stop()


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback only
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


SUMMARY_METRICS = tuple(
    f"kafka_tiered_sidecar_{name}"
    for name in (
        "partitions_watched",
        "local_segments",
        "segments_copied_total",
        "copied_bytes_total",
        "copy_lag_segments",
        "segment_upload_seconds_count",
        "segment_upload_seconds_sum",
        "s3_requests_total",
        "metadata_publish_seconds_count",
        "metadata_store_lag_records",
        "read_requests_total",
        "read_response_bytes_total",
    )
)


def read_events(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def wait_for_events(
    log: Path, name: str, topic: str, count: int, proc: subprocess.Popen[bytes]
) -> list[dict[str, object]]:
    """Wait (up to 120 s) until the sidecar has logged ``count`` events ``name`` for ``topic``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = [e for e in read_events(log) if e.get("event") == name and e.get("topic") == topic]
        if len(found) >= count:
            return found
        if proc.poll() is not None:
            raise SystemExit(f"sidecar exited early:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise SystemExit(f"only {len(found)} of {count} {name} events after 120 s")


def bucket_keys(local: stack.Stack) -> list[str]:
    client = local.s3.client()
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=local.s3.bucket)
        return sorted(
            obj["Key"]
            for page in pages
            for obj in page.get("Contents", [])
            if obj["Key"].startswith(TOPIC + "-")
        )
    finally:
        client.close()


def compare_with_broker(local: stack.Stack, keys: list[str]) -> list[str]:
    """Keys whose .log object differs from the broker's segment file."""
    client = local.s3.client()
    log_dir = local.kafka.nodes[0].log_dir
    bad = []
    try:
        for key in keys:
            if not key.endswith(".log"):
                continue
            _, partition, name = key.rsplit("/", 2)
            base = name.split("-", 1)[0]
            local_file = log_dir / f"{TOPIC}-{partition}" / f"{base}.log"
            body = client.get_object(Bucket=local.s3.bucket, Key=key)["Body"].read()
            if body != local_file.read_bytes():
                bad.append(key)
    finally:
        client.close()
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=stack.REPO / ".stack" / "demo")
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    args = parser.parse_args()
    root: Path = args.root.resolve()

    say(f"starting the local stack in {root} (Kafka {stack.KAFKA_VERSION} + SeaweedFS)")
    started = time.monotonic()
    local = stack.Stack.create(root).start()
    say(
        f"stack up in {time.monotonic() - started:.1f} s: Kafka {local.kafka.bootstrap_servers}, "
        f"S3 {local.s3.endpoint} bucket {local.s3.bucket!r}"
    )
    sidecar_proc: subprocess.Popen[bytes] | None = None
    try:
        say(
            f"creating topic {TOPIC!r} ({PARTITIONS} partitions, 1 MiB segments) and producing "
            f"{RECORDS} records of {VALUE_BYTES} bytes"
        )
        asyncio.run(create_and_produce(local.kafka.bootstrap_servers))

        metrics_port = stack.free_port()
        config = root / "sidecar.toml"
        config.write_text(
            f'state_dir = "{root / "sidecar-state"}"\n'
            f'[broker]\nlog_dirs = ["{local.kafka.nodes[0].log_dir}"]\n'
            f'[kafka]\nbootstrap_servers = ["{local.kafka.bootstrap_servers}"]\n'
            f'[s3]\nendpoint_url = "{local.s3.endpoint}"\nbucket = "{local.s3.bucket}"\n'
            f'[tiering]\nrescan_interval_s = 5.0\ninclude_topics = ["demo\\\\.orders"]\n'
            f"[remote_log_metadata]\nreplication_factor = 1\n"
            f"[metrics]\nport = {metrics_port}\n"
            f'[logging]\nformat = "json"\n'
        )
        # credentials come from the environment, never from the file
        env = {
            **os.environ,
            "SIDECAR_S3__ACCESS_KEY_ID": local.s3.access_key,
            "SIDECAR_S3__SECRET_ACCESS_KEY": local.s3.secret_key,
        }
        sidecar_log = root / "sidecar.log"
        say(f"starting `sidecar run --config {config}` (logs: {sidecar_log})")
        with sidecar_log.open("wb") as out:
            sidecar_proc = subprocess.Popen(
                [sys.executable, "-m", "sidecar", "run", "--config", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, _ = http_get(f"http://127.0.0.1:{metrics_port}/readyz")
            if status == 200:
                break
            if sidecar_proc.poll() is not None:
                raise SystemExit(f"sidecar exited early:\n{sidecar_log.read_text()[-3000:]}")
            time.sleep(0.2)
        else:
            raise SystemExit(f"sidecar not ready after 60 s:\n{sidecar_log.read_text()[-3000:]}")

        events = [
            json.loads(line)
            for line in sidecar_log.read_text().splitlines()
            if line.startswith("{")
        ]
        seen = [
            e
            for e in events
            if e.get("event") == "partition_discovered" and e.get("topic") == TOPIC
        ]
        say(
            f"the sidecar (broker {seen[0].get('broker_id') if seen else '?'}) sees "
            f"{len(seen)} partitions of {TOPIC!r}:"
        )
        print(
            f"    {'partition':>9} {'segments':>8} {'rolled':>6} {'ready':>5} "
            f"{'active base':>11} {'log bytes':>10}"
        )
        for e in sorted(seen, key=lambda e: e["partition"]):
            print(
                f"    {e['partition']:>9} {e['segments']:>8} {e['rolled']:>6} {e['ready']:>5} "
                f"{e['active_base_offset']:>11} {e['log_bytes']:>10}"
            )
        if len(seen) != PARTITIONS or not any(e["rolled"] for e in seen):
            raise SystemExit("expected the sidecar to see every partition with rolled segments")

        expected = sum(e["ready"] for e in seen)
        say(f"waiting for the sidecar to tier the {expected} ready segments to S3")
        tiered = wait_for_events(sidecar_log, "segment_tiered", TOPIC, expected, sidecar_proc)
        for e in sorted(tiered, key=lambda e: (e["partition"], e["base_offset"])):
            print(
                f"    {TOPIC}-{e['partition']} offsets {e['base_offset']}..{e['end_offset']}"
                f" ({e['bytes']} bytes) in {e['seconds']} s, segment id {e['segment_id']}"
            )
        keys = bucket_keys(local)
        say(f"the bucket holds {len(keys)} objects for {TOPIC!r}, for example:")
        for key in keys[:3]:
            print(f"    s3://{local.s3.bucket}/{key}")
        mismatches = compare_with_broker(local, keys)
        if mismatches:
            raise SystemExit(f"objects differ from the broker's files: {mismatches}")
        say("every tiered .log object is byte-identical to the broker's file")
        say(
            f"reading tiered records back through the read socket: `sidecar read --topic {TOPIC}"
            " --partition 0 --offset 0 --count 3`"
        )
        read = subprocess.run(
            [sys.executable, "-m", "sidecar", "read", "--config", str(config),
             "--topic", TOPIC, "--partition", "0", "--offset", "0", "--count", "3"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        for line in read.stdout.splitlines():
            print(f"    {line[:150]}")
        if read.returncode != 0 or read.stdout.count("Offset: ") != 3:
            raise SystemExit(f"sidecar read failed:\n{read.stdout}{read.stderr}")
        say("3 tiered records read back from S3 through the read socket")

        _, metrics = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
        say("metrics summary (/metrics):")
        for line in metrics.splitlines():
            if line.startswith(SUMMARY_METRICS):
                print(f"    {line}")

        say(f"`sidecar inspect {local.kafka.nodes[0].log_dir / (TOPIC + '-0')}`:")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "sidecar",
                "inspect",
                str(local.kafka.nodes[0].log_dir / f"{TOPIC}-0"),
            ],
            check=True,
        )

        say("stopping the sidecar with SIGTERM")
        sidecar_proc.send_signal(signal.SIGTERM)
        code = sidecar_proc.wait(timeout=30)
        sidecar_proc = None
        if code != 0:
            raise SystemExit(f"sidecar exited with {code}:\n{sidecar_log.read_text()[-3000:]}")
        say("sidecar stopped cleanly (exit 0)")
    finally:
        if sidecar_proc is not None and sidecar_proc.poll() is None:
            sidecar_proc.kill()
            sidecar_proc.wait()
        if args.keep:
            say(
                f"stack left running; stop it with: python deploy/local/stack.py --root {root} down"
            )
        else:
            local.stop()
            say("stack stopped")
    say("demo finished: the sidecar saw the segments roll and tiered them to S3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
