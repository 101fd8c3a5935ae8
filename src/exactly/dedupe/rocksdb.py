"""The rocksdb dedupe store (Segment's design): one RocksDB per raw partition on local disk.

Layout of ``ROOT/p<partition>`` (rocksdict, raw bytes):

* ``default`` column family: ``id (16 bytes) -> offset (6 bytes)``, the owner's offset (its
  partition is the database's own). A bloom filter of 10 bits per key answers most lookups of a
  new id (the common case) without reading a block; lookups are batched multi-gets.
* ``seq``, the secondary index by sequence number: ``seq (8 bytes) -> time (8) + ids (16 each)``,
  one entry per claim call that claimed new ids, numbered in the order they were written. It
  lists the ids the call claimed and the earliest receive time (ms) among them, so iterating it
  walks ids oldest first (what age-out needs) and dates them (what the window needs) at a few
  bytes per call rather than per id.
* meta, one key in ``default`` (``exactly:meta``, which cannot clash with a 16-byte id): the
  position, key count, next sequence number, seek hint, ids aged out and counters.

Commit protocol of :meth:`RocksPartition._claim`, one call per batch of records:

1. **Plan age-out** (only when every claim is past the position: a replayed batch never ages out,
   so it sees the store as its first attempt did). How many of the oldest ids to drop so the
   batch fits the size bounds (``window.py``), and which calls were received entirely before the
   time window, found by iterating ``seq`` from the *seek hint*, the first sequence number not
   yet aged out, so the iterator does not step over the tombstones of earlier deletes (Segment's
   ``seek_hint``). A call only partly aged out is rewritten with the ids it keeps.
2. **Look up** every id with batched multi-gets; ids being aged out count as absent.
3. **Decide** in order: an absent id is claimed by its record; a repeat within the call sees the
   first claim.
4. **Write one batch**, synced (WAL fsync) before return: the deletes of step 1, the new ids, their
   ``seq`` entry and the meta. RocksDB applies a write batch atomically, so the position never
   runs ahead of the claims it covers.

Exclusive: RocksDB's own file lock refuses a second opener, in this process or another; opening
retries until the holder closes (a retried Spark task waits for a zombie attempt) or
``lock_timeout`` passes. The job opens a partition per task and closes it at the task's end, so a
partition moves freely between Python workers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    DBCompressionType,
    Options,
    Rdict,
    WriteBatch,
    WriteOptions,
)

from exactly.backoff import backoff
from exactly.dedupe.base import (
    Claim,
    Counters,
    DedupeStore,
    PartitionStats,
    StorePartition,
    fresh_counters,
    write_once,
)
from exactly.dedupe.window import Bounds, keys_allowed, overflow, time_cutoff
from exactly.errors import StoreUnavailable
from exactly.events.ids import ID_BYTES, owner_offset, owner_offset_bytes
from exactly.units import format_duration

META_KEY = b"exactly:meta"
SCOPE_FILE = "scope"  # ROOT/scope: the dedupe scope the ids were packed for
SEQ = "seq"
MULTI_GET = 1000  # ids per multi-get: much larger ones are slower in rocksdict
MAX_AGE_OUT = 200_000  # ids aged out per call at most; a backlog drains over later calls
_META = struct.Struct(">10q")
_TIME = struct.Struct(">q")
_ID = ID_BYTES


def o8(number: int) -> bytes:
    return number.to_bytes(8, "big")


@dataclass(frozen=True)
class Meta:
    """The partition's bookkeeping, rewritten atomically with every claim call."""

    position: int | None = None
    keys: int = 0
    aged_out: int = 0
    seek_hint: int = 0  # the first seq entry not aged out
    next_seq: int = 0
    newest: int | None = None
    counters: Counters = field(default_factory=Counters)

    def pack(self) -> bytes:
        c = self.counters
        return _META.pack(
            -1 if self.position is None else self.position,
            self.keys,
            self.aged_out,
            self.seek_hint,
            self.next_seq,
            -1 if self.newest is None else self.newest,
            c.claimed,
            c.new,
            c.duplicates,
            0,
        )

    @classmethod
    def unpack(cls, data: bytes | None) -> Meta:
        if data is None:
            return cls()
        position, keys, aged, hint, next_seq, newest, claimed, new, dups, _ = _META.unpack(data)
        return cls(
            None if position < 0 else position,
            keys,
            aged,
            hint,
            next_seq,
            None if newest < 0 else newest,
            Counters(claimed, new, dups),
        )


