"""The metadata check of /readyz: it passes once the store has caught up with the metadata of
the broker's partitions at start, never on the empty set tracked before the tiering engine's
first pass; later catch-ups do not take the pod out of service, a failing tailer does."""

from __future__ import annotations

from sidecar.app import MetadataReadiness


def _check(
    readiness: MetadataReadiness,
    *,
    healthy: bool = True,
    error: str | None = None,
    lagging: list[int] | None = None,
    scanned: bool = True,
    passes: int = 0,
) -> tuple[bool, str | None]:
    return readiness.check(
        healthy=healthy, error=error, lagging=lagging or [], scanned=scanned, passes=passes
    )


def test_not_ready_on_the_empty_set_before_the_engine_wants_anything() -> None:
    readiness = MetadataReadiness()
    assert _check(readiness, scanned=False, passes=3) == (
        False,
        "waiting for the first scan of the log dirs",
    )
    # scanned now: the engine's passes so far may all have come before the scan
    assert _check(readiness, passes=3) == (
        False,
        "waiting for the tiering engine's first pass on a fresh cluster view",
    )
    assert _check(readiness, passes=4, lagging=[7, 12]) == (
        False,
        "catching up on metadata partitions [7, 12]",
    )
    assert _check(readiness, passes=5) == (True, None)


def test_later_catch_ups_keep_it_ready_and_a_failing_tailer_does_not() -> None:
    readiness = MetadataReadiness()
    _check(readiness, passes=1)
    assert _check(readiness, passes=2) == (True, None)
    # a topic created, the cluster duties taken up: metadata partitions read from the start
    assert _check(readiness, passes=3, lagging=[1, 2, 3]) == (True, None)
    failing = _check(readiness, healthy=False, error="KafkaConnectionError", passes=4)
    assert failing == (False, "KafkaConnectionError")
    assert _check(readiness, healthy=False, passes=5) == (False, "the metadata tailer is failing")
    assert _check(readiness, passes=6) == (True, None)
