"""The partitioner every stage shares (DESIGN.md boundary 1)."""

from __future__ import annotations

import hashlib


def partition_for(key: bytes | str, partitions: int) -> int:
    """The partition of ``key`` (a messageId): a stable 64-bit hash modulo ``partitions``.

    Stable across processes, machines and Python versions (unlike ``hash``), so the collector,
    the importer and the dedupe job all agree where a messageId lives.
    """
    raw = key.encode() if isinstance(key, str) else key
    digest = hashlib.blake2b(raw, digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions
