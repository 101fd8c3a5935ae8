"""Replay: send finished jobs again, with the same message ids, as new jobs in the JobDB.

``exactly replay --destination D [--since T] [--until T] [--state discarded,expired]`` reads every
job of ``D`` from the archive and from the JobDB's live datasets (what is not archived yet), keeps
one per message, and enqueues a new job for each message whose **latest job** ended in one of the
states and whose **first job** was made (routed) in ``[since, until)``. The new job carries the
same payload and message id, so the same ``Idempotency-Key`` / ``webhook-id``; like every job it
names its destination, whose URL and headers the director reads from the settings when it sends,
and its expiry is fresh (now + ``expire``).

Deciding on the latest job makes a replay safe to repeat: a message already replayed has a newer
job, pending or delivered, and is left alone; one whose replayed job failed again is replayed
again by the next run, as asked.

A replay that crashes is **resumed by running the same command again**, and enqueues no message
twice. Each destination's replay runs these steps (marked in :func:`replay`):

0. find the run: the command's key (destination, states, since, until as written) names two JobDB
   markers, ``replay:KEY`` (when the last run started, ms) and ``replay:KEY:done`` (which run
   finished). A started run that did not finish is resumed with its start time ``T0``; otherwise
   a new run records ``T0 = now`` first. Relative times (``--since 6h``) count back from ``T0``;
1. collect every job of the destination, live datasets first, then the archive files (a dataset
   archived meanwhile is dropped only after its file is complete, so it is read there), into a
   temporary SQLite file on disk: memory stays small whatever the archive holds;
2. select, per message, the latest job; keep it when it was made **before T0**, ended in one of
   the states, and the message's first job is in the window;
3. enqueue the selection in chunks, each chunk one JobDB transaction with its marker
   (``replay:KEY:T0``, chunk n): a chunk is added whole or not at all, and its jobs are made
   after ``T0``, so the resumed run's step 2 sees those messages' latest job after T0 and skips
   them;
4. record the run finished (``replay:KEY:done`` = T0): the same command later is a new replay.

Two replays of one destination never run at once: each holds the destination's replay lock
in the JobDB (an ``flock`` beside SQLite, a PostgreSQL advisory lock, MariaDB's ``GET_LOCK``),
which the database or the kernel releases when its holder dies; a second one stops at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from exactly.delivery import packs
from exactly.delivery.archive import Archive
from exactly.delivery.jobdb.base import (
    ARCHIVED,
    ARCHIVING,
    AWAITING_SCHEDULING,
    DISCARDED,
    EXPIRED,
    SUCCEEDED,
    Job,
    NewJob,
    lane_of,
)
from exactly.delivery.jobdb.faces import ReplayJobs
from exactly.delivery.settings import DestinationSettings
from exactly.errors import ConfigError
from exactly.units import parse_duration

REPLAYABLE = (SUCCEEDED, DISCARDED, EXPIRED)
DEFAULT_STATES = (DISCARDED, EXPIRED)
CHUNK = 1000
_Selected = tuple[str, str, str, str | None, bytes]  # message id, state, source, user, payload


@dataclasses.dataclass(frozen=True, slots=True)
class Window:
    """Messages whose first job was made in ``[since, until)`` (seconds since the epoch)."""

    since: float | None
    until: float | None

    def describe(self) -> str:
        def at(value: float | None) -> str:
            return "-" if value is None else datetime.fromtimestamp(value, UTC).isoformat()

        return f"[{at(self.since)}, {at(self.until)})"


@dataclasses.dataclass(slots=True)
class ReplayResult:
    """What one destination's replay did."""

    destination: str
    enqueued: Counter[str] = dataclasses.field(default_factory=Counter)
    started_at: float = 0.0
    resumed: bool = False
    dry_run: bool = False
    archive_files: int = 0
    live_jobs: int = 0
    archived_jobs: int = 0
    window: Window = dataclasses.field(default_factory=lambda: Window(None, None))

    @property
    def total(self) -> int:
        return sum(self.enqueued.values())

    def as_dict(self) -> dict[str, Any]:
        """The result for ``exactly replay --json``."""
        return {
            "destination": self.destination,
            "enqueued": self.total,
            "by_state": dict(sorted(self.enqueued.items())),
            "archive_files": self.archive_files,
            "archived_jobs": self.archived_jobs,
            "live_jobs": self.live_jobs,
            "since": self.window.since,
            "until": self.window.until,
            "started_at": self.started_at,
            "resumed": self.resumed,
            "dry_run": self.dry_run,
        }

    def line(self) -> str:
        """The summary ``exactly replay`` prints, in lines within 80 columns."""
        from exactly.text import wrap

        states = ", ".join(f"{count:,} {state}" for state, count in sorted(self.enqueued.items()))
        started = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        parts = [
            f"{self.destination}: {self.total:,} jobs "
            + ("would be re-enqueued" if self.dry_run else "re-enqueued")
            + (f" ({states})" if states else ""),
            f"  of {self.archived_jobs:,} archived jobs in {self.archive_files:,} files and "
            f"{self.live_jobs:,} live jobs",
            f"  window {self.window.describe()}",
            "  "
            + (f"resumed the run started {started}" if self.resumed else f"run {started}")
            + ("; dry run, nothing enqueued" if self.dry_run else ""),
        ]
        return "\n".join(wrap(part, "    ") for part in parts)


