"""Tiering under each S3 fault: the real daemon uploads a backlog through the fault proxy
while every upload of a segment's .log fails (or crawls) more often than one request's
retries absorb. Nothing is lost, no range gets two FINISHED copies, no object is left
outside a FINISHED copy, no multipart upload stays open; the retries are bounded (at most
the policy's attempts per request, backoff delays under their cap); a metric (the reason
label of s3_request_errors_total) and a log line (storage_retry) name the fault."""

from __future__ import annotations

import pytest

from tests.e2e._support import Sidecar, clean_prefix, delete_topic, metric_samples
from tests.faults._harness import FaultProxy
from tests.faults._scenario import (
    REASONS,
    backlog_topic,
    converged,
    sidecar_config,
    wait_all_tiered,
)
from tests.faults.proxy import FAULTS
from tests.sidecar_runner import sidecar_env

pytestmark = [pytest.mark.faults, pytest.mark.e2e]

#: signatures in the retry log line of each fault
ERRORS = {
    "internal_error": "InternalError",
    "slow_down": "SlowDown",
    "request_timeout": "RequestTimeout",
    "blackhole": "timed out",
}
#: a request that stays unanswered is abandoned after this: far above the latency fault's
#: 0.5 s, so a slow fault on a loaded machine never becomes a timeout and a retry
TIMEOUT_S = 5.0
#: the storage retry policy of the daemon (sidecar.storage._retry defaults)
ATTEMPTS, BASE_S, MAX_S = 4, 0.1, 5.0


@pytest.mark.parametrize("fault", FAULTS)
async def test_tiering_converges_under_s3_fault(
    kafka, s3, s3_proxied, fault_proxy: FaultProxy, topic_name, s3_prefix, tmp_path, fault
):
    bootstrap = kafka.bootstrap_servers
    segments = await backlog_topic(kafka, topic_name)
    assert len(segments) >= 2
    # five firings: the first copy's .log PUT exhausts its four attempts (the copy fails
    # and is tried again), the next copy's first attempt fails once more
    rule = {"fault": fault, "op": "PutObject", "key": r"\.log$", "count": 5}
    if fault == "latency":
        rule["delay_s"] = 0.5
    if fault == "bandwidth":
        rule["rate_bps"] = 2 * 1024 * 1024
    fault_proxy.set(rule)
    run = sidecar_config(
        tmp_path,
        kafka,
        s3_proxied,
        topic_name,
        s3_prefix,
        s3_options={"request_timeout_s": TIMEOUT_S},
    )
    sidecar = await Sidecar.start(run.config, sidecar_env(s3), tmp_path / "sidecar.log")
    try:
        await wait_all_tiered([sidecar], segments, timeout=120)
        stats = fault_proxy.stats()
        fired = 5 if fault in REASONS else len(segments)  # slow faults: every .log PUT
        assert stats["injected"] == {fault: fired}, stats
        outcome = await converged(kafka, s3, topic_name, s3_prefix, segments, tmp_path / "m")
        assert (outcome.segments_lost, outcome.duplicate_finished) == (0, 0), outcome
        assert (outcome.orphans, outcome.uploads_open) == (0, 0), outcome
        retries = sidecar.matching("storage_retry", op="put")
        for retry in retries:
            assert retry["attempt"] <= retry["of"] == ATTEMPTS
            assert retry["delay_s"] <= min(MAX_S, BASE_S * 2 ** (retry["attempt"] - 2)) + 1e-3
        if fault in REASONS:
            assert retries, "no storage_retry line"
            if fault in ERRORS:
                assert any(ERRORS[fault] in r["error"] for r in retries), retries
            samples = await metric_samples(run.metrics_port)
            errors = {
                dict(labels)["reason"]: value
                for (name, labels), value in samples.items()
                if name == "kafka_tiered_sidecar_s3_request_errors_total"
                and dict(labels).get("operation") == "put_object"
                and value
            }
            assert errors.get(REASONS[fault], 0) >= 1, errors
            assert sum(errors.values()) <= 5, errors  # a connection the HTTP layer reopens
        else:  # slow, not failing: nothing to retry
            assert not retries
        assert await sidecar.stop() == 0
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        clean_prefix(s3, s3_prefix)
        await delete_topic(bootstrap, topic_name)
