"""Transactions on the read path: the isolation levels, the aborted-transaction list a records
response carries, and the read_committed filter a Kafka consumer applies to fetched batches.

Kafka's broker answers a READ_COMMITTED fetch with whole batches (aborted ones included) plus the
aborted transactions (producer id, first offset) that overlap them, collected from the segments'
transaction indexes (``RemoteLogManager.collectAbortedTransactions``); the consumer drops the
batches of those transactions and every control batch (``CompletedFetch.nextFetchedRecord``).
:class:`CommittedFilter` is that consumer loop, used by the server for decoded (JSON) responses
and by the client for raw ones. The list travels in the ``X-Aborted-Transactions`` header as
``<producer id>:<first offset>`` pairs, comma-separated, by first offset.

Pure code: no I/O, no HTTP.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import NamedTuple

from sidecar.kafka.records import BatchHeader, ControlRecordType

__all__ = [
    "ABORTED_TRANSACTIONS_HEADER",
    "AbortedTransaction",
    "CommittedFilter",
    "IsolationLevel",
    "format_aborted",
    "parse_aborted",
]

#: the response header of a read_committed records response
ABORTED_TRANSACTIONS_HEADER = "X-Aborted-Transactions"


class IsolationLevel(enum.StrEnum):
    """A consumer's ``isolation.level``; Kafka's consumers default to read_uncommitted."""

    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"


class AbortedTransaction(NamedTuple):
    """FetchResponse's ``AbortedTransaction``: a producer and the first offset of a transaction
    it aborted."""

    producer_id: int
    first_offset: int


def format_aborted(aborted: Iterable[AbortedTransaction]) -> str:
    """The header value: ``pid:first`` pairs, comma-separated, by first offset."""
    ordered = sorted(set(aborted), key=lambda a: (a.first_offset, a.producer_id))
    return ",".join(f"{a.producer_id}:{a.first_offset}" for a in ordered)


def parse_aborted(text: str) -> list[AbortedTransaction]:
    """The pairs of an ``X-Aborted-Transactions`` value (``ValueError`` when malformed)."""
    found: list[AbortedTransaction] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        producer, sep, first = item.partition(":")
        if not sep:
            raise ValueError(f"aborted transaction {item[:64]!r} is not producer_id:first_offset")
        found.append(AbortedTransaction(int(producer), int(first)))
    return found


class CommittedFilter:
    """Kafka's read_committed consumer loop over fetched batches, in offset order.

    For a batch with a producer id, the aborted transactions that start at or before its last
    offset become active for their producer; an ABORT marker ends its producer's; a
    transactional data batch of a producer with an active aborted transaction is dropped.
    Control batches are never data.
    """

    def __init__(self, aborted: Iterable[AbortedTransaction]) -> None:
        self._pending = sorted(set(aborted), key=lambda a: (a.first_offset, a.producer_id))
        self._next = 0  # the first of ``_pending`` not yet active
        self._aborting: set[int] = set()

    def accept(self, header: BatchHeader, control: ControlRecordType | None = None) -> bool:
        """Whether ``header``'s batch holds data a read_committed consumer returns; ``control``
        is the type of a control batch's (first) record."""
        if header.producer_id >= 0:
            pending = self._pending
            while self._next < len(pending) and pending[self._next].first_offset <= (
                header.last_offset
            ):
                self._aborting.add(pending[self._next].producer_id)
                self._next += 1
            if header.is_control and control is ControlRecordType.ABORT:
                self._aborting.discard(header.producer_id)
            elif header.is_transactional and header.producer_id in self._aborting:
                return False
        return not header.is_control
