#!/usr/bin/env python3
"""The README's demo: the sidecar's main job on the local stack, start to finish.

1. start Kafka (KRaft) and SeaweedFS on loopback (``deploy/local/stack.py``);
2. create a topic with 1 MiB segments and produce a few MiB so segments roll;
3. start ``sidecar run`` beside the broker and wait until it is ready;
4. show the partitions and segments the sidecar sees (from its logs and ``/metrics``),
   then ``sidecar inspect`` of the broker's log dir;
5. broker-driven tiering: the broker runs the Kafka plugin (configured from
   ``sidecar broker-config``); a topic with ``remote.storage.enable=true`` is copied by Kafka's
   RLM through the sidecar, deleted locally, and Kafka's console consumer reads it from offset 0;
6. stop the sidecar with SIGTERM (it must exit 0) and stop the stack.

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
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack

from sidecar.kafka.checkpoints import encode_kafka_uuid

TOPIC = "demo.orders"
#: the broker-driven topic (remote.storage.enable=true): Kafka's RLM tiers it through the plugin
TIERED_TOPIC = "demo.tiered"
TIERED_RECORDS = 4000
PLUGIN_POM = stack.REPO / "deploy" / "kafka-plugin" / "pom.xml"
PLUGIN_JAR = stack.REPO / "deploy" / "kafka-plugin" / "target" / "kafka-tiered-sidecar-plugin.jar"
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


def plugin_jar() -> Path:
    """The plugin jar (`make demo` builds it first); built here when missing."""
    if not PLUGIN_JAR.exists():
        subprocess.run(
            [stack.require_maven(), "-B", "-q", "-f", str(PLUGIN_POM), "-DskipTests", "package"],
            check=True,
        )
    return PLUGIN_JAR


async def produce_tiered(bootstrap: str) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    configs = {
        "remote.storage.enable": "true",
        "segment.bytes": str(1024 * 1024),
        "local.retention.bytes": "1",  # keep (almost) nothing locally once it is remote
    }
    try:
        await admin.create_topics([NewTopic(TIERED_TOPIC, 1, 1, topic_configs=configs)])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for i in range(TIERED_RECORDS):
            value = json.dumps({"event": i, "pad": os.urandom(480).hex()}).encode()
            await producer.send(TIERED_TOPIC, value=value, key=f"k{i}".encode(), partition=0)
        await producer.flush()
    finally:
        await producer.stop()


def local_start(partition_dir: Path) -> int:
    bases = [int(p.name.split(".")[0]) for p in partition_dir.glob("*.log")]
    return min(bases) if bases else -1


def offset_shell(local: stack.Stack, time_spec: str) -> str:
    result = local.kafka.tool(
        "org.apache.kafka.tools.GetOffsetShell",
        "--bootstrap-server",
        local.kafka.bootstrap_servers,
        "--topic",
        TIERED_TOPIC,
        "--time",
        time_spec,
    )
    return result.stdout.strip()


def broker_driven(local: stack.Stack) -> None:
    """A topic tiered by the broker's RLM through the plugin, read back from offset 0."""
    say(
        f"creating {TIERED_TOPIC!r} with remote.storage.enable=true and producing"
        f" {TIERED_RECORDS} records: Kafka's RLM copies it through the plugin and the sidecar"
    )
    asyncio.run(produce_tiered(local.kafka.bootstrap_servers))
    partition_dir = local.kafka.nodes[0].log_dir / f"{TIERED_TOPIC}-0"
    deadline = time.monotonic() + 180
    while local_start(partition_dir) <= 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"the broker deleted no local segment of {TIERED_TOPIC} in 180 s")
        time.sleep(0.5)
    say(
        f"the broker deleted its local segments below offset {local_start(partition_dir)};"
        f" ListOffsets earliest (-2): {offset_shell(local, '-2')},"
        f" earliest-local (-4): {offset_shell(local, '-4')}"
    )
    say("Kafka's console consumer, from offset 0 (the first segments come from S3):")
    result = local.kafka.tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server",
        local.kafka.bootstrap_servers,
        "--topic",
        TIERED_TOPIC,
        "--from-beginning",
        "--max-messages",
        str(TIERED_RECORDS),
        "--timeout-ms",
        "120000",
        "--formatter-property",
        "print.offset=true",
        "--formatter-property",
        "print.key=true",
        timeout=300,
    )
    lines = result.stdout.splitlines()
    for line in lines[:2]:
        print(f"    {line[:120]}")
    if len(lines) != TIERED_RECORDS or not lines[0].startswith("Offset:0"):
        raise SystemExit(
            f"the console consumer read {len(lines)} records:\n{result.stderr[-3000:]}"
        )
    say(
        f"Kafka's console consumer read all {TIERED_RECORDS} records of {TIERED_TOPIC!r}"
        " from offset 0"
    )


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback only
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def scrape(url: str, timeout_s: float = 30.0) -> str:
    """The metrics page, asked again until it answers (a scrape can be slow on a busy host)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, text = http_get(url)
        if status == 200:
            return text
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer within {timeout_s:.0f} s (status {status})")
        time.sleep(0.5)


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


def write_config(config: Path, root: Path, local: stack.Stack | None = None) -> int:
    """The sidecar's config; before the stack exists only what `sidecar broker-config` reads."""
    metrics_port = stack.free_port()
    text = (
        f'state_dir = "{root / "sidecar-state"}"\n'
        f"[remote_log_metadata]\nreplication_factor = 1\n"
        f"[metrics]\nport = {metrics_port}\n"
        # DEBUG: the demo shows the first scan's partition_discovered lines
        f'[logging]\nformat = "json"\nlevel = "DEBUG"\n'
        f'[tiering]\nrescan_interval_s = 5.0\ninclude_topics = ["demo\\\\.orders"]\n'
    )
    if local is not None:
        text += (
            f'[broker]\nlog_dirs = ["{local.kafka.nodes[0].log_dir}"]\n'
            f'[kafka]\nbootstrap_servers = ["{local.kafka.bootstrap_servers}"]\n'
            f'[s3]\nendpoint_url = "{local.s3.endpoint}"\nbucket = "{local.s3.bucket}"\n'
        )
    config.write_text(text)
    return metrics_port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=stack.REPO / ".stack" / "demo")
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    args = parser.parse_args()
    root: Path = args.root.resolve()

    root.mkdir(parents=True, exist_ok=True)
    config = root / "sidecar.toml"
    # the broker loads the plugin on the sidecar's socket: its properties come from the config
    write_config(config, root)
    printed = subprocess.run(
        [sys.executable, "-m", "sidecar", "broker-config", "--config", str(config),
         "--plugin-jar", str(plugin_jar())],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    overrides = dict(
        line.split("=", 1) for line in printed.splitlines() if line and not line.startswith("#")
    )
    overrides["remote.log.manager.task.interval.ms"] = "1000"  # copy within seconds
    say(f"starting the local stack in {root} (Kafka {stack.KAFKA_VERSION} + SeaweedFS)")
    say("the broker's tiered-storage properties, from `sidecar broker-config`:")
    for key in sorted(overrides):
        if key.startswith(("remote.log.storage", "rsm.config")):
            print(f"    {key}={overrides[key]}")
    started = time.monotonic()
    local = stack.Stack.create(root, overrides=overrides)
    local.kafka.overrides.update(overrides)  # also on a stack created by an earlier run
    metrics_port = write_config(config, root, local)
    local.start()
    sidecar_proc: subprocess.Popen[bytes] | None = None
    # from here on every exit, a failed step or Ctrl-C included, goes through the finally
    # below: the stack is stopped by PID unless --keep
    try:
        say(
            f"stack up in {time.monotonic() - started:.1f} s: Kafka"
            f" {local.kafka.bootstrap_servers}, S3 {local.s3.endpoint} bucket {local.s3.bucket!r}"
        )
        say("the broker has them: `sidecar broker-config --check` (DescribeConfigs of the broker)")
        checked = subprocess.run(
            [sys.executable, "-m", "sidecar", "broker-config", "--config", str(config), "--check",
             "--plugin-jar", str(plugin_jar())],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        print(f"    {(checked.stdout.strip().splitlines() or [''])[0]}")
        if checked.returncode != 0:
            raise SystemExit(f"the broker lacks properties:\n{checked.stdout}{checked.stderr}")
        say(
            f"creating topic {TOPIC!r} ({PARTITIONS} partitions, 1 MiB segments) and producing "
            f"{RECORDS} records of {VALUE_BYTES} bytes"
        )
        asyncio.run(create_and_produce(local.kafka.bootstrap_servers))

        # credentials come from the environment, never from the file
        env = {
            **os.environ,
            "SIDECAR_S3__ACCESS_KEY_ID": local.s3.access_key,
            "SIDECAR_S3__SECRET_ACCESS_KEY": local.s3.secret_key,
        }
        sidecar_log = root / "sidecar.log"
        say(f"starting `sidecar run --config {config}` (logs: {sidecar_log})")
        print(
            '    by hand (the S3 credentials are not in the file): eval "$(.venv/bin/python'
            f' deploy/local/stack.py --root {root} env)"; sidecar run --config {config}'
        )
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
            # Kafka's base64 form, as in the object keys, the read API and metadata decode
            segment_id = encode_kafka_uuid(uuid.UUID(e["segment_id"]))
            print(
                f"    {TOPIC}-{e['partition']} offsets {e['base_offset']}..{e['end_offset']}"
                f" ({e['bytes']} bytes) in {e['seconds']} s, segment id {segment_id}"
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

        metrics = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
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

        broker_driven(local)

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
    say(
        "demo finished: the sidecar tiered the rolled segments to S3, and the broker read a"
        " tiered topic back from offset 0 through the plugin"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
