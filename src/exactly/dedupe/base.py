"""The dedupe store interface (DESIGN.md boundary 3 and "Deduplication").

A store remembers, per raw partition, which record *owns* each messageId: the first record that
claimed it within the window. The dedupe job asks it once per partition and batch of records::

    with store.open(partition) as part:
        verdicts = part.claim([Claim(pack_id(message_id), pack_owner(p, offset), time), ...])

and each claim gets a :class:`Verdict`:

* ``NEW``: nobody owned the id; this record owns it now and passes.
* ``OWN``: this very record already owned it: a retried task or a replayed micro-batch claiming
  its own ids again. It passes, because passing it again is how the work is repeated, and the
  output's resume logic makes sure it is stored once.
* ``DUPLICATE``: another record owns the id (the verdict names it); this one is dropped.

Every store keeps this contract (``tests/integration/test_dedupe_contract.py`` checks it on each):

1. **Durable before return.** When :meth:`StorePartition.claim` returns, every ownership it
   granted survives a crash of the process and of the machine.
2. **Owners are stable.** An id keeps its first owner until it ages out of the window; claims
   are decided in the order given, so in one call the earliest record of an id wins.
3. **Position.** :meth:`StorePartition.position` is one past the highest offset whose claim is
   durable, so the job can tell a store that fell behind its output (deleted, restored from an old
   copy, flushed) and rebuild it from the output before it decides anything.
4. **Exclusive.** At most one open :class:`StorePartition` per store and partition at a time, in
   any process (a lock, or a server that serialises calls); opening waits for the previous holder.
5. **Window reporting.** :meth:`StorePartition.stats` reports keys, bytes and the age of the
   oldest id kept, so a window shrunk by the size bound is visible (and warned about).

Backends implement the ``_``-prefixed methods; validation and verdicts are built here once.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import partial
from itertools import repeat
from operator import itemgetter, methodcaller, ne
from pathlib import Path
from typing import ClassVar, NamedTuple

from exactly.dedupe.window import Bounds, effective_window
from exactly.errors import ConfigError, InvalidId
from exactly.events.ids import (
    ID_BYTES,
    MAX_PARTITION,
    OWNER_BYTES,
    owner_offset,
    owner_text,
    partition_prefix,
)
from exactly.gc_pause import collection_paused


class Status(IntEnum):
    NEW = 0
    OWN = 1
    DUPLICATE = 2


class Claim(NamedTuple):
    """One record's claim: its packed messageId, itself as owner, and when it was received (ms)."""

    id: bytes
    owner: bytes
    time: int


class Verdict(NamedTuple):
    """The store's answer for one claim: the status and the owner of the id now."""

    status: Status
    owner: bytes

    @property
    def passes(self) -> bool:
        return self.status is not Status.DUPLICATE

    def describe(self) -> str:
        if self.status is Status.DUPLICATE:
            return f"duplicate of {owner_text(self.owner)}"
        return "new" if self.status is Status.NEW else "retry of its own claim"


NEW, OWN, DUPLICATE = Status.NEW, Status.OWN, Status.DUPLICATE
_verdict = partial(tuple.__new__, Verdict)  # Verdict((status, owner)) without __new__'s checks


@dataclass(frozen=True)
class Counters:
    """Claims of records never claimed before (replays are not counted twice), by outcome."""

    claimed: int = 0
    new: int = 0
    duplicates: int = 0

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.claimed + other.claimed,
            self.new + other.new,
            self.duplicates + other.duplicates,
        )


@dataclass(frozen=True)
class PartitionStats:
    """What one partition of a store holds and how far back it reaches.

    ``oldest``/``newest`` are receive times (ms) of the oldest and newest ids kept; ``aged_out``
    counts ids removed by the bounds so far. While nothing was aged out, the window is everything
    since the first id, and :meth:`window` is None (unbounded).
    """

    partition: int
    keys: int
    bytes: int
    position: int | None
    oldest: int | None = None
    newest: int | None = None
    aged_out: int = 0
    counters: Counters = field(default_factory=Counters)

    def window(self, now: int) -> int | None:
        return effective_window(self.oldest, now, self.aged_out > 0)


