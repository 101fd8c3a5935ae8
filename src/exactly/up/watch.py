"""Where each stage of the pipeline stands, read from the outside (``exactly up``'s view).

Nothing here asks a running part: a :class:`Snapshot` reads the log's end offsets, the end of the
last micro-batch each query committed (its Spark checkpoint) and the JobDB's counts, all of which
their writers keep durable anyway. A :class:`History` of snapshots gives rates over
:data:`RATE_WINDOW` seconds (micro-batches commit in steps: two snapshots a second apart would show
``0/s`` between two batches of a steady stream); a topic's end minus a query's position is that
query's lag, in records.

Whether a query has started is in ``DATA_DIR/up/queries.json``, which the pipeline part writes
(:func:`save_progress`): its pid and, per query, when Spark reported its first micro-batch
(``lastProgress``, which Spark sets after the first trigger, with or without new data). Until
then the query is *starting* (the JVM starts, the query plans): :func:`starting`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from exactly.config import Settings
from exactly.delivery.jobdb.base import Summary
from exactly.delivery.jobdb.faces import JobReader
from exactly.errors import ExactlyError
from exactly.log import Log
from exactly.spark.checkpoint import committed_end
from exactly.stages import EVENTS as _EVENTS
from exactly.stages import RAW as _RAW

RAW, EVENTS = _RAW, _EVENTS  # the topics the stages read
RATE_WINDOW = 30.0  # seconds a rate is averaged over: longer than any micro-batch of a stream


@dataclass(frozen=True)
class Stage:
    """A streaming query: what it has read (its position) of the topic it reads."""

    name: str
    topic: str
    checkpoint: Path


@dataclass
class Snapshot:
    """The pipeline at one moment: topic ends, query positions, deliveries per destination."""

    at: float
    ends: dict[str, int] = field(default_factory=dict)  # records appended per topic
    positions: dict[str, int] = field(default_factory=dict)  # records read per stage
    deliveries: dict[str, Summary] = field(default_factory=dict)
    progress: Progress | None = None  # the pipeline part's queries.json

    def lag(self, stage: Stage) -> int | None:
        if stage.name not in self.positions or stage.topic not in self.ends:
            return None
        return max(0, self.ends[stage.topic] - self.positions[stage.name])


def stages(settings: Settings) -> list[Stage]:
    """The queries ``exactly up`` runs, with their checkpoints (as the pipeline part makes them:
    :func:`exactly.stages.enabled`)."""
    from exactly.stages import enabled

    return [
        Stage(stage.name, stage.reads, stage.checkpoint(settings)) for stage in enabled(settings)
    ]


def take(
    settings: Settings, log: Log, watched: list[Stage], jobdb: JobDBReader | None = None
) -> Snapshot:
    """A snapshot now; a part that has not created its topic or checkpoint yet is left out.
    A caller that takes snapshots again and again passes its ``jobdb`` reader to keep."""
    snapshot = Snapshot(time.time())
    for topic in (RAW, EVENTS, f"{RAW}.rejected", f"{RAW}.suppressed"):
        try:
            snapshot.ends[topic] = sum(log.end_offsets(topic).values())
        except ExactlyError:
            continue
    for stage in watched:
        try:
            end = committed_end(stage.checkpoint)
        except (OSError, ValueError):
            end = None
        if end is not None:
            snapshot.positions[stage.name] = sum(end.values())
    if settings.destinations:
        reader = jobdb or JobDBReader(settings)
        try:
            snapshot.deliveries = reader.summary()
        finally:
            if jobdb is None:  # one made for this snapshot
                reader.close()
    snapshot.progress = read_progress(progress_path(settings.data_dir))
    return snapshot


class JobDBReader:
    """The JobDB's summary per destination, from a JobDB kept open between snapshots: its
    summary reads again only the datasets that changed since the last one (with a backlog, not
    every job each second). A failure gives empty summaries and a new connection next time: a
    view of the JobDB never stops what it watches."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._jobdb: JobReader | None = None

    def summary(self) -> dict[str, Summary]:
        from exactly.delivery.jobdb import open_jobdb

        found: dict[str, Summary] = {}
        try:
            if self._jobdb is None:
                self._jobdb = open_jobdb(self.settings.jobdb_url)
            found = self._jobdb.summary(time.time())
        except Exception:  # noqa: BLE001 - see the class docstring
            self.close()
        for destination in self.settings.destinations:
            found.setdefault(destination.name, Summary(destination.name, {}))
        return found

    def close(self) -> None:
        if self._jobdb is not None:
            with contextlib.suppress(Exception):
                self._jobdb.close()
            self._jobdb = None


def rate(before: Snapshot | None, after: Snapshot, count: int | None, was: int | None) -> float:
    """Per second between two snapshots, 0 when either count is unknown."""
    if before is None or count is None or was is None or after.at <= before.at:
        return 0.0
    return max(0.0, (count - was) / (after.at - before.at))