@dataclass
class AgeOut:
    """Step 1's plan: the ids to drop and what it does to ``seq``."""

    ids: list[bytes] = field(default_factory=list)
    deleted: list[bytes] = field(default_factory=list)  # seq keys
    rewritten: tuple[bytes, bytes] | None = None  # a partly aged-out entry, with what it keeps
    seek_hint: int = 0


def _options(bloom: bool) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    table = BlockBasedOptions()
    if bloom:
        table.set_bloom_filter(10, False)  # full filters, ~1% false positives
        options.set_memtable_prefix_bloom_ratio(0.1)  # and one in the memtable: 10x faster
        options.set_memtable_whole_key_filtering(True)  # lookups of ids not flushed yet
    table.set_block_size(16 * 1024)
    options.set_block_based_table_factory(table)
    options.set_compression_type(DBCompressionType.lz4())
    options.set_bottommost_compression_type(DBCompressionType.zstd())
    options.set_level_compaction_dynamic_level_bytes(True)
    options.set_write_buffer_size(32 * 1024 * 1024)
    options.set_max_total_wal_size(64 * 1024 * 1024)  # seq must not pin old WAL files
    options.set_max_background_jobs(2)
    options.set_keep_log_file_num(2)
    options.set_max_log_file_size(1024 * 1024)
    return options


def _open_db(path: Path, access: AccessType | None = None) -> Rdict:
    families = {SEQ: _options(bloom=False)}
    if access is None:
        return Rdict(str(path), _options(bloom=True), column_families=families)
    return Rdict(str(path), _options(bloom=True), column_families=families, access_type=access)


class RocksDBStore(DedupeStore):
    """Ids of each raw partition in a RocksDB under ``root`` (module docstring).

    Guarantee: a claim is in the WAL and fsynced when :meth:`RocksPartition.claim` returns, and
    applied atomically with the position it advances. Assumes a local file system whose
    ``fcntl`` locks work (not NFS) and one machine per ``root``.
    """

    name = "rocksdb"

    def __init__(
        self, root: Path | str, bounds: Bounds | None = None, *, lock_timeout: float = 120.0
    ) -> None:
        self.root = Path(root)
        self.bounds = bounds or Bounds()
        self.lock_timeout = lock_timeout

    def path(self, partition: int) -> Path:
        return self.root / f"p{partition}"

    def _open(self, partition: int) -> RocksPartition:
        return RocksPartition(partition, self.path(partition), self.bounds, self.lock_timeout)

    def describe(self) -> str:
        bounds = self.bounds
        window = "unbounded" if bounds.window is None else format_duration(bounds.window)
        return (
            f"rocksdb under {self.root}: per partition at most {bounds.max_keys or 'any'} keys, "
            f"{bounds.max_bytes or 'any'} bytes, window {window}"
        )

    def stats(self, partitions: int) -> list[PartitionStats]:
        """Stats without taking the locks: a read-only view, so it works while the job runs."""
        result = []
        for partition in range(partitions):
            path = self.path(partition)
            if not (path / "CURRENT").exists():
                result.append(PartitionStats(partition, 0, 0, None))
                continue
            result.append(_read_only_stats(partition, path))
        return result

    def drop(self, partition: int) -> None:
        """Delete a partition's database (tests, and a user's reset); the job rebuilds it."""
        shutil.rmtree(self.path(partition), ignore_errors=True)

    def location(self) -> str:
        return str(self.root)

    def fresh_hint(self) -> str:
        return f"delete {self.root}"

    def _recorded_scope(self, partitions: int) -> str | None:
        try:
            return (self.root / SCOPE_FILE).read_text().strip()
        except FileNotFoundError:
            pass
        built = any((path / "CURRENT").exists() for path in self.root.glob("p[0-9]*"))
        return "workspace" if built else None

    def _record_scope(self, scope: str) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        return write_once(self.root / SCOPE_FILE, scope)


