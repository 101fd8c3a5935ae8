"""Dedupe: the stores that remember which record owns each messageId, and the job raw -> events.

``base.py`` has the store interface and its contract; one module per store beside it; the Spark
job in ``job.py``. Stores are picked by name and imported lazily.
"""

from __future__ import annotations

from exactly.dedupe.base import (
    Claim,
    Counters,
    DedupeStore,
    PartitionStats,
    Status,
    StorePartition,
    Verdict,
)

__all__ = [
    "Claim",
    "Counters",
    "DedupeStore",
    "PartitionStats",
    "Status",
    "StorePartition",
    "Verdict",
]