def fresh_counters(
    claims: Sequence[Claim], owners: Sequence[bytes | None], position: int | None
) -> Counters:
    """The counters for a claim call: only records at or past the position count (pure).

    ``owners`` is what :meth:`StorePartition._claim` returned. A record below the position was
    claimed (and counted) by an earlier attempt.
    """
    start = 0 if position is None else position
    if not claims or owner_offset(min(map(itemgetter(1), claims))) >= start:
        # every claim counts (the usual case): counted in C
        new = owners.count(None)
        duplicates = sum(map(ne, map(itemgetter(1), claims), owners)) - new  # None differs too
        return Counters(len(claims), new, duplicates)
    claimed = new = duplicates = 0
    for claim, owner in zip(claims, owners, strict=True):
        if owner_offset(claim.owner) < start:
            continue
        claimed += 1
        if owner is None:
            new += 1
        elif owner != claim.owner:
            duplicates += 1
    return Counters(claimed, new, duplicates)


class StorePartition(ABC):
    """One partition of a store, held exclusively until :meth:`close` (contract 4)."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self._prefix = partition_prefix(partition)

    def claim(self, claims: Sequence[Claim]) -> list[Verdict]:
        """Claim each id for its owner, in order; durable when this returns (contracts 1-2).

        Owners must be records of this partition. Raises :class:`~exactly.errors.InvalidId` for
        a malformed claim, before anything is stored.
        """
        owners = self._owners(claims)
        if owners.count(None) == len(owners):  # all new, the usual case: a loop in C
            return list(map(_verdict, zip(repeat(NEW), map(itemgetter(1), claims))))
        return [
            _verdict((NEW, claim.owner))
            if owner is None
            else _verdict((OWN if owner == claim.owner else DUPLICATE, owner))
            for claim, owner in zip(claims, owners, strict=True)
        ]

    def claim_duplicates(self, claims: Sequence[Claim]) -> list[int]:
        """:meth:`claim`, answered by the positions of the duplicates only, in order.

        What the dedupe task needs of the verdicts, without building one per claim.
        """
        owners = self._owners(claims)
        if owners.count(None) == len(owners):
            return []
        return [
            index
            for index, owner in enumerate(owners)
            if owner is not None and owner != claims[index][1]
        ]

    def _owners(self, claims: Sequence[Claim]) -> list[bytes | None]:
        """Checked and claimed: each claim's owner stored before it (:meth:`_claim`)."""
        if not claims:
            return []
        self._check(claims)
        with collection_paused():
            return self._claim(list(claims), restoring=False)

    def restore(self, claims: Sequence[Claim]) -> None:
        """Record ownerships found in the output (a rebuild), as claims that are not counted.

        Claims must come in offset order, above :meth:`position`. An id already owned keeps its
        owner.
        """
        if claims:
            self._check(claims)
            with collection_paused():
                self._claim(list(claims), restoring=True)

    def _check(self, claims: Sequence[Claim]) -> None:
        prefix = self._prefix
        owners = list(map(itemgetter(1), claims))
        if (
            set(map(len, map(itemgetter(0), claims))) == {ID_BYTES}
            and set(map(len, owners)) == {OWNER_BYTES}
            and all(map(methodcaller("startswith", prefix), owners))
        ):
            return  # all well formed (the usual case): checked in C
        for index, claim in enumerate(claims):
            if len(claim.id) != ID_BYTES or len(claim.owner) != OWNER_BYTES:
                raise InvalidId(
                    f"claim {index}: an id is {ID_BYTES} bytes (pack_id) and an owner "
                    f"{OWNER_BYTES} (pack_owner)"
                )
            if not claim.owner.startswith(prefix):
                raise InvalidId(
                    f"claim {index}: owner {owner_text(claim.owner)} is not a record of "
                    f"partition {self.partition}"
                )

    def position(self) -> int | None:
        """One past the highest offset claimed durably; None if nothing was ever claimed."""
        return self._position()

    def stats(self) -> PartitionStats:
        """Keys, bytes, position and the window of this partition (contract 5)."""
        return self._stats()

    def close(self) -> None:
        """Release the partition (its lock); the object is unusable afterwards."""
        self._close()

    def __enter__(self) -> StorePartition:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what a backend implements --------------------------------------------------------------

    @abstractmethod
    def _claim(self, claims: list[Claim], *, restoring: bool) -> list[bytes | None]:
        """Claim ids durably; for each claim the owner stored before it, None if there was none.

        Claims are validated, in offset order, and may repeat an id: a later claim of an id
        sees the earlier one's owner. ``restoring`` claims are not counted and never age
        anything out.
        """

    @abstractmethod
    def _position(self) -> int | None: ...

    @abstractmethod
    def _stats(self) -> PartitionStats: ...

    @abstractmethod
    def _close(self) -> None: ...


def write_once(path: Path, text: str) -> str:
    """Write ``text`` (a line) to ``path`` unless it exists, durably; returns what it holds.

    A hard link publishes the complete file or fails if another writer got there first.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("w") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass
    finally:
        temporary.unlink()
    return path.read_text().strip()


class SeenIds(ABC):
    """Where the dedupe job keeps the messageIds it has seen: a claim store
    (:class:`DedupeStore`) or Spark's own state (``spark_state.SparkState``, the spark-state
    mode). Both record the scope their ids were packed for and refuse another at start.

    ``name`` is what ``[dedupe] store`` calls it; ``bounds`` are what it keeps at most.
    """

    name: ClassVar[str]
    # the scope ids are packed for, once adopted (or given by the job's plan): a store of
    # several servers records it on each in the transaction that first writes there
    scope: str | None = None
    bounds: Bounds = Bounds()

    def adopt_scope(self, scope: str, partitions: int) -> None:
        """Record the dedupe scope with the store, or refuse at start one it was not built with.

        A store's ids are packed for one scope (``exactly.events.ids``): read with another, no
        lookup would find them and every duplicate within the window would pass. A store that
        holds ids but no scope was built before scopes existed, by messageId alone
        (``workspace``). Raises :class:`~exactly.errors.ConfigError` with one line saying what
        to do.
        """
        found = self._recorded_scope(partitions)
        if found is None or found == scope:
            # recorded where it is missing (a server restarted empty); what a concurrent start
            # recorded wins
            found = self._record_scope(scope)
        if found != scope:
            raise ConfigError(self._refusal(found, scope))
        self.scope = scope

    def _refusal(self, found: str, scope: str) -> str:
        """Why the store refuses ``scope`` when it holds ``found``, and what to do (one line)."""
        if "," in found:  # never written so by exactly: servers of two stores put together
            return (
                f"the {self.name} dedupe store ({self.location()}) holds ids of several scopes "
                f"({found.replace(',', ', ')}) on different servers: {self.fresh_hint()} so "
                f"that the job rebuilds it from the output with scope {scope!r}"
            )
        return (
            f"the {self.name} dedupe store ({self.location()}) holds ids deduplicated by "
            f"scope {found!r}, not {scope!r}: set [dedupe] scope = {found!r} "
            f"(EXACTLY_DEDUPE__SCOPE={found}), or {self.fresh_hint()} so that the job "
            f"rebuilds it from the output with scope {scope!r}"
        )

    @abstractmethod
    def _recorded_scope(self, partitions: int) -> str | None:
        """The scope recorded with the store (several, comma-separated, if its servers differ;
        a server with none is one that lost its data); ``workspace`` if it has ids but none
        anywhere (built before scopes existed); else None."""

    @abstractmethod
    def _record_scope(self, scope: str) -> str:
        """Record ``scope`` wherever no scope is recorded; returns the ones recorded now."""

    @abstractmethod
    def location(self) -> str:
        """Where the store keeps its data, for messages."""

    @abstractmethod
    def fresh_hint(self) -> str:
        """How to start an empty store instead, for messages (``delete DIR`` ...)."""

    @abstractmethod
    def describe(self) -> str:
        """One line for people: the store, where its data lives and its bounds."""

    @abstractmethod
    def stats(self, partitions: int) -> list[PartitionStats]:
        """Stats of partitions ``0 .. partitions - 1``."""


class DedupeStore(SeenIds):
    """A claim store's configuration: picklable, shipped to Spark tasks, which open partitions.

    ``bounds`` also bound how far back a rebuild from the output reaches. A store needs no
    cleanup; partitions do.
    """

    def open(self, partition: int) -> StorePartition:
        """Open ``partition`` exclusively, waiting for a previous holder (contract 4)."""
        if not isinstance(partition, int) or not 0 <= partition <= MAX_PARTITION:
            raise InvalidId(f"a partition is 0 to {MAX_PARTITION}, not {partition!r}")
        return self._open(partition)

    @abstractmethod
    def _open(self, partition: int) -> StorePartition: ...

    def stats(self, partitions: int) -> list[PartitionStats]:
        """Stats of partitions ``0 .. partitions - 1`` (opens each in turn)."""
        result = []
        for partition in range(partitions):
            with self.open(partition) as part:
                result.append(part.stats())
        return result
