"""The rocksdb dedupe store (Segment's design): one RocksDB per raw partition on local disk.

Layout of ``ROOT/p<partition>`` (rocksdict, raw bytes):

* one column family per *generation*, ``g<number>`` (eight digits): ``id (16 bytes) -> offset
  (6 bytes)``, the owner's offset (its partition is the database's own). A generation takes the
  claims of consecutive calls until it holds ``1/GENERATIONS`` of the size bound or spans
  ``1/GENERATIONS`` of the time window (``window.py``); then the next one starts. Age-out drops
  the oldest generations whole, so a kept id costs its key and offset and nothing else (no index
  by age), and the window moves in steps of one generation. A bloom filter of 10 bits per key
  in each generation answers most lookups of a new id without reading a block; lookups are
  batched multi-gets, one per live generation.
* ``default`` holds one key, the meta (``exactly:meta``): the position, key count, ids aged out,
  counters, and the live generations with their key counts and receive times.

Commit protocol of :meth:`RocksPartition._claim`, one call per batch of records:

1. **Plan age-out** (only when every claim is past the position: a replayed batch never ages
   anything out, so it sees the store as its first attempt did): whether the call starts a
   generation, and which of the oldest generations to drop so the batch fits the size
   bounds and the time window. A new generation's column family is created now.
2. **Look up** every id with batched multi-gets in the generations kept, newest first.
3. **Decide** in order: an absent id is claimed by its record; a repeat within the call sees the
   first claim.
4. **Write one batch**, synced (WAL fsync) before return: the new ids into the newest generation
   (and into new ones as it fills up, created now) and the meta, which no longer lists the
   dropped generations. RocksDB applies a write batch atomically, so the position never runs
   ahead of the claims it covers.
5. **Drop** the aged-out generations' column families. A crash before this leaves them unlisted
   in the meta; they are dropped when the partition is next opened (as is a generation created
   in step 1 or 4 whose write never happened).

Exclusive: RocksDB's own file lock refuses a second opener, in this process or another; opening
retries until the holder closes (a retried Spark task waits for a zombie attempt) or
``lock_timeout`` passes. The job opens a partition per task and closes it at the task's end, so a
partition moves freely between Python workers.

A partition written by earlier versions (ids in ``default``, a ``seq`` index by age) is converted
when first opened for writing: its ids become generation 0.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import time
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from operator import is_, itemgetter
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
from exactly.dedupe.window import (
    Bounds,
    Generation,
    generation_sizes,
    generation_step,
    generations_to_drop,
    keys_allowed,
    opens_generation,
    time_cutoff,
)
from exactly.errors import StoreUnavailable
from exactly.events.ids import ID_BYTES, PARTITION_BYTES, owner_offset
from exactly.units import format_duration

META_KEY = b"exactly:meta"
SCOPE_FILE = "scope"  # ROOT/scope: the dedupe scope the ids were packed for
LEGACY_SEQ = "seq"  # the index by age of the earlier layout
MULTI_GET = 1000  # ids per multi-get: much larger ones are slower in rocksdict
COPY_BATCH = 10_000  # ids per write while converting the earlier layout
_HEAD = struct.Struct(">B8q")
_GENERATION = struct.Struct(">4q")
_LEGACY_META = struct.Struct(">10q")
_TIME = struct.Struct(">q")
_VERSION = 2
_OFFSET_PART = slice(PARTITION_BYTES, None)  # an owner's owner_offset_bytes


def family(generation: Generation) -> str:
    """The column family holding a generation's ids."""
    return f"g{generation.number:08d}"


