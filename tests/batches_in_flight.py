"""Where a crash test's kill landed: inside a Spark micro-batch, or between two.

Spark writes a query's ``offsets/N`` when micro-batch N starts and ``commits/N`` once its sink
returned (``exactly.spark.checkpoint``). Read after a SIGKILL, when no process of the run is left
to write, the checkpoints show what was in flight at the kill's instant: a batch whose
``offsets/N`` has no ``commits/N``. A batch counts only if the killed run planned it itself (its
number is above the newest planned when that run started): a batch the previous kill left
uncommitted is on disk before the next run has done anything, so it says nothing of where that
run was killed. (A run that replays it and is killed meanwhile is counted between batches; the
share printed is a lower bound.)

:class:`Checkpoints` watches a run's checkpoints (one per query), waits until a batch of its own
is in flight, and tells where a kill landed; :class:`Landings` keeps the tally a test prints and
asserts (:data:`INSIDE_SHARE`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.slowness import slowness

INSIDE_SHARE = 0.75  # of a test's kills, at least this share must land inside a micro-batch

# How long a kill waits for a micro-batch of the run's own: a run's start on a loaded 2-core
# machine, a query's Python source started again after Spark's 10 s ran out, took over 120 s;
# in CI on 2026-12-02 (load 15-20) the copy's first batch after a restart took 16-41 s, then 88 s,
# then over 165. Longer on a slower machine (tests/slowness.py).
BATCH_WAIT = 240.0 * slowness()


def numbered(folder: Path) -> set[int]:
    """The batch ids of the files Spark wrote in ``folder`` (its hidden temporaries and
    checksums aside); empty when there is no such folder yet."""
    try:
        return {int(entry.name) for entry in folder.iterdir() if entry.name.isdigit()}
    except FileNotFoundError:
        return set()


def newest_planned(checkpoint: Path) -> int:
    """The newest batch id with an ``offsets`` file; -1 before the first."""
    return max(numbered(checkpoint / "offsets"), default=-1)


def uncommitted(checkpoint: Path) -> int | None:
    """The batch planned and not committed in ``checkpoint`` (Spark runs one at a time), if any."""
    planned = newest_planned(checkpoint)
    if planned < 0 or planned in numbered(checkpoint / "commits"):
        return None
    return planned


def find(directory: Path) -> dict[str, Path]:
    """The Spark checkpoints in ``directory`` (its folders holding ``offsets`` and
    ``metadata``), by folder name: the queries of ``exactly up``, whatever their names."""
    return {
        offsets.parent.name: offsets.parent
        for offsets in sorted(directory.glob("*/offsets"))
        if (offsets.parent / "metadata").exists()
    }


@dataclass(frozen=True)
class Landing:
    """Where one kill landed: what its run had in flight (``route batch 3``; none: between)."""

    in_flight: tuple[str, ...]

    @property
    def inside(self) -> bool:
        return bool(self.in_flight)

    def __str__(self) -> str:
        return "inside " + ", ".join(self.in_flight) if self.in_flight else "between batches"


class Checkpoints:
    """The checkpoints of one job's queries, by query name, watched from the test.

    ``Checkpoints(paths)`` with a mapping, or a callable returning one (for a job whose
    checkpoints appear as its queries first start, as ``exactly up``'s do).
    """

    def __init__(self, paths: Mapping[str, Path] | Callable[[], Mapping[str, Path]]) -> None:
        self._paths = paths
        self._base: dict[str, int] = {}

    def paths(self) -> Mapping[str, Path]:
        return self._paths() if callable(self._paths) else self._paths

    def run_starts(self) -> None:
        """A run starts: the batches planned so far are not its own."""
        self._base = {name: newest_planned(path) for name, path in self.paths().items()}

    def own_in_flight(self, *, replayed: bool = False) -> tuple[str, ...]:
        """The batches the current run planned and has not committed (``QUERY batch N``); with
        ``replayed``, also one planned before it started (the batch a run replays first)."""
        found = []
        for name, path in self.paths().items():
            batch = uncommitted(path)
            if batch is not None and (replayed or batch > self._base.get(name, -1)):
                found.append(f"{name} batch {batch}")
        return tuple(found)

    def wait_for_batch(self, timeout: float, alive: Callable[[], bool]) -> bool:
        """Wait until a batch of the current run is in flight; False if the run died or
        ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and alive():
            if self.own_in_flight():
                return True
            time.sleep(0.01)
        return False

    def landing(self, *, by_itself: bool = False) -> Landing:
        """Where the kill that just ended the current run landed (read once it is dead).

        ``by_itself``: the run killed itself from a batch's sink (``on_batch``, a table's
        commit), so the batch it left uncommitted is the one it was in, replayed or not."""
        return Landing(self.own_in_flight(replayed=by_itself))


@dataclass
class Landings:
    """The landings of a test's kills (or of one backend's), for its summary and assertion."""

    name: str
    kills: list[Landing] = field(default_factory=list)
    inside_what: str = "inside a micro-batch"  # what a kill that landed inside found

    def add(self, landing: Landing) -> Landing:
        self.kills.append(landing)
        return landing

    @property
    def inside(self) -> int:
        return sum(landing.inside for landing in self.kills)

    @property
    def share(self) -> float:
        return self.inside / len(self.kills) if self.kills else 0.0

    def __str__(self) -> str:
        return (
            f"{self.name}: {self.inside} of {len(self.kills)} kills {self.inside_what} "
            f"({self.share:.0%})"
        )

    def check(self, least: float = INSIDE_SHARE) -> None:
        """Print the share, and fail below ``least``."""
        print(self, flush=True)
        assert self.kills, f"{self.name}: no kill recorded"
        assert self.share >= least, f"{self} is below {least:.0%}"
