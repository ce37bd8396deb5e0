"""Who owns a bucket prefix: the ownership marker.

A prefix holds the tiered data of exactly one cluster. The first sidecar that starts on a prefix
writes ``<prefix>kafka-tiered-sidecar.owner.json``::

    {"cluster_id": "...", "metadata_topic": "__remote_log_metadata",
     "created_at": "2026-01-01T00:00:00+00:00", "version": 1}

Its owner is the pair (cluster id, metadata topic): the cluster id alone is not enough, since
two metadata topics on one cluster are two independent catalogues of the same prefix.

* :func:`claim_prefix` (daemon startup): no marker → write ours only if there is still none
  (``If-None-Match: *``: of two clusters racing for a fresh prefix the store lets one write, and
  the other reads its marker and stops; a store without conditional writes gets a plain write
  and whoever's marker reads back wins), then read it back; our marker → fine; a foreign marker
  → :class:`PrefixOwnershipError`, the daemon refuses to start.
* :func:`ownership_problem` (orphan scrub): why this prefix must not be scrubbed by us (marker
  missing, unreadable or foreign), or None.
* :func:`is_marker_key` / :func:`marker_prefix`: the scrub skips every key under a *nested*
  prefix that carries a marker of its own (another cluster living below our prefix, e.g. ours is
  the bucket root and theirs is ``B/``).

Only the marker key is touched; no listing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

from sidecar.errors import ConditionalWriteUnsupportedError, KeyNotFoundError, SidecarError
from sidecar.storage.base import ObjectStore

__all__ = [
    "MARKER_NAME",
    "PrefixOwner",
    "PrefixOwnershipError",
    "claim_prefix",
    "is_marker_key",
    "marker_key",
    "marker_prefix",
    "ownership_problem",
    "read_owner",
]

#: the marker's object name under a prefix
MARKER_NAME = "kafka-tiered-sidecar.owner.json"
_VERSION = 1


class PrefixOwnershipError(SidecarError):
    """The bucket prefix belongs to another cluster (or its marker cannot be read): the daemon
    refuses to start there, so that neither cluster's scrub or retention touches the other's
    objects. Exit code 4."""

    exit_code: ClassVar[int] = 4


@dataclass(frozen=True, slots=True)
class PrefixOwner:
    """The owner recorded in a marker."""

    cluster_id: str
    metadata_topic: str
    #: ISO 8601, UTC; when the marker was first written
    created_at: str = ""

    def same_owner(self, other: PrefixOwner) -> bool:
        """Same cluster and same metadata topic (``created_at`` does not count)."""
        return (self.cluster_id, self.metadata_topic) == (other.cluster_id, other.metadata_topic)

    def to_bytes(self) -> bytes:
        """The marker's JSON body."""
        body = {
            "cluster_id": self.cluster_id,
            "metadata_topic": self.metadata_topic,
            "created_at": self.created_at,
            "version": _VERSION,
        }
        return (json.dumps(body, indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PrefixOwner:
        """Parse a marker body; ``ValueError`` when it is not one."""
        try:
            body = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        body = body if isinstance(body, dict) else {}
        cluster_id, topic = body.get("cluster_id"), body.get("metadata_topic")
        if not isinstance(cluster_id, str) or not cluster_id or not isinstance(topic, str):
            raise ValueError("cluster_id or metadata_topic missing")
        created = body.get("created_at")
        return cls(cluster_id, topic, created if isinstance(created, str) else "")

    def describe(self) -> str:
        """``cluster X (metadata topic T)`` for messages."""
        return f"cluster {self.cluster_id!r} (metadata topic {self.metadata_topic!r})"


def marker_key(prefix: str) -> str:
    """The marker's key under ``prefix``."""
    return f"{prefix}{MARKER_NAME}"


def is_marker_key(key: str) -> bool:
    """Whether ``key`` is the marker of some prefix."""
    return key == MARKER_NAME or key.endswith(f"/{MARKER_NAME}")


def marker_prefix(key: str) -> str:
    """The prefix a marker key belongs to (``key`` must satisfy :func:`is_marker_key`)."""
    return key[: -len(MARKER_NAME)]


def _where(prefix: str) -> str:
    return f"prefix {prefix!r}" if prefix else "the bucket root (empty s3.prefix)"


async def read_owner(objects: ObjectStore, prefix: str) -> PrefixOwner | None:
    """The marker of ``prefix``; None when there is none. An unreadable marker raises
    :class:`PrefixOwnershipError`; a store failure raises the store's error."""
    try:
        data = await objects.get(marker_key(prefix))
    except KeyNotFoundError:
        return None
    try:
        return PrefixOwner.from_bytes(data)
    except ValueError as exc:
        raise PrefixOwnershipError(
            f"the ownership marker {marker_key(prefix)!r} cannot be read ({exc}); check who"
            " wrote it, and delete it only if this prefix holds this cluster's data alone"
        ) from exc


def _foreign(prefix: str, found: PrefixOwner, ours: PrefixOwner) -> PrefixOwnershipError:
    suggestion = f"{ours.cluster_id}/"
    return PrefixOwnershipError(
        f"{_where(prefix)} belongs to {found.describe()}, claimed {found.created_at or '?'}"
        f" ({marker_key(prefix)!r}); this sidecar serves {ours.describe()}: give each cluster a"
        f" prefix of its own, e.g. s3.prefix = {suggestion!r}"
    )


async def claim_prefix(
    objects: ObjectStore,
    prefix: str,
    *,
    cluster_id: str,
    metadata_topic: str,
    now: datetime | None = None,
) -> tuple[PrefixOwner, bool]:
    """Make sure ``prefix`` is ours: the owner, and whether this call wrote the marker.
    Raises :class:`PrefixOwnershipError` when another cluster owns it."""
    stamp = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    ours = PrefixOwner(cluster_id, metadata_topic, stamp)
    found = await read_owner(objects, prefix)
    created = False
    if found is None:
        try:
            # two clusters racing for a fresh prefix: the store lets one of them write
            created = await objects.put_if_absent(marker_key(prefix), ours.to_bytes())
        except ConditionalWriteUnsupportedError:
            # no create-if-absent in this store: whoever's marker reads back owns the prefix
            await objects.put(marker_key(prefix), ours.to_bytes())
            created = True
        found = await read_owner(objects, prefix)
        if found is None:
            raise PrefixOwnershipError(
                f"the ownership marker {marker_key(prefix)!r} vanished right after it was"
                " written; check the bucket's lifecycle rules and who else writes there"
            )
    if not found.same_owner(ours):
        raise _foreign(prefix, found, ours)
    return found, created


async def ownership_problem(
    objects: ObjectStore, prefix: str, *, cluster_id: str, metadata_topic: str
) -> str | None:
    """Why this cluster must not scrub ``prefix`` (no marker, unreadable, another owner's), or
    None when the marker is ours."""
    try:
        found = await read_owner(objects, prefix)
    except PrefixOwnershipError as exc:
        return str(exc)
    if found is None:
        return (
            f"{_where(prefix)} has no ownership marker ({marker_key(prefix)!r}); a running"
            " sidecar of this cluster writes it at startup"
        )
    ours = PrefixOwner(cluster_id, metadata_topic)
    if not found.same_owner(ours):
        return str(_foreign(prefix, found, ours))
    return None
