"""What the console shows: one JSON-ready document of the whole pipeline, read from the outside.

A :class:`Reader` builds the document ``/api/state`` answers (docs/up.md lists its fields). Like
``exactly up``'s terminal view it asks no part anything; every figure is read where its writer
keeps it durable, so it is right after any crash:

* totals, each stage's position, rate and lag: :mod:`exactly.up.watch` (the log's end offsets,
  each query's committed checkpoint, the JobDB's summary per destination); duplicates dropped
  are the raw records dedupe committed less those it kept or rejected (``exactly status``'s
  arithmetic, over all partitions);
* each part's state, restarts and last words: the supervisor's :class:`Running` entries, read
  without touching their processes (no ``poll()`` from this thread);
* the dedupe store, its configured and effective window: the status file the dedupe query
  writes after each micro-batch (:mod:`exactly.dedupe.status`);
* counted events and the latest counts per minute: the aggregate database's ``event_counts``
  (:mod:`exactly.aggregate.stats`);
* whether each query has started (its first micro-batch ran): the pipeline part's progress file
  (:func:`exactly.up.watch.starting`);
* end-to-end latency, accepted → counted and → delivered, p50/p99 over the last minute: the
  aggregate markers against the log times of what they counted, and the JobDB's newest
  successes against their events' ``receivedAt`` (:class:`Latencies`);
* the lake (with a lake table): what ``exactly status`` shows of it (:mod:`exactly.lake.status`),
  with the segment layout each table's version, rows, lag behind ``events`` and ``_rejected``
  values per column; read at most every :data:`LAKE_EVERY` seconds and at most
  :data:`LAKE_SHARE` of the time (it reads each table's ``_rejected`` column), its ``read_at``
  saying when.

A source that cannot be read (a database down) leaves its part of the document empty and adds a
line to ``problems``; the rest is still shown. A reader is used from one thread at a time (it
keeps the log and the aggregate database open between calls).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.config import Settings
from exactly.errors import ExactlyError
from exactly.up import watch

if TYPE_CHECKING:
    from exactly.aggregate.base import AggregateDB
    from exactly.delivery.jobdb.base import Summary
    from exactly.log import Log
    from exactly.up.supervisor import Running, Supervisor

CHART_MINUTES = 30  # minutes of counts in the chart
CHART_SERIES = 5  # event names drawn apart; the rest are summed as "other"
FRESH = 0.9  # seconds a document is served again instead of reading anew
LATENCY_SPAN = 60.0  # seconds of latencies the percentiles are over
LATENCY_SAMPLES = 8  # events read per partition of each counted micro-batch
LATENCY_DELIVERIES = 500  # newest successful deliveries read per call
LAKE_EVERY = 15.0  # seconds a reading of the lake is shown again instead of reading anew
LAKE_SHARE = 0.1  # at most this share of the time reading it (300 Iceberg tables: ~15 s a read)

# the part each stage runs in
PART_OF = {"collector": "collector", "dedupe": "pipeline", "aggregate": "pipeline"}
PART_OF |= {"route": "pipeline", "lake": "pipeline", "director": "director"}


class ArchivedDeliveries:
    """Jobs that succeeded per destination in the archive: a dataset's jobs leave the JobDB's
    counts when it is archived and dropped, so delivered = live succeeded + archived succeeded.

    Archive files never change once written, so each is read once; at most ``budget`` seconds
    of reading per call, so a long archive is caught up over several calls (``pending`` files).
    """

    def __init__(self, url: str, budget: float = 0.5) -> None:
        self.url = url
        self.budget = budget
        self.read: dict[str, Counter[str]] = {}
        self.pending = 0

    def succeeded(self) -> Counter[str]:
        from exactly.delivery.archive import open_archive
        from exactly.delivery.jobdb.base import SUCCEEDED
        from exactly.delivery.replay import outcome

        archive = open_archive(self.url)
        names = [name for name in archive.names() if name not in self.read]
        deadline = time.monotonic() + self.budget
        for i, name in enumerate(names):
            if time.monotonic() > deadline:
                self.pending = len(names) - i
                break
            self.read[name] = Counter(
                str(record["destination"])
                for record in archive.records(name)
                if outcome(record.get("transitions", [])) == SUCCEEDED
            )
        else:
            self.pending = 0
        total: Counter[str] = Counter()
        for counts in self.read.values():
            total.update(counts)
        return total


@dataclass
class Reading:
    """A document and the snapshot it was made from (the next one's rates start there)."""

    snapshot: watch.Snapshot
    document: dict[str, Any]


class Reader:
    """Reads the pipeline's state for the console; see the module docstring."""

    def __init__(self, settings: Settings, supervisor: Supervisor | None = None) -> None:
        self.settings = settings
        self.supervisor = supervisor
        self.stages = watch.stages(settings)
        self.last: Reading | None = None
        self.history = watch.History()
        self.latencies = Latencies()
        self._log: Log | None = None
        self._aggregates: AggregateDB | None = None
        self._jobdb = watch.JobDBReader(settings)
        self.archived = ArchivedDeliveries(settings.archive_url)
        self._lake: tuple[float, dict[str, Any] | None] | None = None  # (next read, entry)

    def close(self) -> None:
        for resource in (self._log, self._aggregates):
            if resource is not None:
                with contextlib.suppress(Exception):
                    resource.close()
        self._log = self._aggregates = None
        self._jobdb.close()

    def state(self) -> dict[str, Any]:
        """The document now (or the one read less than :data:`FRESH` seconds ago)."""
        if self.last is not None and time.time() - self.last.snapshot.at < FRESH:
            return self.last.document
        problems: list[str] = []
        snapshot = self._snapshot(problems)
        self.history.add(snapshot)
        document = self._document(snapshot, problems)
        self.last = Reading(snapshot, document)
        return document

    # -- reading --------------------------------------------------------------------------------

    def _snapshot(self, problems: list[str]) -> watch.Snapshot:
        try:
            if self._log is None:
                from exactly.log import open_log

                self._log = open_log(
                    self.settings.log_url, max_record_bytes=self.settings.log.max_record_bytes
                )
            return watch.take(self.settings, self._log, self.stages, self._jobdb)
        except (ExactlyError, OSError) as error:
            problems.append(f"log: {error}")
            self.close()
            return watch.Snapshot(time.time())

    def _document(self, now: watch.Snapshot, problems: list[str]) -> dict[str, Any]:
        counted, chart = self._counts(problems)
        archived = self._archived(problems)
        destinations = [
            destination_entry(entry, archived.get(name, 0))
            for name, entry in sorted(now.deliveries.items())
        ]
        parts = self.parts()
        stages = stage_entries(
            self.stages, self.history, destinations, self.starting, self.waiting_on
        )
        return {
            "at": now.at,
            "totals": totals(now, counted, archived),
            "latency": self._latency(now.at, problems),
            "parts": parts,
            "stages": with_parts(stages, parts),
            "dedupe": self._dedupe(now, problems),
            "destinations": destinations,
            "counts": chart,
            "lake": self._lake_entry(problems),
            "problems": problems,
        }

    def starting(self, query: str) -> float | None:
        """Seconds ``query`` has been starting (:func:`exactly.up.watch.starting`)."""
        now = self.history.newest
        if now is None:
            return None
        since = pid = None
        if self.supervisor is not None:
            pipeline = next((r for r in self.supervisor.parts if r.part.name == "pipeline"), None)
            process = None if pipeline is None else pipeline.process
            if pipeline is not None and (process is None or process.returncode is not None):
                return None  # not running: its state says so
            if pipeline is not None and process is not None:
                since, pid = time.time() - (time.monotonic() - pipeline.started), process.pid
        return watch.starting(now.progress, query, now.at, since, pid)

    def waiting_on(self, query: str) -> str | None:
        """What ``query`` waits on while it starts (:func:`exactly.up.watch.waiting_on`)."""
        now = self.history.newest
        if now is None or self.starting(query) is None:
            return None
        pipeline = None
        if self.supervisor is not None:
            pipeline = next((r for r in self.supervisor.parts if r.part.name == "pipeline"), None)
        process = None if pipeline is None else pipeline.process
        return watch.waiting_on(now.progress, query, None if process is None else process.pid)

    def _latency(self, now: float, problems: list[str]) -> dict[str, Any]:
        """accepted → counted and → delivered over the last minute (:class:`Latencies`)."""
        counted: list[tuple[float, float]] = []
        delivered: list[tuple[float, float]] = []
        try:
            if self._aggregates is not None and self._log is not None:
                counted = self.latencies.counted(self._log, self._aggregates, now)
        except Exception as error:  # noqa: BLE001 - a client library's own: say it, show the rest
            problems.append(f"latency to counted: {type(error).__name__}: {error}")
        if self.settings.destinations:
            try:
                delivered = delivered_latencies(self.settings, now)
            except Exception as error:  # noqa: BLE001 - as above
                problems.append(f"latency to delivered: {type(error).__name__}: {error}")
        return {"counted": percentiles(counted), "delivered": percentiles(delivered)}

    def parts(self) -> list[dict[str, Any]]:
        """Each part: its state, pid, restarts, time up and, once it died, its last words."""
        if self.supervisor is None:
            return []
        stopping, now = self.supervisor.stopping_since is not None, time.monotonic()
        return [part_entry(running, stopping, now) for running in self.supervisor.parts]

    def _archived(self, problems: list[str]) -> Counter[str]:
        """Succeeded jobs per destination in the archive (none without destinations)."""
        if not self.settings.destinations:
            return Counter()
        try:
            found = self.archived.succeeded()
        except Exception as error:  # noqa: BLE001 - an S3 client's own: say it, show the rest
            from exactly.urls import redact

            problems.append(f"archive {redact(self.settings.archive_url)}: {error}")
            found = Counter()
            for counts in self.archived.read.values():
                found.update(counts)
        if self.archived.pending:
            problems.append(
                f"archive: {self.archived.pending} files not read yet: delivered counts them soon"
            )
        return found

    def _dedupe(self, now: watch.Snapshot, problems: list[str]) -> dict[str, Any]:
        from exactly.dedupe.status import status_path
        from exactly.stages import DEDUPE

        plan = DEDUPE.plan(self.settings)
        entry: dict[str, Any] = {
            "store": plan.store_kind,
            "scope": plan.scope,
            "window_ms": plan.window,
            "duplicates": duplicates(now),
        }
        path = status_path(self.settings.data_dir, plan.source)
        try:
            entry |= saved_window(path, plan.window)
        except FileNotFoundError:
            entry |= {"effective_window_ms": plan.window, "aged_out": False, "keys": None}
            entry |= {"warnings": [], "updated_at": None}
        except (OSError, ValueError, KeyError, TypeError) as error:
            problems.append(f"dedupe status {path}: {error}")
        return entry

    def _lake_entry(self, problems: list[str]) -> dict[str, Any] | None:
        """The lake as ``exactly status`` reads it (None without one), read anew at most every
        :data:`LAKE_EVERY` seconds, and so that reading takes at most :data:`LAKE_SHARE` of the
        time; a lake that cannot be read keeps the last reading."""
        now = time.time()
        if self._lake is not None and now < self._lake[0]:
            return self._lake[1]
        if not self.settings.has_lake:
            return None
        try:
            from exactly.lake.status import read

            found = read(self.settings)
            entry = None if found is None else {**dataclasses.asdict(found), "read_at": now}
        except Exception as error:  # noqa: BLE001 - a client library's own: say it, show the rest
            from exactly.urls import redact

            problems.append(
                f"lake {redact(self.settings.lake_url)}: {type(error).__name__}: {error}"
            )
            entry = None if self._lake is None else self._lake[1]  # tried again in a while
        took = time.time() - now
        self._lake = (now + max(LAKE_EVERY, took / LAKE_SHARE), entry)
        return entry

    def _counts(self, problems: list[str]) -> tuple[int | None, dict[str, Any]]:
        """Events counted so far and the newest minutes' counts, from ``event_counts``."""
        chart: dict[str, Any] = {"by": "minute", "minutes": [], "series": {}}
        url = self.settings.aggregate_url
        try:
            if self._aggregates is None:
                if url.lower().startswith("sqlite:"):
                    from exactly.aggregate.sqlite import sqlite_path

                    if not sqlite_path(url).exists():  # not created just by looking
                        return None, chart
                from exactly.aggregate import open_db

                self._aggregates = open_db(url, retry_seconds=0)
            return read_counts(self._aggregates)
        except Exception as error:  # noqa: BLE001 - a client library's own: say it, show the rest
            from exactly.urls import redact

            problems.append(f"aggregate {redact(url)}: {type(error).__name__}: {error}")
            if self._aggregates is not None:
                with contextlib.suppress(Exception):
                    self._aggregates.close()
            self._aggregates = None
            return None, chart


# -- the document's parts, from what was read (pure) -------------------------------------------


def totals(
    now: watch.Snapshot, counted: int | None, archived: Counter[str] | None = None
) -> dict[str, Any]:
    """The totals; delivered per destination: succeeded in the JobDB and in the archive."""
    from exactly.delivery.jobdb.base import SUCCEEDED

    archived = archived or Counter()
    return {
        "accepted": now.ends.get(watch.RAW),
        "kept": now.ends.get(watch.EVENTS),
        "duplicates": duplicates(now),
        "rejected": now.ends.get(f"{watch.RAW}.rejected", 0 if watch.RAW in now.ends else None),
        "suppressed": now.ends.get(f"{watch.RAW}.suppressed", 0 if watch.RAW in now.ends else None),
        "counted": counted,
        "delivered": {
            name: entry.states.get(SUCCEEDED, 0) + archived.get(name, 0)
            for name, entry in sorted(now.deliveries.items())
        },
    }


def duplicates(now: watch.Snapshot) -> int | None:
    """Raw records dedupe committed less those it kept, rejected or suppressed (None before it
    committed).

    The outputs are written before Spark commits a batch, so for a moment they can be ahead of
    the committed position: never below zero.
    """
    committed = now.positions.get("dedupe")
    if committed is None:
        return None
    kept = now.ends.get(watch.EVENTS, 0)
    rejected = now.ends.get(f"{watch.RAW}.rejected", 0)
    suppressed = now.ends.get(f"{watch.RAW}.suppressed", 0)
    return max(0, committed - kept - rejected - suppressed)


def part_entry(running: Running, stopping: bool, now: float) -> dict[str, Any]:
    process = running.process
    alive = process is not None and process.returncode is None
    if alive:
        state = "stopping" if stopping else "running"
    elif stopping:
        state = "stopped"
    elif running.starts == 0:
        state = "starting"
    else:
        state = "restarting"
    return {
        "name": running.part.name,
        "state": state,
        "pid": process.pid if alive and process is not None else None,
        "restarts": max(0, running.starts - 1),
        "up_seconds": round(now - running.started, 1) if alive else None,
        "restart_in_seconds": (
            round(max(0.0, running.restart_at - now), 1) if state == "restarting" else None
        ),
        "last_exit": running.last_exit,
        "last_words": running.last_words,
    }


def stage_entries(
    stages: list[watch.Stage],
    history: watch.History,
    destinations: list[dict[str, Any]],
    starting: Callable[[str], float | None] = lambda _: None,
    waiting_on: Callable[[str], str | None] = lambda _: None,
) -> list[dict[str, Any]]:
    """The collector, each query and the director: records done, per second (over
    :data:`~exactly.up.watch.RATE_WINDOW`), lag (records); a query whose first micro-batch has
    not run yet has ``starting_seconds``, what it waits on (``waiting_on``) and no rate."""
    now = history.newest
    if now is None:
        return []
    found = [
        {
            "name": "collector",
            "part": "collector",
            "reads": None,
            "done": now.ends.get(watch.RAW),
            "per_second": round(history.rate(watch.end_of(watch.RAW)), 1),
            "lag": None,
            "starting_seconds": None,
        }
    ]
    for stage in stages:
        waited = starting(stage.name)
        rate = history.rate(watch.position_of(stage.name))
        found.append(
            {
                "name": stage.name,
                "part": PART_OF.get(stage.name, "pipeline"),
                "reads": stage.topic,
                "done": now.positions.get(stage.name),
                "per_second": None if waited is not None else round(rate, 1),
                "lag": now.lag(stage),
                "starting_seconds": None if waited is None else round(waited),
                "waiting_on": None if waited is None else waiting_on(stage.name),
            }
        )
    if now.deliveries or destinations:
        found.append(
            {
                "name": "director",
                "part": "director",
                "reads": "jobdb",
                "done": sum(d["succeeded"] for d in destinations),
                "per_second": round(sum(d["per_second"] for d in destinations), 1),
                "lag": sum(d["queued"] for d in destinations),
                "starting_seconds": None,
            }
        )
    return found


def with_parts(stages: list[dict[str, Any]], parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each stage with its part's state, restarts and last words (the errors a stage shows)."""
    by_name = {part["name"]: part for part in parts}
    for stage in stages:
        part = by_name.get(stage["part"], {})
        stage["state"] = part.get("state")
        if stage.get("starting_seconds") is not None and part.get("state") == "running":
            stage["state"] = f"starting ({stage['starting_seconds']} s)"
            if stage.get("waiting_on"):
                stage["state"] += f", on {stage['waiting_on']}"
        stage["restarts"] = part.get("restarts")
        stage["last_words"] = part.get("last_words") or None
    return stages


def destination_entry(entry: Summary, archived: int = 0) -> dict[str, Any]:
    """One destination from its JobDB :class:`~exactly.delivery.jobdb.base.Summary` and the jobs
    that succeeded in its archived datasets."""
    from exactly.delivery.jobdb.base import (
        AWAITING_RETRY,
        DISCARDED,
        EXPIRED,
        FAILED,
        SUCCEEDED,
    )
    from exactly.delivery.status import not_sent

    states = entry.states
    age = entry.oldest_pending_seconds
    return {
        "name": entry.destination,
        "queued": entry.queued,
        "retrying": states.get(AWAITING_RETRY, 0),
        "succeeded": states.get(SUCCEEDED, 0) + archived,
        "discarded": states.get(DISCARDED, 0),
        "expired": states.get(EXPIRED, 0),
        "failed": states.get(FAILED, 0),  # its transform failed on the event
        "filtered": entry.withheld.filtered,
        "skipped": entry.withheld.skipped,  # by the event's integrations object
        "dropped": entry.withheld.dropped,  # its transform returned None
        "not_sent": not_sent(entry),  # the four above, in words
        "oldest_queued_seconds": None if age is None else round(age, 1),
        "per_second": round(entry.rate_per_second, 1),
        "last_error": entry.last_error,
        "last_error_at": entry.last_error_at,
        "sending": entry.sending,
    }


def saved_window(path: Path, configured: int) -> dict[str, Any]:
    """The effective window and the store's keys from the dedupe status file at ``path``
    (:attr:`~exactly.dedupe.status.DedupeStatus.effective_window`, as ``exactly status`` and
    ``exactly up`` show it)."""
    from exactly.dedupe.status import read_saved
    from exactly.dedupe.window import shortest_window

    saved = read_saved(json.loads(path.read_text()))
    keys = [p.keys for p in saved.partitions if p.keys is not None]
    return {
        "effective_window_ms": shortest_window(configured, [p.window for p in saved.partitions]),
        "aged_out": any(p.window is not None for p in saved.partitions),
        "keys": sum(keys) if keys else None,
        "warnings": saved.warnings(),
        "updated_at": saved.at / 1000 if saved.at else None,
    }


def read_counts(db: AggregateDB) -> tuple[int | None, dict[str, Any]]:
    """(events counted, the chart of the newest minutes) from ``event_counts``."""
    from exactly.aggregate.base import quote
    from exactly.aggregate.spec import EVENT_COUNTS
    from exactly.aggregate.stats import StatsQuery, event_counts

    if EVENT_COUNTS.name not in db.tables():
        return None, chart_of([])
    rows = db.query(f"SELECT SUM({quote('count')}) FROM {EVENT_COUNTS.name}")
    counted = int(rows[0][0] or 0) if rows else 0
    newest = event_counts(db, StatsQuery(by="minute", limit=CHART_MINUTES * 100))
    return counted, chart_of([(str(r[0]), str(r[3] or r[2]), int(r[4] or 0)) for r in newest])


def chart_of(rows: list[tuple[str, str, int]]) -> dict[str, Any]:
    """(minute, event name, count) rows as the chart's series: the newest :data:`CHART_MINUTES`
    minutes (gaps as zeros), one series per busiest event name, the rest as ``other``."""
    by_minute: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for minute, name, count in rows:
        by_minute[minute][name] += count
    minutes = _minutes(sorted(by_minute))
    totals_by_name: dict[str, int] = defaultdict(int)
    for minute in minutes:
        for name, count in by_minute.get(minute, {}).items():
            totals_by_name[name] += count
    named = sorted(totals_by_name, key=lambda name: (-totals_by_name[name], name))
    shown = named[:CHART_SERIES] if len(named) <= CHART_SERIES else named[: CHART_SERIES - 1]
    series = {name: [by_minute.get(m, {}).get(name, 0) for m in minutes] for name in shown}
    rest = [name for name in named if name not in shown]
    if rest:
        series["other"] = [sum(by_minute.get(m, {}).get(n, 0) for n in rest) for m in minutes]
    return {"by": "minute", "minutes": minutes, "series": series}


def _minutes(present: list[str]) -> list[str]:
    """The newest :data:`CHART_MINUTES` minutes up to the newest present, gaps filled."""
    if not present:
        return []
    try:
        newest = datetime.fromisoformat(present[-1])
    except ValueError:
        return present[-CHART_MINUTES:]
    first = newest - timedelta(minutes=CHART_MINUTES - 1)
    try:
        oldest = max(first, datetime.fromisoformat(present[0]))
    except ValueError:
        oldest = first
    found = []
    moment = oldest
    while moment <= newest:
        found.append(moment.strftime("%Y-%m-%d %H:%M:%S"))
        moment += timedelta(minutes=1)
    return found


# -- end-to-end latency ---------------------------------------------------------------------------


class Latencies:
    """accepted → counted from what is durable: each aggregate marker (its micro-batch's end
    offsets in ``events`` and commit time) against the log times of the ``events`` records it
    counted, which are their ``raw`` records' (the collector's accept time, kept by dedupe).

    A micro-batch is read once, :data:`LATENCY_SAMPLES` records per partition evenly over its
    range, each weighed by the records it stands for; so a call reads only the batches committed
    since the last one (a few small reads), whatever the rate.
    """

    def __init__(self, span: float = LATENCY_SPAN) -> None:
        self.span = span
        self.batches: dict[tuple[str, int], tuple[float, list[tuple[float, float]]]] = {}

    def counted(self, log: Log, db: AggregateDB, now: float) -> list[tuple[float, float]]:
        """(latency in ms, weight) of the events counted in the last :attr:`span` seconds."""
        from exactly.aggregate.commit import CommitProtocol

        if not isinstance(db, CommitProtocol):
            return []
        markers = sorted(db.markers(watch.EVENTS), key=lambda m: (m.query_id, m.batch_id))
        for before, marker in itertools.pairwise(markers):
            key = (marker.query_id, marker.batch_id)
            if before.query_id != marker.query_id or key in self.batches:
                continue
            committed = _seconds(marker.committed_at)
            if committed is None or now - committed > self.span:
                continue
            samples = []
            for partition, end in (marker.end_offsets or {}).items():
                start = (before.end_offsets or {}).get(partition, 0)
                samples += _sampled(log, partition, start, end, committed)
            self.batches[key] = (committed, samples)
        for key, (committed, _) in list(self.batches.items()):
            if now - committed > self.span:
                del self.batches[key]
        return [sample for _, samples in self.batches.values() for sample in samples]


def _sampled(
    log: Log, partition: int, start: int, end: int, committed: float
) -> list[tuple[float, float]]:
    count = end - start
    if count <= 0:
        return []
    picks = min(count, LATENCY_SAMPLES)
    found = []
    for i in range(picks):
        records = log.read(
            watch.EVENTS, partition, start + i * count // picks, max_records=1, headers=False
        )
        if records:
            found.append((max(0.0, committed * 1000 - records[0].timestamp), count / picks))
    return found


def delivered_latencies(settings: Settings, now: float) -> list[tuple[float, float]]:
    """(latency in ms, 1) from receivedAt to success of the newest deliveries in the last
    :data:`LATENCY_SPAN` seconds (at most :data:`LATENCY_DELIVERIES` of them)."""
    import orjson

    from exactly.delivery.jobdb import open_jobdb
    from exactly.delivery.jobdb.faces import JobReader

    jobdb: JobReader
    with open_jobdb(settings.jobdb_url) as jobdb:
        recent = jobdb.recent_successes(now - LATENCY_SPAN, LATENCY_DELIVERIES)
    found = []
    for succeeded, payload in recent:
        try:
            received = _seconds(str(orjson.loads(payload).get("receivedAt")))
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if received is not None:
            found.append((max(0.0, (succeeded - received) * 1000), 1.0))
    return found


def percentiles(samples: list[tuple[float, float]]) -> dict[str, Any]:
    """p50 and p99 (ms) of weighted samples; None of each when there are none."""
    total = sum(weight for _, weight in samples)
    found: dict[str, Any] = {"p50_ms": None, "p99_ms": None, "events": round(total)}
    if not samples:
        return found
    ordered = sorted(samples)
    for name, share in (("p50_ms", 0.5), ("p99_ms", 0.99)):
        seen = 0.0
        for latency, weight in ordered:
            seen += weight
            if seen >= share * total:
                found[name] = round(latency)
                break
    return found


def _seconds(text: str) -> float | None:
    """An ISO 8601 time (``...Z`` or with an offset; UTC when it has none) in epoch seconds."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