@dataclass(frozen=True)
class Meta:
    """The partition's bookkeeping, rewritten atomically with every claim call."""

    position: int | None = None
    keys: int = 0
    aged_out: int = 0
    newest: int | None = None
    counters: Counters = field(default_factory=Counters)
    generations: tuple[Generation, ...] = ()  # live, oldest first
    next_generation: int = 0

    def pack(self) -> bytes:
        c = self.counters
        head = _HEAD.pack(
            _VERSION,
            -1 if self.position is None else self.position,
            self.keys,
            self.aged_out,
            -1 if self.newest is None else self.newest,
            c.claimed,
            c.new,
            c.duplicates,
            self.next_generation,
        )
        return head + b"".join(
            _GENERATION.pack(g.number, g.keys, g.earliest, g.newest) for g in self.generations
        )

    @classmethod
    def unpack(cls, data: bytes | None) -> Meta:
        if data is None:
            return cls()
        if is_legacy(data):
            return _legacy_meta(data)
        _, position, keys, aged, newest, claimed, new, dups, next_generation = _HEAD.unpack_from(
            data
        )
        generations = tuple(
            Generation(*_GENERATION.unpack_from(data, offset))
            for offset in range(_HEAD.size, len(data), _GENERATION.size)
        )
        counters = Counters(claimed, new, dups)
        return cls.stored(position, keys, aged, newest, counters, generations, next_generation)

    @classmethod
    def stored(
        cls,
        position: int,
        keys: int,
        aged: int,
        newest: int,
        counters: Counters,
        generations: tuple[Generation, ...],
        next_generation: int,
    ) -> Meta:
        """A meta from its stored fields, where -1 stands for no position or no newest."""
        return cls(
            None if position < 0 else position,
            keys,
            aged,
            None if newest < 0 else newest,
            counters,
            generations,
            next_generation,
        )

    @property
    def oldest(self) -> int | None:
        """Receive time of the oldest id kept (the oldest generation's earliest)."""
        return self.generations[0].earliest if self.generations else None


def is_legacy(data: bytes) -> bool:
    """Whether a meta value was written by the earlier layout (ids in ``default``, ``seq``)."""
    return len(data) == _LEGACY_META.size


def _legacy_meta(data: bytes, oldest: int | None = None) -> Meta:
    """An earlier layout's meta, its ids as generation 0 (received from ``oldest`` on)."""
    position, keys, aged, _, _, newest, claimed, new, dups, _ = _LEGACY_META.unpack(data)
    generations: tuple[Generation, ...] = ()
    if keys > 0 and newest >= 0:
        generations = (Generation(0, keys, newest if oldest is None else oldest, newest),)
    return Meta.stored(position, keys, aged, newest, Counters(claimed, new, dups), generations, 1)


