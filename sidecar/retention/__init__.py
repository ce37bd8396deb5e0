"""Remote retention, topic and partition deletion, orphan scrub and local-retention safety.

* :mod:`~sidecar.retention.policy`  pure: which remote segments Kafka's RLM would delete
* :mod:`~sidecar.retention.safety`  pure: segments at risk of (or lost to) local retention
* :mod:`~sidecar.retention.scrub`   unreferenced objects and stale multipart uploads
* :mod:`~sidecar.retention.manager` the daemon's retention loop (root task)

Importing this package does not import the Kafka client modules (``manager`` does).
"""

from sidecar.retention.policy import (
    DeleteReason,
    Expiry,
    PartitionFacts,
    RetentionPlan,
    delete_records_offset,
    extended_lineage,
    filtered_lineage,
    is_within_lineage,
    only_local_bytes,
    plan_expiry,
)
from sidecar.retention.safety import LocalRetention, at_risk_segments, lost_segments
from sidecar.retention.scrub import (
    OrphanScrubber,
    ScrubReport,
    UnsafeScrubError,
    metadata_retention_problem,
)

__all__ = [
    "DeleteReason",
    "Expiry",
    "LocalRetention",
    "OrphanScrubber",
    "PartitionFacts",
    "RetentionPlan",
    "ScrubReport",
    "UnsafeScrubError",
    "at_risk_segments",
    "delete_records_offset",
    "extended_lineage",
    "filtered_lineage",
    "is_within_lineage",
    "lost_segments",
    "metadata_retention_problem",
    "only_local_bytes",
    "plan_expiry",
]