def _read_only_stats(partition: int, path: Path, attempts: int = 5) -> PartitionStats:
    """A partition's stats from a read-only view, while its writer may be compacting.

    A read-only open lists the live files and then reads them; a compaction that finishes in
    between deletes some (RocksDB: "Corruption: ... No such file"). Nothing is wrong with the
    database then, so the view is opened again, a few times.
    """
    for attempt in range(1, attempts + 1):
        try:
            db = _open_db(path, AccessType.read_only(False))
        except Exception as error:  # noqa: BLE001 (rocksdict raises plain Exception)
            if attempt == attempts:
                raise StoreUnavailable(
                    f"cannot read {path} while its job writes it ({error}); try again"
                ) from None
            time.sleep(backoff(attempt, minimum=0.05, maximum=0.5))
            continue
        seq = db.get_column_family(SEQ)
        try:
            return _stats(partition, path, db, seq)
        finally:
            seq.close()
            db.close()
    raise AssertionError("unreachable")


class RocksPartition(StorePartition):
    """One raw partition's RocksDB, open and locked until :meth:`close`."""

    def __init__(self, partition: int, path: Path, bounds: Bounds, lock_timeout: float) -> None:
        super().__init__(partition)
        self.bounds = bounds
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db: Rdict | None = _open_locked(path, lock_timeout)
        self._seq = self._db.get_column_family(SEQ)
        self._seq_handle: Any = self._db.get_column_family_handle(SEQ)
        self._sync = WriteOptions()
        self._sync.sync = True
        self._meta = Meta.unpack(self._db.get(META_KEY))

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise StoreUnavailable(f"partition {self.partition} of the store was closed")
        return self._db

    def _claim(self, claims: list[Claim], *, restoring: bool) -> list[bytes | None]:
        db, meta = self.db, self._meta
        offsets = [owner_offset(claim.owner) for claim in claims]
        fresh = not restoring and (meta.position is None or min(offsets) >= meta.position)
        newest = max(claim.time for claim in claims)
        # 1. plan age-out
        plan = (
            self._plan_age_out(len(claims), newest) if fresh else AgeOut(seek_hint=meta.seek_hint)
        )
        aged = set(plan.ids)
        # 2. look up every id, in batched multi-gets
        ids: list[Any] = [claim.id for claim in claims]
        stored: list[bytes | None] = []
        for at in range(0, len(ids), MULTI_GET):
            found: Any = db[ids[at : at + MULTI_GET]]
            stored += found
        # 3. decide in order
        prefix = self._prefix
        owners: list[bytes | None] = []
        claimed: dict[bytes, bytes] = {}
        earliest = newest
        for claim, value in zip(claims, stored, strict=True):
            owner = claimed.get(claim.id)
            if owner is None and value is not None and claim.id not in aged:
                owner = prefix + value  # the partition_prefix + its owner_offset_bytes
            if owner is None:
                claimed[claim.id] = claim.owner
                earliest = min(earliest, claim.time)
            owners.append(owner)
        # 4. one atomic, synced write
        batch = WriteBatch(raw_mode=True)
        for key in plan.ids:
            batch.delete(key)
        for seq_key in plan.deleted:
            batch.delete(seq_key, self._seq_handle)
        if plan.rewritten is not None:
            batch.put(*plan.rewritten, self._seq_handle)
        next_seq = meta.next_seq
        if claimed:
            for claim_id, owner in claimed.items():
                batch.put(claim_id, owner_offset_bytes(owner))
            entry = _TIME.pack(earliest) + b"".join(claimed)
            batch.put(o8(next_seq), entry, self._seq_handle)
            next_seq += 1
        end = max(offsets) + 1
        meta = Meta(
            position=end if meta.position is None else max(meta.position, end),
            keys=meta.keys + len(claimed) - len(plan.ids),
            aged_out=meta.aged_out + len(plan.ids),
            seek_hint=plan.seek_hint,
            next_seq=next_seq,
            newest=newest if meta.newest is None else max(meta.newest, newest),
            counters=meta.counters
            if restoring
            else meta.counters + fresh_counters(claims, owners, meta.position),
        )
        batch.put(META_KEY, meta.pack())
        db.write(batch, self._sync)
        self._meta = meta
        return owners

    def _plan_age_out(self, incoming: int, newest: int) -> AgeOut:
        """Which of the oldest ids to age out before claiming ``incoming`` ids (step 1).

        By size: as many as the bounds need, oldest first, the last call cut if need be. By
        time: every call followed by one whose earliest id is older than the window's start
        (so every id of it is older too; the newest call is never aged out by time).
        """
        meta = self._meta
        plan = AgeOut(seek_hint=meta.seek_hint)
        size = _size(self.path) if self.bounds.max_bytes is not None else 0
        allowed = keys_allowed(self.bounds, meta.keys, size)
        count = overflow(allowed, meta.keys, incoming)
        cutoff = time_cutoff(self.bounds, newest)
        if count == 0 and cutoff is None:
            return plan
        entries = self._entries(meta.seek_hint)
        current = next(entries, None)
        while current is not None and len(plan.ids) < MAX_AGE_OUT:
            following = next(entries, None)
            key, value = current
            by_time = (
                cutoff is not None
                and following is not None
                and _TIME.unpack_from(following[1])[0] <= cutoff
            )
            wanted = count - len(plan.ids)
            held = (len(value) - _TIME.size) // _ID
            if wanted <= 0 and not by_time:
                break
            if by_time or wanted >= held:
                plan.ids += _ids(value, 0, held)
                plan.deleted.append(key)
                plan.seek_hint = int.from_bytes(key, "big") + 1
            else:
                plan.ids += _ids(value, 0, wanted)
                plan.rewritten = (key, value[: _TIME.size] + value[_TIME.size + wanted * _ID :])
                plan.seek_hint = int.from_bytes(key, "big")
                break
            current = following
        del entries
        return plan

    def _entries(self, start: int) -> Iterator[tuple[bytes, bytes]]:
        """``seq`` entries from sequence number ``start`` on, oldest first."""
        iterator = self._seq.iter()
        try:
            iterator.seek(o8(start))
            while iterator.valid():
                yield iterator.key(), iterator.value()
                iterator.next()
        finally:
            del iterator

    def _position(self) -> int | None:
        return self._meta.position

    def _stats(self) -> PartitionStats:
        return _stats(self.partition, self.path, self.db, self._seq)

    def _close(self) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        self._seq_handle = None
        self._seq.close()
        db.close()


