"""Benchmark of broker-driven reads through the plugin, side by side in one run, against
SeaweedFS and real single-node Kafka brokers:

1. **plugin, cold**: Kafka's ``ConsumerPerformance`` reads a topic's tiered part (every offset
   below the broker's local log start) through the broker, whose RemoteStorageManager is the
   plugin, with the sidecar's chunk cache empty (the sidecar restarted on a cleared cache) and
   a topic no read went through before (each run has a topic of its own, so none of it is in
   the windows the plugin keeps in the broker's heap either);
2. **plugin, warm**: the same read again, every chunk in the sidecar's cache;
3. **local**: the same consumer reading the same number of records of the same size from a
   topic of the same broker that is not tiered (its local log, in the page cache);
4. **LocalTieredStorage**: a second broker, identical but for its RemoteStorageManager, Kafka's
   own ``LocalTieredStorage`` (the ``kafka-storage`` test jar; remote segments are files), the
   same topic settings and data, the same read.

Both brokers run side by side, and each run reads in the order above (cold, warm,
LocalTieredStorage, local), so each ratio compares reads made within a minute of each other;
the report gives each run's ratios besides those of the medians. Before the timed runs,
``--warmup`` untimed reads (3) through each broker compile its JVM's read paths, the plugin's
from a cold sidecar each time: with one, the JIT's optimising compiler (``C2 CompilerThread``,
``--threads``) still took about a third of the broker's CPU in the timed remote reads, as it
would not in a broker that has served for a while.

Goals: warm >= 0.9 x LocalTieredStorage, cold >= 0.5 x local. Also the time to the first record
at a cold remote offset (a new offset in another remote segment each time, the segments'
boundaries read from the cluster's remote log metadata, sidecar cache empty; the same number
of probes against LocalTieredStorage; after the warm-up reads, in a topic of their own that
no read went through), median and maximum, and the broker JVM's CPU seconds per GiB
served (``/proc/<pid>/stat``) for each read, plus the sidecar's for the plugin's reads. Over
each read's fetch time alone (sampled every 50 ms, the consumer JVM's start left out): the CPU
per GiB of the broker, the sidecar, SeaweedFS, the consumer and the whole machine, and the
share of the cores busy; with the sidecar's S3 GETs per GiB, that says whose work a slower
read is.

Throughput is ConsumerPerformance's ``fetch.MB.sec`` (the rebalance excluded), one consumer,
its default fetch sizes (``max.partition.fetch.bytes`` 1 MiB: a remote fetch serves one
partition's 1 MiB at a time). The brokers run with the JVM flags of Kafka's own start
scripts (G1, the full JIT; ``--heap`` for ``-Xmx`` and ``-Xms``), as in production;
``--test-jvm`` gives them the test suite's quick-start flags (serial GC, the first JIT tier
only). ConsumerPerformance keeps the quick-start flags: a new JVM reads for a few seconds, and
with the full JIT its own compiling is much of its work then, which slows every contender alike
and pulls the ratios towards 1.

    .venv/bin/python tests/bench/bench_broker_plugin.py               # 200 MiB, 2 runs each
    .venv/bin/python tests/bench/bench_broker_plugin.py --mib 64 --runs 1 --probes 8
    .venv/bin/python tests/bench/bench_broker_plugin.py --mib 64 --runs 1 \
        --sidecar-set read_server.chunk_size_bytes=1048576 \
        --sidecar-set read_server.prefetch_chunks=8
    .venv/bin/python tests/bench/bench_broker_plugin.py --s3-latency-ms 20   # a far S3
    .venv/bin/python tests/bench/bench_broker_plugin.py --plugin-set fetch.cache.bytes=0
    .venv/bin/python tests/bench/bench_broker_plugin.py --threads 8   # the broker's busiest threads
    .venv/bin/python tests/bench/bench_broker_plugin.py --sidecar-nice 10   # the broker first

``--s3-latency-ms`` puts ``_latency_proxy`` between the sidecar and SeaweedFS: each of the
sidecar's requests reaches SeaweedFS that much later (its uploads too), as with an object
store that is not on loopback; ``--s3-mb-per-s`` caps each connection's responses as well.

Everything lives in a ``/tmp/bench-plugin-*`` directory, removed at the end unless ``--keep``;
the brokers, the sidecar and SeaweedFS are stopped by PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402

from tests.bench import _latency_proxy as latency_proxy  # noqa: E402
from tests.conftest import stack  # noqa: E402
from tests.e2e._support import write_config  # noqa: E402
from tests.sidecar_runner import sidecar_env  # noqa: E402

CORES = os.cpu_count() or 1
PLUGIN_JAR = REPO / "deploy" / "kafka-plugin" / "target" / "kafka-tiered-sidecar-plugin.jar"
METADATA_TOPIC = "__remote_log_metadata"
RLMM_PROPS = {
    "remote.log.metadata.manager.listener.name": "PLAINTEXT",
    "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "5",
    "remote.log.manager.task.interval.ms": "1000",
}


def tiered_configs(segment_bytes: int) -> dict[str, str]:
    return {
        "remote.storage.enable": "true",
        "segment.bytes": str(segment_bytes),
        "local.retention.bytes": "1",
        "retention.ms": "-1",
    }


# --- tools


def plugin_jar() -> Path:
    if not PLUGIN_JAR.exists():
        pom = REPO / "deploy" / "kafka-plugin" / "pom.xml"
        mvn = stack.require_maven()
        subprocess.run([mvn, "-B", "-q", "-f", str(pom), "-DskipTests", "package"], check=True)
    return PLUGIN_JAR


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its waited-for children: none here), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from ``/proc/stat``."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # guest time is already counted in user time
    idle = fields[3] + fields[4]  # idle, iowait
    return (total - idle) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")


def child_pids() -> list[int]:
    """This process's live children (the consumer tool's JVM while it runs)."""
    found: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            found += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


class Sampler(threading.Thread):
    """Samples, every 50 ms, the machine's CPU and that of named processes and of this
    process's children, so that a read's CPU can be taken over its fetch time alone (a
    tool's JVM start excluded)."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.older = set(child_pids())  # the servers this process started
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.done = threading.Event()

    def sample(self) -> None:
        busy, total = machine_cpu()
        point = {"machine": busy, "machine_total": total}
        for name, pid in self.pids.items():
            try:
                point[name] = cpu_seconds(pid)
            except OSError:
                continue
        consumer = 0.0
        for pid in set(child_pids()) - self.older:
            try:
                consumer += cpu_seconds(pid)
            except OSError:
                continue
        point["consumer"] = consumer
        self.samples.append((time.time(), point))

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.sample()

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds spent by each sampled name from ``start`` to ``end`` (wall clock),
        between the samples nearest inside those times."""
        inside = [(t, p) for t, p in self.samples if start <= t <= end]
        if len(inside) < 2:
            return {}
        first, last = inside[0][1], inside[-1][1]
        return {k: last[k] - first[k] for k in last if k in first}


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads, summed by thread name with its trailing digits
    (and dashes) cut: ``data-plane-kafk`` for every request handler (Linux keeps 15
    characters of a name)."""
    found: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip().rstrip("0123456789-#") or "?"
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        found[name] = found.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return found


def poll(check: Any, *, timeout: float, what: str, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(every)


def kafka_tool(cluster: Any, main: str, *args: str, timeout: float = 600) -> str:
    result = cluster.tool(main, *args, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{main} failed:\n{(result.stdout + result.stderr)[-3000:]}")
    return result.stdout


def create_topic(cluster: Any, topic: str, configs: dict[str, str]) -> None:
    args = ["--bootstrap-server", cluster.bootstrap_servers, "--create", "--topic", topic]
    args += ["--partitions", "1", "--replication-factor", "1"]
    for key, value in configs.items():
        args += ["--config", f"{key}={value}"]
    kafka_tool(cluster, "org.apache.kafka.tools.TopicCommand", *args)


def produce(cluster: Any, topic: str, records: int, record_bytes: int) -> None:
    kafka_tool(
        cluster,
        "org.apache.kafka.tools.ProducerPerformance",
        *("--topic", topic, "--num-records", str(records), "--record-size", str(record_bytes)),
        *(
            "--throughput",
            "-1",
            "--producer-props",
            f"bootstrap.servers={cluster.bootstrap_servers}",
        ),
        *("acks=1", "linger.ms=20", "batch.size=262144", "compression.type=none"),
    )


def offset(cluster: Any, topic: str, spec: str) -> int:
    out = kafka_tool(
        cluster,
        "org.apache.kafka.tools.GetOffsetShell",
        *("--bootstrap-server", cluster.bootstrap_servers, "--topic", topic, "--time", spec),
    )
    line = next(x for x in out.splitlines() if x.startswith(f"{topic}:0:"))
    return int(line.rsplit(":", 1)[1])


def wait_tiered(cluster: Any, topic: str) -> int:
    """Wait until the broker kept only its active segment locally; the local log start."""
    partition = cluster.nodes[0].log_dir / f"{topic}-0"
    poll(
        lambda: len(list(partition.glob("*.log"))) == 1,
        timeout=900,
        what=f"tiering of {topic}",
        every=1.0,
    )
    return poll(lambda: offset(cluster, topic, "-4"), timeout=120, what="the local log start")


def sidecar_counters(metrics_port: int) -> dict[str, float]:
    """The sidecar's ``fetch-segment`` requests, the bytes it sent and the seconds it took for
    them so far, and its chunk-cache lookups by result."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    found = {"requests": 0.0, "bytes": 0.0, "seconds": 0.0}
    for line in text.splitlines():
        if line.startswith("kafka_tiered_sidecar_read_cache_lookups_total"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            found[f"lookups_{result}"] = float(line.rsplit(" ", 1)[1])
        if line.startswith('kafka_tiered_sidecar_s3_requests_total{operation="get_object"}'):
            found["s3_gets"] = float(line.rsplit(" ", 1)[1])
        if 'endpoint="rsm_fetch_segment"' not in line or line.startswith("#"):
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith("kafka_tiered_sidecar_read_requests_total"):
            found["requests"] += value
        elif line.startswith("kafka_tiered_sidecar_read_response_bytes_total"):
            found["bytes"] += value
        elif line.startswith("kafka_tiered_sidecar_read_request_seconds_sum"):
            found["seconds"] += value
    return found


def consume(
    cluster: Any,
    topic: str,
    messages: int,
    pids: dict[str, int],
    metrics_port: int | None = None,
) -> dict[str, float]:
    """One ConsumerPerformance read of ``messages`` records from offset 0 (a new group)."""
    counters = None if metrics_port is None else sidecar_counters(metrics_port)
    threads_before = thread_cpu(pids["broker"]) if "broker" in pids else {}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    sampler = Sampler(pids)
    sampler.start()
    out = kafka_tool(
        cluster,
        "org.apache.kafka.tools.ConsumerPerformance",
        *("--bootstrap-server", cluster.bootstrap_servers, "--topic", topic),
        *("--num-records", str(messages), "--group", f"bench-{uuid.uuid4().hex[:8]}"),
        *("--timeout", "60000", "--hide-header"),
    )
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    sampler.done.set()
    sampler.join()
    threads_after = thread_cpu(pids["broker"]) if "broker" in pids else {}
    # start.time, end.time, MB, MB.sec, nMsg, nMsg.sec, rebalance.ms, fetch.ms, fetch.MB.sec, ...
    row = [x.strip() for x in out.strip().splitlines()[-1].split(",")]
    mb, n, fetch_mb_s = float(row[2]), int(row[4]), float(row[8])
    if n < messages:
        raise RuntimeError(f"ConsumerPerformance read {n} of {messages} records:\n{out}")
    gib = mb / 1024
    result = {"mib": mb, "mib_s": fetch_mb_s, "records": n}
    for name in pids:
        result[f"cpu_s_per_gib_{name}"] = (after[name] - before[name]) / gib
    # over the fetch time alone: ConsumerPerformance's end.time less its fetch.ms
    end = time.mktime(time.strptime(row[1][:19], "%Y-%m-%d %H:%M:%S")) + int(row[1][20:]) / 1000
    fetch_s = float(row[7]) / 1000
    window = sampler.between(end - fetch_s, end)
    if window:  # the samples span part of the fetch time: the GiB read over that part
        fetch_gib = gib * window["machine_total"] / max(fetch_s * CORES, 1e-9)
        result["machine_busy"] = window["machine"] / window["machine_total"]
        for name in ("machine", "consumer", *pids):
            if name in window:
                result[f"fetch_cpu_s_per_gib_{name}"] = window[name] / fetch_gib
    for thread, seconds in threads_after.items():
        spent = (seconds - threads_before.get(thread, 0.0)) / gib
        if spent > 0:
            result[f"broker_thread:{thread}"] = spent
    if metrics_port is not None and counters is not None:
        now = sidecar_counters(metrics_port)
        result["fetch_requests_per_mib"] = (now["requests"] - counters["requests"]) / mb
        result["sent_per_read"] = (now["bytes"] - counters["bytes"]) / (mb * 1024 * 1024)
        requests = max(now["requests"] - counters["requests"], 1.0)
        result["ms_per_fetch_request"] = (now["seconds"] - counters["seconds"]) / requests * 1000
        result["s3_gets_per_gib"] = (now.get("s3_gets", 0) - counters.get("s3_gets", 0)) / gib
        for key in now:
            if key.startswith("lookups_"):
                result[key] = now[key] - counters.get(key, 0.0)
    return result


async def first_record_ms(
    bootstrap: str, topic: str, offsets: list[int], local_offset: int
) -> list[float]:
    """Time from seek to the first record at each offset, one consumer (connected first).

    Before the probes, one untimed record at ``local_offset`` (in the broker's local log):
    the consumer keeps the rest of that fetch's records, so no fetch of its own is in flight
    when the first probe seeks, as none is when the later ones do. (Without it, the first
    probe waited for the consumer's fetch at the log's end to time out, a long poll of
    ``fetch.max.wait.ms``, 500 ms, whatever the storage.)"""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=60000
    )
    await consumer.start()
    times = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])

        async def first_at(at: int) -> None:
            consumer.seek(tp, at)
            while True:
                batch = await consumer.getmany(tp, timeout_ms=30000, max_records=1)
                if batch.get(tp):
                    break
            record = batch[tp][0]
            if record.offset != at:
                raise RuntimeError(f"asked for offset {at}, got {record.offset}")

        await first_at(local_offset)
        for at in offsets:
            started = time.monotonic()
            await first_at(at)
            times.append((time.monotonic() - started) * 1000)
    finally:
        await consumer.stop()
    return times


def remote_segments(cluster: Any, topic: str) -> list[tuple[int, int]]:
    """The (start, end) offsets of ``topic``'s remote segments, from the cluster's own
    remote log metadata topic (the broker's RLMM wrote them): the real boundaries, whatever
    the records' overhead in the log."""
    from sidecar.metadata.events import SegmentMetadata
    from sidecar.spark._metadata_topic import read_metadata_events

    events, _ = read_metadata_events(cluster.bootstrap_servers, "__remote_log_metadata")
    return sorted(
        {
            (e.start_offset, e.end_offset)
            for e in events
            if isinstance(e, SegmentMetadata) and e.segment_id.topic_id_partition.topic == topic
        }
    )


def probe_offsets(segments: list[tuple[int, int]], count: int, seed: int) -> list[int]:
    """``count`` offsets, each in a different one of ``segments``, random within it."""
    if len(segments) < count:
        raise RuntimeError(f"{count} probes need as many remote segments, found {len(segments)}")
    rng = random.Random(seed)
    chosen = list(segments)
    rng.shuffle(chosen)
    return [rng.randint(start, end) for start, end in chosen[:count]]


def median(values: list[float]) -> float:
    return statistics.median(values)


# --- the sidecar


def sidecar_sections(settings: list[str]) -> dict[str, dict[str, Any]]:
    """``section.key=value`` settings (``--sidecar-set``) as config sections; numbers parsed."""
    sections: dict[str, dict[str, Any]] = {}
    for setting in settings:
        name, value = setting.split("=", 1)
        section, key = name.split(".", 1)
        parsed: Any = value
        for kind in (int, float):
            try:
                parsed = kind(value)
                break
            except ValueError:
                continue
        sections.setdefault(section, {})[key] = parsed
    return sections


class SidecarProcess:
    """``sidecar run`` as a subprocess with its output in a file; restartable on a fresh cache."""

    def __init__(
        self,
        config: Path,
        env: dict[str, str],
        state: Path,
        log: Path,
        metrics_port: int,
        nice: int = 0,
    ) -> None:
        self.config, self.env, self.state, self.log = config, env, state, log
        self.metrics_port = metrics_port
        #: the sidecar's niceness: above 0, the broker's threads win the CPU when both want it
        self.nice = nice
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.state / "read.sock"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    *(("nice", "-n", str(self.nice)) if self.nice else ()),
                    *(sys.executable, "-m", "sidecar", "run", "--config", str(self.config)),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        poll(self.socket.exists, timeout=90, what="the sidecar's read socket")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=5
            ) as reply:
                return bool(reply.status == 200)
        except OSError:  # 503 (HTTPError) while a check fails, or not listening yet
            return False

    def restart_cold(self) -> None:
        """Stop, empty the chunk cache, start again; return once the daemon is ready and its
        startup work is done (under 5 % of a core over half a second), so that a cold read
        measures a cache without the data, not a process that is still starting."""
        self.stop()
        shutil.rmtree(self.state / "read-cache", ignore_errors=True)
        self.start()
        poll(self.ready, timeout=120, what="/readyz answering 200")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            before = cpu_seconds(self.pid)
            time.sleep(0.5)
            if cpu_seconds(self.pid) - before < 0.025:
                break

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


# --- the run


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    record_bytes = 1024
    records = args.mib * 1024 * 1024 // record_bytes
    segment_bytes = args.segment_mib * 1024 * 1024
    # 70 bytes of overhead per record errs high (about 12 with these batches): more than
    # enough records for the probes' segments
    records_per_segment = segment_bytes // (record_bytes + 70)
    results: dict[str, Any] = {
        "mib": args.mib,
        "segment_mib": args.segment_mib,
        "sidecar_nice": args.sidecar_nice,
    }
    s3 = stack.SeaweedS3.create(root / "s3")
    clusters: list[Any] = []
    sidecar: SidecarProcess | None = None
    proxy: subprocess.Popen[bytes] | None = None
    try:
        s3.start()
        sidecar_s3: Any = s3
        if args.s3_latency_ms > 0 or args.s3_mb_per_s > 0:
            proxy, endpoint = latency_proxy.start(s3.endpoint, args.s3_latency_ms, args.s3_mb_per_s)
            sidecar_s3 = types.SimpleNamespace(
                endpoint=endpoint,
                bucket=s3.bucket,
                access_key=s3.access_key,
                secret_key=s3.secret_key,
            )
        # --- the plugin's broker and its sidecar
        state = Path(tempfile.mkdtemp(prefix="bp-", dir="/tmp"))  # a short socket path
        cluster = stack.KafkaCluster.create(root / "kafka-plugin", nodes=1)
        cluster.heap = args.heap
        cluster.production_jvm = not args.test_jvm
        clusters.append(cluster)
        metrics_port = stack.free_port()
        config = write_config(
            root / "sidecar.toml",
            state_dir=state,
            log_dir=cluster.nodes[0].log_dir,
            bootstrap=cluster.bootstrap_servers,
            s3=sidecar_s3,
            metrics_port=metrics_port,
            metadata_topic=METADATA_TOPIC,
            include_topics=[],
            prefix="bench/",
            **sidecar_sections(args.sidecar_set),
        )
        printed = subprocess.run(
            [
                *(sys.executable, "-m", "sidecar", "broker-config", "-c", str(config)),
                *("--plugin-jar", str(plugin_jar())),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        props = dict(
            line.split("=", 1) for line in printed.splitlines() if line and not line.startswith("#")
        )
        cluster.overrides.update(props)
        cluster.overrides["remote.log.manager.task.interval.ms"] = "1000"
        for setting in args.plugin_set:
            key, _, value = setting.partition("=")
            cluster.overrides[f"rsm.config.{key}"] = value
        cluster.start()
        sidecar = SidecarProcess(
            config, sidecar_env(s3), state, root / "sidecar.log", metrics_port, args.sidecar_nice
        )
        sidecar.start()
        # --- the same broker with Kafka's LocalTieredStorage, running beside it: the reads
        # of the two alternate, so that both see the machine in the same state
        lts = stack.KafkaCluster.create(root / "kafka-lts", nodes=1)
        lts.heap = args.heap
        lts.production_jvm = not args.test_jvm
        clusters.append(lts)
        lts_jar = stack.local_tiered_storage_jar(lts.version)
        lts.overrides.update(
            {
                "remote.log.storage.system.enable": "true",
                "remote.log.storage.manager.class.name": stack.LOCAL_TIERED_STORAGE_CLASS,
                "remote.log.storage.manager.class.path": str(lts_jar),
                "rsm.config.dir": str(root / "lts-remote"),
                **RLMM_PROPS,
            }
        )
        lts.start()
        # the warm-up reads' topic, one per run for the cold and warm reads, and the probes'
        # (a segment for each probe, read by nothing before them)
        tiered = ["tiered", *(f"tiered-run{i}" for i in range(args.runs))]
        for topic in tiered:
            create_topic(cluster, topic, tiered_configs(segment_bytes))
        create_topic(cluster, "local", {"segment.bytes": str(segment_bytes), "retention.ms": "-1"})
        for each in (cluster, lts):
            create_topic(each, "probes", tiered_configs(segment_bytes))
        create_topic(lts, "tiered", tiered_configs(segment_bytes))
        for topic in tiered:
            produce(cluster, topic, records, record_bytes)
        produce(cluster, "local", records, record_bytes)
        produce(lts, "tiered", records, record_bytes)
        probe_records = records_per_segment * (args.probes + 2) + 1
        for each in (cluster, lts):
            produce(each, "probes", probe_records, record_bytes)
        local_start = min(wait_tiered(cluster, topic) for topic in tiered)
        lts_start = wait_tiered(lts, "tiered")
        probe_starts = [wait_tiered(each, "probes") for each in (cluster, lts)]
        results["remote_records"] = local_start
        broker_pid = cluster.nodes[0].pid()
        s3_pid = stack.read_pid(s3.pid_file)
        assert s3_pid is not None
        lts_pid = lts.nodes[0].pid()
        messages = min(local_start, lts_start)
        print(f"plugin broker: {local_start} of {records} records remote", flush=True)
        print(f"LocalTieredStorage broker: {lts_start} of {records} records remote", flush=True)

        # reads through each broker before any is timed, the plugin's from a cold sidecar
        # as a timed cold read is: each JVM's read paths are compiled (a broker that has
        # served for a while). With one such read, the JIT's optimising compiler still took
        # about a third of the broker's CPU in the timed remote reads.
        for _ in range(args.warmup):  # the timed runs' sequence: cold, warm, LTS, local
            sidecar.restart_cold()
            consume(cluster, "tiered", local_start, {})
            consume(cluster, "tiered", local_start, {})
            consume(lts, "tiered", messages, {})
            consume(cluster, "local", local_start, {})
        # the probes, once both JVMs compiled their read paths, from a cold sidecar, in a
        # topic whose segments no read went through (so neither the broker's remote index
        # cache nor the plugin's windows have any of it)
        sidecar.restart_cold()
        for each, key, start in zip((cluster, lts), ("plugin", "lts"), probe_starts, strict=True):
            below = [seg for seg in remote_segments(each, "probes") if seg[1] < start]
            offsets = probe_offsets(below, args.probes, seed=7)
            results[f"{key}_first_record_ms"] = asyncio.run(
                first_record_ms(each.bootstrap_servers, "probes", offsets, start)
            )
        runs: dict[str, list[dict[str, float]]] = {
            "plugin_cold": [],
            "plugin_warm": [],
            "lts": [],
            "local": [],
        }
        for run in range(args.runs):
            if not args.no_restart:
                sidecar.restart_cold()
            pids = {"broker": broker_pid, "sidecar": sidecar.pid, "seaweedfs": s3_pid}
            topic = f"tiered-run{run}"
            runs["plugin_cold"].append(consume(cluster, topic, local_start, pids, metrics_port))
            runs["plugin_warm"].append(consume(cluster, topic, local_start, pids, metrics_port))
            runs["lts"].append(consume(lts, "tiered", messages, {"broker": lts_pid}))
            runs["local"].append(consume(cluster, "local", local_start, {"broker": broker_pid}))
            print({k: v[-1] for k, v in runs.items()}, flush=True)
        sidecar.stop()
        cluster.stop()
        lts.stop()
        results["runs"] = runs
        return results
    finally:
        if sidecar is not None:
            sidecar.stop()
            shutil.rmtree(sidecar.state, ignore_errors=True)
        for cluster in clusters:
            cluster.stop()
        if proxy is not None:
            proxy.kill()
            proxy.wait()
        s3.stop()


def report(results: dict[str, Any], *, threads: int = 0) -> str:
    """The report; with ``threads``, each read's busiest broker threads too."""
    runs = results["runs"]

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    def per_run(name: str, baseline: str) -> str:
        pairs = zip(runs[name], runs[baseline], strict=True)
        return " ".join(f"{r['mib_s'] / b['mib_s']:.2f}" for r, b in pairs)

    lines = [
        f"machine: {platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}",
        f"data: {results['mib']} MiB of 1 KiB records, {results['segment_mib']} MiB segments;"
        f" {results['remote_records']} records below the local log start are read",
        f"runs: {len(runs['local'])} (medians); the sidecar at niceness"
        f" {results.get('sidecar_nice', 0)}",
        "consumer throughput (ConsumerPerformance fetch.MB.sec), broker CPU s/GiB:",
    ]
    for name, label in (
        ("plugin_cold", "plugin, sidecar cache cold"),
        ("plugin_warm", "plugin, sidecar cache warm"),
        ("local", "local log (same broker)"),
        ("lts", "LocalTieredStorage"),
    ):
        extra = ""
        if "cpu_s_per_gib_sidecar" in runs[name][0]:
            extra = f", sidecar {med(name, 'cpu_s_per_gib_sidecar'):.1f} CPU s/GiB"
        if "fetch_requests_per_mib" in runs[name][0]:
            extra += (
                f"; {med(name, 'fetch_requests_per_mib'):.2f} fetch requests per MiB read,"
                f" {med(name, 'sent_per_read'):.2f} bytes sent per byte read,"
                f" {med(name, 'ms_per_fetch_request'):.2f} ms per request in the sidecar,"
                f" {med(name, 's3_gets_per_gib'):.0f} GETs per GiB"
            )
            # a result's counter exists from its first lookup on, and the sidecar restarts
            # for each cold read: a run without one had none of them
            lookups = sorted({k for r in runs[name] for k in r if k.startswith("lookups_")})
            if lookups:
                extra += "; chunk lookups " + ", ".join(
                    f"{k.removeprefix('lookups_')}"
                    f" {statistics.median(r.get(k, 0.0) for r in runs[name]):.0f}"
                    for k in lookups
                )
        if "machine_busy" in runs[name][0]:
            extra += (
                "; over the fetch time, CPU s/GiB: "
                + ", ".join(
                    f"{k.removeprefix('fetch_cpu_s_per_gib_')} {med(name, k):.1f}"
                    for k in sorted(runs[name][0])
                    if k.startswith("fetch_cpu_s_per_gib_")
                )
                + f", {med(name, 'machine_busy') * 100:.0f} % of the cores busy"
            )
        lines.append(
            f"    {label:32s} {med(name, 'mib_s'):8.1f} MiB/s   broker"
            f" {med(name, 'cpu_s_per_gib_broker'):.1f} CPU s/GiB{extra}"
        )
        if threads:
            spent = {
                key.split(":", 1)[1]: statistics.median(r.get(key, 0.0) for r in runs[name])
                for key in {k for r in runs[name] for k in r if k.startswith("broker_thread:")}
            }
            top = sorted(spent.items(), key=lambda item: -item[1])[:threads]
            lines.append(
                "        broker threads, CPU s/GiB: "
                + ", ".join(f"{thread} {value:.2f}" for thread, value in top)
            )
    warm_lts = med("plugin_warm", "mib_s") / med("lts", "mib_s")
    cold_local = med("plugin_cold", "mib_s") / med("local", "mib_s")
    warm_local = med("plugin_warm", "mib_s") / med("local", "mib_s")
    lines += [
        f"    warm / LocalTieredStorage  {warm_lts:.2f} x   (goal >= 0.9)"
        f"  {'met' if warm_lts >= 0.9 else 'MISSED'}",
        f"    cold / local               {cold_local:.2f} x   (goal >= 0.5)"
        f"  {'met' if cold_local >= 0.5 else 'MISSED'}",
        f"    warm / local               {warm_local:.2f} x",
        f"    LocalTieredStorage / local {med('lts', 'mib_s') / med('local', 'mib_s'):.2f} x",
        "    per run (each run reads cold, warm, LocalTieredStorage, local, in that order):",
        "        warm / LocalTieredStorage " + per_run("plugin_warm", "lts"),
        "        cold / local              " + per_run("plugin_cold", "local"),
        "time to the first record at a remote offset (seek to record), ms:",
    ]
    for key, label in (
        ("plugin_first_record_ms", "plugin, cold sidecar cache"),
        ("lts_first_record_ms", "LocalTieredStorage"),
    ):
        values = results[key]
        lines.append(
            f"    {label:32s} median {median(values):7.1f}   max {max(values):7.1f}"
            f"   ({len(values)} probes, each in another remote segment)"
        )
        lines.append("        in the order probed: " + " ".join(f"{v:.0f}" for v in values))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=200, help="data per topic")
    parser.add_argument("--segment-mib", type=int, default=8, help="segment.bytes in MiB")
    parser.add_argument("--runs", type=int, default=2, help="reads of each kind (medians)")
    parser.add_argument("--probes", type=int, default=16, help="first-record probes")
    parser.add_argument("--heap", default="1g", help="the brokers' -Xmx (and -Xms)")
    parser.add_argument(
        "--test-jvm",
        action="store_true",
        help="the brokers with the test suite's JVM flags (serial GC, first JIT tier only)"
        " instead of those of Kafka's start scripts",
    )
    parser.add_argument(
        "--s3-latency-ms",
        type=float,
        default=0,
        help="hold each of the sidecar's requests to S3 this long (a proxy)",
    )
    parser.add_argument(
        "--s3-mb-per-s",
        type=float,
        default=0,
        help="cap each of the sidecar's S3 connections at this many MB/s (the proxy)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        metavar="N",
        help="untimed reads through each broker first (the plugin's from a cold sidecar), so"
        " the JVMs' read paths are compiled",
    )
    parser.add_argument(
        "--no-restart",
        action="store_true",
        help="timed cold reads without restarting the sidecar first (their topics were never"
        " read, so none of them is cached)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="also report the N busiest broker threads of each read (CPU s/GiB, by name)",
    )
    parser.add_argument(
        "--sidecar-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a sidecar setting, e.g. read_server.chunk_size_bytes=1048576 (repeatable)",
    )
    parser.add_argument(
        "--sidecar-nice",
        type=int,
        default=0,
        metavar="N",
        help="run the sidecar at this niceness (systemd's Nice=; a lower CPU weight than the"
        " broker's in a pod), so the broker's threads come first on a busy host",
    )
    parser.add_argument(
        "--plugin-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a plugin setting (under rsm.config.), e.g. fetch.cache.bytes=0 (repeatable)",
    )
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-plugin-"))
    try:
        results = run(args, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(report(results, threads=args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