class History:
    """The snapshots of the last :data:`RATE_WINDOW` seconds (and the one just before them)."""

    def __init__(self, window: float = RATE_WINDOW) -> None:
        self.window = window
        self.snapshots: deque[Snapshot] = deque()

    def add(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)
        while len(self.snapshots) > 2 and snapshot.at - self.snapshots[1].at >= self.window:
            self.snapshots.popleft()

    @property
    def oldest(self) -> Snapshot | None:
        return self.snapshots[0] if len(self.snapshots) > 1 else None

    @property
    def newest(self) -> Snapshot | None:
        return self.snapshots[-1] if self.snapshots else None

    def rate(self, count: Callable[[Snapshot], int | None]) -> float:
        """Per second of ``count`` (a figure of a snapshot) over the window; 0 when unknown."""
        oldest, newest = self.oldest, self.newest
        if oldest is None or newest is None:
            return 0.0
        return rate(oldest, newest, count(newest), count(oldest))


def end_of(topic: str) -> Callable[[Snapshot], int | None]:
    """A topic's end in a snapshot (for :meth:`History.rate`)."""
    return lambda snapshot: snapshot.ends.get(topic)


def position_of(stage: str) -> Callable[[Snapshot], int | None]:
    """A query's position in a snapshot (for :meth:`History.rate`)."""
    return lambda snapshot: snapshot.positions.get(stage)


def delivered_of(destination: str) -> Callable[[Snapshot], int | None]:
    """A destination's jobs done (neither pending nor retrying) in a snapshot."""

    def done(snapshot: Snapshot) -> int | None:
        entry = snapshot.deliveries.get(destination)
        return None if entry is None else sum(entry.states.values()) - entry.queued

    return done


# -- whether each query has started: the pipeline part's progress file --------------------------


@dataclass(frozen=True)
class Progress:
    """The pipeline part's queries: its pid, when it began, each query's first micro-batch, and
    what each query not yet past its first waits on (``Spark to start``, ``batch 48, run
    again``: :mod:`exactly.up.pipeline`)."""

    pid: int
    began: float
    first_batch: dict[str, float]
    waiting: dict[str, str] = field(default_factory=dict)


def progress_path(data_dir: Path) -> Path:
    return data_dir.resolve() / "up" / "queries.json"


def save_progress(path: Path, progress: Progress) -> None:
    """Replace the progress file atomically (the pipeline part, each second)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(
        json.dumps(
            {
                "pid": progress.pid,
                "began": progress.began,
                "first": progress.first_batch,
                "waiting": progress.waiting,
            }
        )
    )
    staged.replace(path)


def read_progress(path: Path) -> Progress | None:
    try:
        document = json.loads(path.read_text())
        return Progress(
            int(document["pid"]),
            float(document["began"]),
            dict(document["first"]),
            dict(document.get("waiting") or {}),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def starting(
    progress: Progress | None, query: str, now: float, since: float | None, pid: int | None
) -> float | None:
    """Seconds ``query`` has been starting at ``now``; None once its first micro-batch ran.

    ``since`` and ``pid`` are the pipeline part's start (wall clock) and pid as its supervisor
    knows them (None: not known, the progress file alone tells). A progress file of another pid
    is an earlier run's: the part (re)started and the query is starting again.
    """
    current = progress is not None and (pid is None or progress.pid == pid)
    if current and progress is not None and query in progress.first_batch:
        return None
    if since is None:
        if not current or progress is None:
            return None  # nothing says the part is running
        since = progress.began
    return max(0.0, now - since)


def waiting_on(progress: Progress | None, query: str, pid: int | None) -> str | None:
    """What ``query`` waits on while it starts (:func:`starting`), as the pipeline part last
    recorded it; ``pid`` as in :func:`starting`. A progress file of an earlier run: the part
    itself is starting."""
    if progress is None or (pid is not None and progress.pid != pid):
        return "the pipeline part to start"
    if query in progress.first_batch:
        return None
    return progress.waiting.get(query, "Spark to start")


def starting_now(data_dir: Path, now: float | None = None) -> dict[str, tuple[float, str]]:
    """The queries of a running pipeline part (``exactly up``) that have not run a micro-batch
    yet: seconds since the part began and what each waits on (``exactly status``). Empty when no
    part runs: no progress file, or its pid is gone."""
    progress = read_progress(progress_path(data_dir))
    if progress is None:
        return {}
    try:
        os.kill(progress.pid, 0)
    except ProcessLookupError:
        return {}
    except PermissionError:
        pass  # another user's process: it runs
    seconds = max(0.0, (time.time() if now is None else now) - progress.began)
    return {
        query: (seconds, waiting)
        for query, waiting in progress.waiting.items()
        if query not in progress.first_batch
    }