def _ids(entry: bytes, first: int, last: int) -> list[bytes]:
    """Ids ``first`` to ``last - 1`` of a ``seq`` entry."""
    base = _TIME.size
    return [entry[base + n * _ID : base + (n + 1) * _ID] for n in range(first, last)]


def _open_locked(path: Path, lock_timeout: float) -> Rdict:
    deadline = time.monotonic() + lock_timeout
    attempt = 0
    while True:
        try:
            return _open_db(path)
        except Exception as error:  # noqa: BLE001 - rocksdict raises plain Exception
            text = str(error)
            if "lock" not in text.lower():
                raise StoreUnavailable(f"cannot open the dedupe store at {path}: {text}") from None
            if time.monotonic() >= deadline:
                raise StoreUnavailable(
                    f"the dedupe store at {path} is held by another process for over "
                    f"{lock_timeout:.0f} s (another dedupe job on the same data dir?)"
                ) from None
            attempt += 1
            time.sleep(backoff(attempt, minimum=0.01, maximum=0.2))


def _size(path: Path) -> int:
    """Bytes on disk: every file of the database (SSTs, the WAL, the manifest, logs).

    A file a compaction or a log roll removes between the listing and its size counts nothing.
    """
    total = 0
    with os.scandir(path) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def _stats(partition: int, path: Path, db: Rdict, seq: Rdict) -> PartitionStats:
    meta = Meta.unpack(db.get(META_KEY))
    oldest = None
    if meta.keys:
        iterator = seq.iter()
        iterator.seek(o8(meta.seek_hint))
        if iterator.valid():
            oldest = _TIME.unpack_from(iterator.value())[0]
        del iterator
    return PartitionStats(
        partition,
        meta.keys,
        _size(path),
        meta.position,
        oldest,
        meta.newest,
        meta.aged_out,
        meta.counters,
    )
