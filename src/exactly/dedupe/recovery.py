"""The output as the source of truth: reading ``events`` back to repair a store and to resume.

Every record the dedupe job writes to ``events`` partition *p* carries the offset of the ``raw``
record it came from (header :data:`SOURCE_HEADER`) and the messageId as its key. Within a
partition the source offsets grow with the output offsets (one task per partition and batch,
in order), so the output can be searched by source offset. Two uses (DESIGN.md boundary 3):

* **Repair** (:func:`rebuild`): a store whose position is not past the last source offset in the
  output lost claims (deleted, restored from an old copy, flushed). The ids of the output's
  records it lacks, within the store's bounds, are restored before the task decides anything.
* **Resume** (:func:`passed_since`): a batch whose earlier attempt already wrote some output is
  replayed from the output, not from the store: which of its records passed is read back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from exactly.dedupe.base import Claim, StorePartition
from exactly.dedupe.window import Bounds
from exactly.events.ids import DEFAULT_SCOPE, id_packer, pack_owner, record_sources
from exactly.log import Log, LogRecord
from exactly.log.base import Header

SOURCE_HEADER = "exactly.source.offset"
RESTORE_CHUNK = 10_000
DEFAULT_KEY_BYTES = 48  # to turn a byte bound into a number of records to restore


def source_offset(headers: tuple[Header, ...]) -> int | None:
    """The source offset an output record carries; None if it has none."""
    for name, value in headers:
        if name == SOURCE_HEADER:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def newest_first(log: Log, topic: str, partition: int) -> Iterator[LogRecord]:
    """The partition's records from the newest back, read in growing windows."""
    high = log.end_offset(topic, partition)
    window = 64
    while high > 0:
        low = max(0, high - window)
        chunks = log.read_range(topic, partition, low, high, max_records=5000)
        batch = [record for chunk in chunks for record in chunk]
        yield from reversed(batch)
        high, window = low, min(window * 4, 50_000)


def last_source(log: Log, topic: str, partition: int) -> int | None:
    """The source offset of the newest output record that has one; None if there is none."""
    for record in newest_first(log, topic, partition):
        found = source_offset(record.headers)
        if found is not None:
            return found
    return None


def passed_since(log: Log, topic: str, partition: int, first: int) -> set[int]:
    """Source offsets at or after ``first`` that are in the output: what already passed."""
    passed: set[int] = set()
    for record in newest_first(log, topic, partition):
        found = source_offset(record.headers)
        if found is None:
            continue
        if found < first:
            break
        passed.add(found)
    return passed


def _first_where(
    log: Log, topic: str, partition: int, low: int, high: int, reached: Callable[[LogRecord], bool]
) -> int:
    """The lowest offset in ``[low, high)`` from which every record is ``reached``; binary search.

    ``reached`` must be monotonic along the partition (false, then true).
    """
    while low < high:
        middle = (low + high) // 2
        found = next(log.read_range(topic, partition, middle, high, max_records=1), [])
        if not found or reached(found[0]):
            high = middle
        else:
            low = found[0].offset + 1
    return low


def rebuild_start(
    log: Log, topic: str, partition: int, position: int | None, bounds: Bounds
) -> int:
    """The output offset to restore from: past what the store has, within its bounds."""
    end = log.end_offset(topic, partition)
    start = 0
    if position is not None:

        def covered(record: LogRecord) -> bool:
            found = source_offset(record.headers)
            return found is not None and found >= position

        start = _first_where(log, topic, partition, 0, end, covered)
    limit = bounds.max_keys
    if bounds.max_bytes is not None:
        by_bytes = bounds.max_bytes // DEFAULT_KEY_BYTES
        limit = by_bytes if limit is None else min(limit, by_bytes)
    if limit is not None:
        start = max(start, end - limit)
    window = bounds.window
    if window is not None and start < end:
        newest = next(newest_first(log, topic, partition)).timestamp
        start = _first_where(
            log, topic, partition, start, end, lambda r: r.timestamp >= newest - window
        )
    return start


def rebuild(
    part: StorePartition,
    log: Log,
    topic: str,
    bounds: Bounds,
    last: int | None,
    scope: str = DEFAULT_SCOPE,
) -> int:
    """Restore into ``part`` the output's records it lacks; returns how many were restored.

    ``last`` is the output's last source offset (:func:`last_source`, read once by the caller,
    which needs it too). Nothing to do when the store's position is past it (the normal case:
    claims are durable before the output is written). Ids are packed for ``scope`` exactly as
    the task packs them (output values are the raw values, so their sources are the same).
    """
    partition = part.partition
    position = part.position()
    if last is None or (position is not None and position > last):
        return 0
    offset = rebuild_start(log, topic, partition, position, bounds)
    restored = 0
    pending: list[Claim] = []
    pack = id_packer(scope)
    for chunk in log.read_range(topic, partition, offset, max_records=RESTORE_CHUNK):
        kept = []
        for record in chunk:
            found = source_offset(record.headers)
            if found is None or not record.key or (position is not None and found < position):
                continue
            kept.append((record, found))
        sources = (
            record_sources([record.value for record, _ in kept])
            if scope == "source"
            else [b""] * len(kept)
        )
        for (record, found), source in zip(kept, sources, strict=True):
            assert record.key is not None
            pending.append(
                Claim(pack(source, record.key), pack_owner(partition, found), record.timestamp)
            )
        if len(pending) >= RESTORE_CHUNK:
            part.restore(pending)
            restored += len(pending)
            pending = []
    if pending:
        part.restore(pending)
        restored += len(pending)
    return restored