def parse_states(text: str | None) -> tuple[str, ...]:
    """``discarded,expired`` as states a replay may select (default: discarded and expired)."""
    if text is None or not text.strip():
        return DEFAULT_STATES
    states = tuple(sorted({part.strip() for part in text.split(",") if part.strip()}))
    for state in states:
        if state not in REPLAYABLE:
            raise ConfigError(
                f"--state {state!r} cannot be replayed: use {', '.join(REPLAYABLE)} "
                "(comma-separated)"
            )
    return states


def parse_time(text: str | None, now: float, name: str) -> float | None:
    """An ISO 8601 time (``2026-11-23T10:00:00Z``; no zone means UTC; a date means its midnight)
    or a duration counted back from ``now`` (``6h``, ``2d``)."""
    if text is None or not text.strip():
        return None
    value = text.strip()
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        try:
            return now - parse_duration(value, name) / 1000
        except ConfigError:
            raise ConfigError(
                f"{name} {text!r} is neither a time (2026-11-23T10:00:00Z) nor a duration "
                "back from now (6h, 2d)"
            ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def replay_key(
    destination: str, states: Sequence[str], since: str | None, until: str | None
) -> str:
    """The key of a replay command: the same arguments (as written) resume the same run."""
    text = "\0".join([destination, ",".join(sorted(states)), since or "", until or ""])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def outcome(transitions: Iterable[dict[str, Any]]) -> str:
    """A job's state before archiving: its latest transition other than archiving/archived."""
    state = AWAITING_SCHEDULING
    for step in transitions:
        if step.get("state") not in (ARCHIVING, ARCHIVED):
            state = str(step.get("state"))
    return state


class _Collected:
    """Step 1's jobs in a temporary SQLite file: one row per job, payloads only where needed."""

    def __init__(self, directory: Path, states: Sequence[str]) -> None:
        self.states = tuple(states)
        self.db = sqlite3.connect(directory / "replay.sqlite", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute(
            "CREATE TABLE seen (message_id TEXT NOT NULL, created REAL NOT NULL, job_id INTEGER "
            "NOT NULL, state TEXT NOT NULL, source TEXT NOT NULL, user_id TEXT, payload BLOB, "
            "PRIMARY KEY (message_id, created, job_id)) WITHOUT ROWID"
        )
        self.db.execute("BEGIN")

    def add(self, rows: Iterable[tuple[str, float, int, str, str, str | None, bytes]]) -> None:
        self.db.executemany(
            "INSERT OR IGNORE INTO seen VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                (m, c, j, s, src, u, p if s in self.states else None)
                for m, c, j, s, src, u, p in rows
            ),
        )

    def selected(
        self, t0: float, window: Window
    ) -> Iterable[tuple[str, str, str, str | None, bytes]]:
        """Step 2, in the order of the messages' first jobs."""
        self.db.execute("COMMIT")
        marks = ", ".join("?" for _ in self.states)
        cursor = self.db.execute(
            "WITH ranked AS (SELECT *, ROW_NUMBER() OVER (PARTITION BY message_id ORDER BY "
            "created DESC, job_id DESC) AS r, MIN(created) OVER (PARTITION BY message_id) AS "
            "first FROM seen) SELECT message_id, state, source, user_id, payload FROM ranked "
            f"WHERE r = 1 AND created < ? AND state IN ({marks}) AND first >= ? AND first < ? "
            "ORDER BY first, message_id",
            (
                t0,
                *self.states,
                float("-inf") if window.since is None else window.since,
                float("inf") if window.until is None else window.until,
            ),
        )
        yield from cursor

    def close(self) -> None:
        self.db.close()


def replay(
    jobdb: ReplayJobs,
    archive: Archive,
    destination: DestinationSettings,
    *,
    states: Sequence[str] = DEFAULT_STATES,
    since: str | None = None,
    until: str | None = None,
    chunk: int = CHUNK,
    dry_run: bool = False,
    now: Callable[[], float] = time.time,
    report: Callable[[str], None] = lambda _: None,
) -> ReplayResult:
    """Replay ``destination``'s finished jobs; see the module docstring for the steps.

    With ``dry_run`` it selects as the real run would (resuming included) and writes nothing.
    Raises :class:`~exactly.delivery.jobdb.base.ReplayRunning` if a replay of the destination runs.
    """
    with jobdb.replay_lock(destination.name):
        return _replay(
            jobdb, archive, destination, states, since, until, chunk, dry_run, now, report
        )


def _replay(
    jobdb: ReplayJobs,
    archive: Archive,
    destination: DestinationSettings,
    states: Sequence[str],
    since: str | None,
    until: str | None,
    chunk: int,
    dry_run: bool,
    now: Callable[[], float],
    report: Callable[[str], None],
) -> ReplayResult:
    name = destination.name
    result = ReplayResult(name, dry_run=dry_run)
    key = replay_key(name, states, since, until)
    # 0. find the run: resume an unfinished one, or record a new start
    started = jobdb.marker(f"replay:{key}")
    finished = jobdb.marker(f"replay:{key}:done")
    if started is not None and (finished is None or finished < started):
        t0_ms, result.resumed = started, True
        report(f"{name}: resuming the replay started {_utc(started / 1000)}")
    else:
        t0_ms = max(round(now() * 1000), (started or 0) + 1)
        if not dry_run:
            jobdb.move_marker(f"replay:{key}", t0_ms)
    t0 = t0_ms / 1000
    result.started_at = t0
    result.window = window = Window(
        parse_time(since, t0, "--since"), parse_time(until, t0, "--until")
    )
    with tempfile.TemporaryDirectory(prefix="exactly-replay-") as scratch:
        collected = _Collected(Path(scratch), states)
        try:
            # 1. collect: the live datasets, then the archive
            after = 0
            while page := jobdb.jobs_of(name, after=after, limit=5000):
                after = page[-1].id
                result.live_jobs += len(page)
                collected.add(
                    (
                        message_id,
                        job.created_at,
                        job.id,
                        job.state,
                        job.bucket.partition("/")[0],
                        user_id,
                        payload,
                    )
                    for job in page
                    for message_id, user_id, payload in _messages(job)
                )
            for file in archive.names():
                result.archive_files += 1
                for record in archive.records(file):
                    if record.get("destination") != name:
                        continue
                    result.archived_jobs += 1
                    collected.add(
                        [
                            (
                                str(record["message_id"]),
                                float(record["created_at"]),
                                int(record["id"]),
                                outcome(record.get("transitions", [])),
                                str(record["bucket"]).partition("/")[0],
                                record.get("user_id"),
                                str(record["payload"]).encode(),
                            )
                        ]
                    )
            # 2. select, and 3. enqueue chunk by chunk, each with its marker
            query_id = f"replay:{key}:{t0_ms}"
            batch = (jobdb.marker(query_id) or -1) + 1
            pending: list[NewJob] = []
            counts: Counter[str] = Counter()
            for message_id, state, source, user_id, payload in collected.selected(t0, window):
                pending.append(
                    NewJob(
                        source=source,
                        destination=name,
                        payload=bytes(payload),
                        message_id=message_id,
                        user_id=user_id,
                        expire_at=now() + destination.window,
                        lane=lane_of(user_id, destination.lanes),
                    )
                )
                counts[state] += 1
                if dry_run:
                    result.enqueued.update(counts)
                    pending, counts = [], Counter()
                elif len(pending) >= chunk:
                    jobdb.add(pending, query_id=query_id, batch_id=batch)
                    result.enqueued.update(counts)
                    pending, counts, batch = [], Counter(), batch + 1
            if pending:
                jobdb.add(pending, query_id=query_id, batch_id=batch)
                result.enqueued.update(counts)
        finally:
            collected.close()
    # 4. the run is finished
    if not dry_run:
        jobdb.move_marker(f"replay:{key}:done", t0_ms)
    return result


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _messages(job: Job) -> list[packs.Member]:
    """A job's message, or a pack's members (each replayed as a job of its own)."""
    if job.packed:
        return packs.members(job.payload)
    return [packs.Member(job.message_id, job.user_id, job.payload)]