@dataclass
class Plan:
    """Step 1's outcome: the generations kept (the newest takes the claims), those dropped, and
    the number the next new generation gets."""

    kept: tuple[Generation, ...]
    dropped: tuple[Generation, ...]
    next: int


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
    """The database with every column family it has (RocksDB refuses to open fewer)."""
    names = Rdict.list_cf(str(path)) if (path / "CURRENT").exists() else []
    families = {name: _options(bloom=name != LEGACY_SEQ) for name in names if name != "default"}
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
        try:
            return _stats(partition, path, _read_meta(db))
        finally:
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
        self._sync = WriteOptions()
        self._sync.sync = True
        self._families: dict[str, tuple[Rdict, Any]] = {}  # name -> (view, handle)
        try:
            self._meta = self._tidy(self.db, self.db.get(META_KEY))
        except BaseException:
            self._close()
            raise

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise StoreUnavailable(f"partition {self.partition} of the store was closed")
        return self._db

    def _claim(self, claims: list[Claim], *, restoring: bool) -> list[bytes | None]:
        meta = self._meta
        ids, owned = list(map(itemgetter(0), claims)), list(map(itemgetter(1), claims))
        low, high = owner_offset(min(owned)), owner_offset(max(owned))  # one prefix: bytes order
        fresh = not restoring and (meta.position is None or low >= meta.position)
        newest = max(map(itemgetter(2), claims))
        size = _size(self.path) if self.bounds.max_bytes is not None else 0
        allowed = keys_allowed(self.bounds, meta.keys, size)
        # 1. plan age-out (and a new generation)
        plan = (
            self._plan(allowed, len(claims), newest)
            if fresh
            else Plan(meta.generations, (), meta.next_generation)
        )
        # 2. look up every id in the kept generations, newest first
        stored = self._look_up(ids, plan.kept)
        # 3. decide in order
        owners, claimed = self._decide(claims, ids, stored)
        # 4. one atomic, synced write: the claims into the newest generations, and the meta
        batch = WriteBatch(raw_mode=True)
        generations, next_generation = self._fill(batch, plan, claimed, allowed)
        dropped = sum(generation.keys for generation in plan.dropped)
        end = high + 1
        meta = Meta(
            position=end if meta.position is None else max(meta.position, end),
            keys=meta.keys + len(claimed) - dropped,
            aged_out=meta.aged_out + dropped,
            newest=newest if meta.newest is None else max(meta.newest, newest),
            counters=meta.counters
            if restoring
            else meta.counters + fresh_counters(claims, owners, meta.position),
            generations=generations,
            next_generation=next_generation,
        )
        batch.put(META_KEY, meta.pack())
        self.db.write(batch, self._sync)
        self._meta = meta
        # 5. drop the aged-out generations
        for generation in plan.dropped:
            self._drop(family(generation))
        return owners

    def _decide(
        self, claims: list[Claim], ids: list[bytes], stored: list[Any]
    ) -> tuple[list[bytes | None], list[Claim]]:
        """Step 3: each claim's owner before it (None: new), and the claims that take their id.

        An absent id goes to its claim, and a repeat within the call sees the first claim.
        """
        prefix = self._prefix  # the partition_prefix of every stored owner_offset_bytes
        if len(set(ids)) == len(ids):  # no repeats within the call (the usual case): in C
            if stored.count(None) == len(stored):
                return [None] * len(claims), claims  # and none stored: all new
            absent = list(map(is_, stored, repeat(None)))
            found = [None if value is None else prefix + value for value in stored]
            return found, list(compress(claims, absent))
        owners: list[bytes | None] = []
        claimed: dict[bytes, Claim] = {}
        for claim, value in zip(claims, stored, strict=True):
            first = claimed.get(claim.id)
            owner = None if first is None else first.owner
            if owner is None and value is not None:
                owner = prefix + value
            if owner is None:
                claimed[claim.id] = claim
            owners.append(owner)
        return owners, list(claimed.values())

    def _plan(self, allowed: int | None, incoming: int, newest: int) -> Plan:
        """Step 1: the generations to keep, a new one last if the call starts one, and to drop.

        By size: the oldest generations go while the kept keys and the call's exceed the bounds.
        By time: every generation whose newest id is older than the window's start.
        """
        meta, window = self._meta, self.bounds.window
        live, following = meta.generations, meta.next_generation
        if opens_generation(live[-1] if live else None, allowed, window, newest):
            live = (*live, self._started(following, newest))
            following += 1
        count = generations_to_drop(live, allowed, incoming, time_cutoff(self.bounds, newest))
        return Plan(live[count:], live[:count], following)

    def _fill(
        self,
        batch: WriteBatch,
        plan: Plan,
        claimed: list[Claim],
        allowed: int | None,
    ) -> tuple[tuple[Generation, ...], int]:
        """Step 4's puts: the claimed ids into the newest generation, then new ones as each
        fills up (``generation_sizes``); the generations after the call, and the next number."""
        generations, following = list(plan.kept), plan.next
        if not claimed:
            return tuple(generations), following
        if not generations:  # a replay or a restore into an empty store
            generations.append(self._started(following, claimed[0].time))
            following += 1
        current = generations[-1]
        sizes = generation_sizes(current.keys, generation_step(allowed), len(claimed))
        at = 0
        for index, size in enumerate(sizes):
            if index > 0:
                generations.append(self._started(following, claimed[at].time))
                following += 1
            part = claimed[at : at + size]
            at += size
            if not part:
                continue
            generation = generations[-1]
            handle = self._family(family(generation))[1]
            ids = map(itemgetter(0), part)
            offsets = map(itemgetter(_OFFSET_PART), map(itemgetter(1), part))  # owner_offset_bytes
            deque(map(batch.put, ids, offsets, repeat(handle)), maxlen=0)  # the puts, in C
            generations[-1] = replace(
                generation,
                keys=generation.keys + len(part),
                earliest=min(generation.earliest, *map(itemgetter(2), part)),
                newest=max(generation.newest, *map(itemgetter(2), part)),
            )
        return tuple(generations), following

    def _started(self, number: int, at: int) -> Generation:
        """A new, empty generation, its column family created (an orphan if never written)."""
        generation = Generation(number, 0, at, at)
        self._family(family(generation), create=True)
        return generation

    def _look_up(self, ids: list[bytes], generations: tuple[Generation, ...]) -> list[Any]:
        """The stored owner offset of each id, None if absent, searching newest first."""
        stored: list[Any] = [None] * len(ids)
        missing = list(range(len(ids)))
        for generation in reversed(generations):
            if not missing:
                break
            if generation.keys == 0:
                continue
            view = self._family(family(generation))[0]
            every = len(missing) == len(ids)  # the first generation searched
            wanted: list[Any] = ids if every else [ids[index] for index in missing]
            found: list[Any] = []
            for at in range(0, len(wanted), MULTI_GET):
                chunk: Any = view[wanted[at : at + MULTI_GET]]
                found += chunk
            if every:
                stored = found
                missing = [index for index, value in enumerate(found) if value is None]
                continue
            still = []
            for index, value in zip(missing, found, strict=True):
                if value is None:
                    still.append(index)
                else:
                    stored[index] = value
            missing = still
        return stored

    def _family(self, name: str, create: bool = False) -> tuple[Rdict, Any]:
        found = self._families.get(name)
        if found is None:
            db = self.db
            view = db.create_column_family(name, _options(bloom=True)) if create else None
            if view is None:
                view = db.get_column_family(name)
            found = self._families[name] = (view, db.get_column_family_handle(name))
        return found

    def _drop(self, name: str) -> None:
        view = self._families.pop(name, None)
        if view is not None:
            view[0].close()
        self.db.drop_column_family(name)

    def _tidy(self, db: Rdict, data: bytes | None) -> Meta:
        """The meta, once the partition is in this layout: an earlier layout converted, and
        column families the meta does not list (a crash between steps 1 and 5) dropped."""
        if data is not None and is_legacy(data):
            return self._convert(db, data)
        meta = Meta.unpack(data)
        listed = {family(generation) for generation in meta.generations}
        for name in Rdict.list_cf(str(self.path)):
            if name not in listed and name != "default":
                self._drop(name)
        return meta

    def _convert(self, db: Rdict, data: bytes) -> Meta:
        """The earlier layout's ids moved into generation 0, its meta rewritten, ``seq`` dropped.

        Repeatable: a conversion cut short is started again (the meta still has the old shape
        until the last write, which also deletes the ids from ``default``).
        """
        oldest = _legacy_oldest(db, data)
        legacy = _legacy_meta(data, oldest)
        with contextlib.suppress(Exception):  # a conversion cut short
            db.drop_column_family(family(Generation(0, 0, 0, 0)))
        kept = self._started(0, legacy.newest or 0)
        handle = self._family(family(kept))[1]
        copied = 0
        batch = WriteBatch(raw_mode=True)
        iterator = db.iter()
        iterator.seek_to_first()
        while iterator.valid():
            key = iterator.key()
            if len(key) == ID_BYTES:
                batch.put(key, iterator.value(), handle)
                copied += 1
                if copied % COPY_BATCH == 0:
                    db.write(batch)
                    batch = WriteBatch(raw_mode=True)
            iterator.next()
        del iterator
        earliest = (legacy.newest if oldest is None else oldest) or 0
        generations = (replace(kept, keys=copied, earliest=earliest),) if copied else ()
        meta = replace(legacy, keys=copied, generations=generations, next_generation=1)
        batch.delete_range(b"", META_KEY)  # every id (16 bytes) but none of the meta key
        batch.delete_range(META_KEY + b"\0", b"\xff" * (ID_BYTES + 1))
        batch.put(META_KEY, meta.pack())
        db.write(batch, self._sync)
        if not copied:
            self._drop(family(kept))
        if LEGACY_SEQ in Rdict.list_cf(str(self.path)):
            db.drop_column_family(LEGACY_SEQ)
        return meta

    def generations(self) -> tuple[Generation, ...]:
        """The live generations, oldest first."""
        return self._meta.generations

    def _position(self) -> int | None:
        return self._meta.position

    def _stats(self) -> PartitionStats:
        return _stats(self.partition, self.path, self._meta)

    def _close(self) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        for view, _ in self._families.values():
            view.close()
        self._families.clear()
        db.close()


def _read_meta(db: Rdict) -> Meta:
    """The meta of a database in either layout (the earlier one dated from its ``seq``)."""
    data = db.get(META_KEY)
    if data is not None and is_legacy(data):
        return _legacy_meta(data, _legacy_oldest(db, data))
    return Meta.unpack(data)


def _legacy_oldest(db: Rdict, data: bytes) -> int | None:
    """Receive time of the oldest id an earlier layout kept: its oldest ``seq`` entry's."""
    hint = _LEGACY_META.unpack(data)[3]
    if LEGACY_SEQ not in Rdict.list_cf(db.path()):
        return None
    seq = db.get_column_family(LEGACY_SEQ)
    try:
        iterator = seq.iter()
        iterator.seek(hint.to_bytes(8, "big"))
        oldest = _TIME.unpack_from(iterator.value())[0] if iterator.valid() else None
        del iterator
        return oldest
    finally:
        seq.close()


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


def _stats(partition: int, path: Path, meta: Meta) -> PartitionStats:
    return PartitionStats(
        partition,
        meta.keys,
        _size(path),
        meta.position,
        meta.oldest if meta.keys else None,
        meta.newest,
        meta.aged_out,
        meta.counters,
    )
