"""Every hop of one message: accepted, the dedupe verdict, counted, each delivery attempt.

:func:`trace` reads only what is durable, so its answer is right after any crash:

1. **accepted**: the ``raw`` records keyed by the messageId (the collector and the importer key
   every record by it), found by the sqlite log's index by key, in the one partition the id
   hashes to; each copy with its source, ``receivedAt`` and the time the log stored it;
2. **dedupe verdict** per copy, from the outputs of the dedupe job, which name their raw record
   (header ``exactly.source.offset``): *kept* when an ``events`` record comes from it; *rejected*
   when a ``raw.rejected`` record does (with the reason); *duplicate* of the kept copy of the same
   source (scope ``source``) or of any source (``workspace``); *pending* while the dedupe job has
   not reached it;
3. **counted**: per aggregate query, the micro-batch whose marker's end offsets first pass the
   kept record's ``events`` offset (markers keep the last 1,000 batches per query: older ones
   are named "at or before" the oldest kept);
4. **landed** (with a lake table): the table version whose batch's end offsets first pass the
   kept record's ``events`` offset (:meth:`~exactly.lake.base.LakeTable.landed_in`: Delta's
   versions searched by their ``txn`` end offsets, Iceberg's snapshot summaries); PostgreSQL
   keeps no versions, so only whether the table's newest batch passed it. With ``[lake] layout
   = "segment"`` the same for each of Segment's tables the kept event has a row in, named by the
   layout's own rules (:func:`~exactly.lake.segment.tables_of`; ``users`` and ``accounts``
   by the id it merges into): each table commits its batches with their end offsets, and only
   those with rows for it, so the first version passing the offset is the batch that wrote it;
5. **delivered**: each job of the message in the JobDB (index ``jobs_N_message`` of a closed
   dataset; the newest is scanned) with every transition (a batching destination's job: the
   batch it was sent in and the batch's steps, one per attempt, with their status codes); jobs
   of archived datasets from the archive files of the datasets open around the receive time.

Cost: one index lookup per topic and partition, one SQL query per live JobDB dataset, a read of
the aggregate markers: independent of the log's size. A log without an index by key (Kafka) makes
trace say so in one line instead of scanning.
"""

from __future__ import annotations

import calendar
import dataclasses
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from exactly.config import Settings
from exactly.dedupe.recovery import source_offset
from exactly.errors import NotIndexed
from exactly.events.partition import partition_for
from exactly.log import Log, LogRecord, open_log
from exactly.urls import embedded_path

if TYPE_CHECKING:
    from exactly.lake.base import LakeTable

REJECTED_HEADER = "exactly.rejected"  # as the dedupe task writes it (exactly.dedupe.task)
EVENTS = "events"


@dataclass(frozen=True)
class Verdict:
    """What dedupe decided about one raw copy."""

    outcome: str  # kept | duplicate | rejected | pending
    events_offset: int | None = None  # kept: where in events partition ``partition``
    duplicate_of: int | None = None  # duplicate: the raw offset of the kept copy
    reason: str | None = None  # rejected: why; duplicate/pending: what is known


@dataclass(frozen=True)
class Copy:
    """One raw record carrying the message: one per time it was sent and accepted."""

    partition: int
    offset: int
    source: str
    received_at: str | None
    stored_at: int  # ms since the epoch: when the log stored it
    verdict: Verdict


@dataclass(frozen=True)
class Counted:
    """The micro-batch of one aggregate query that counted the kept record."""

    query_id: str
    batch_id: int | None  # None: not counted yet by this query
    committed_at: str | None = None
    exact: bool = True  # False: "at or before" (older markers are pruned)


@dataclass(frozen=True)
class Landed:
    """Where the lake table holds the kept record: the version that landed it."""

    table: str  # its URL, secrets masked
    where: str  # the same for people: an embedded table relative to the data dir
    landed: bool  # False: not landed yet
    version: int | None = None  # None: landed, in a table that keeps no versions
    exact: bool = True  # False: "at or before" (older versions expired)
    name: str = EVENTS  # the table's name in the lake: events, or one of Segment's tables
    key: str | None = None  # users, accounts: the row (user id, group id) it merged into


@dataclass(frozen=True)
class Attempt:
    """One try at delivering: when it started, its outcome, how long the request took."""

    attempt: int
    started: float | None
    finished: float
    state: str
    status_code: int | None
    error: str | None
    latency_ms: float | None
    retry_at: float | None


@dataclass(frozen=True)
class Delivery:
    """One job (a destination's copy of the message) and every attempt at delivering it."""

    destination: str
    job_id: int
    state: str
    created_at: float
    attempts: tuple[Attempt, ...]
    archived: bool = False
    batch: str | None = None  # the batch it was sent in: the attempts are the batch's


@dataclass
class Trace:
    """Everything known about one messageId; ``found`` is False when nothing holds it."""

    message_id: str
    partition: int | None = None
    copies: list[Copy] = field(default_factory=list)
    counted: list[Counted] = field(default_factory=list)
    lake: list[Landed] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return bool(self.copies or self.deliveries)

    def to_json(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "found": self.found,
            "partition": self.partition,
            "copies": [asdict(copy) for copy in self.copies],
            "counted": [asdict(counted) for counted in self.counted],
            "lake": [asdict(landed) for landed in self.lake],
            "deliveries": [asdict(delivery) for delivery in self.deliveries],
            "notes": list(self.notes),
        }


def trace(settings: Settings, message_id: str) -> Trace:
    """Every hop of ``message_id`` (module docstring); raises
    :class:`~exactly.errors.NotIndexed` on a log without an index by key, and the stores' own
    errors when one cannot be read."""
    result = Trace(message_id)
    key = message_id.encode()
    raw = settings.collector.topic
    if _missing(settings.log_url):
        result.notes.append(f"no log at {settings.log_url} yet")
        return result
    kept_events: dict[tuple[int, int], bytes] = {}
    with open_log(settings.log_url, max_record_bytes=settings.log.max_record_bytes) as log:
        if raw not in log.topics():
            result.notes.append(f"no topic {raw!r} in the log yet")
        else:
            kept_events = _accepted(log, raw, key, settings, result)
    kept = [
        (c.partition, c.verdict.events_offset) for c in result.copies if c.verdict.outcome == "kept"
    ]
    if kept:
        _counted(settings, kept, result)
        _landed(settings, kept, result, kept_events)
    _delivered(settings, message_id, result)
    return result


def _accepted(
    log: Log, raw: str, key: bytes, settings: Settings, result: Trace
) -> dict[tuple[int, int], bytes]:
    """The copies of the message with their verdicts, into ``result``; returns the kept
    events' records by (partition, ``events`` offset)."""
    partitions = log.topic_info(raw).partitions
    partition = result.partition = partition_for(key, partitions)
    raws = _find(log, raw, partition, key)
    topics = set(log.topics())
    events = _find(log, EVENTS, partition, key) if EVENTS in topics else []
    rejected_topic = f"{raw}.rejected"
    rejected = _find(log, rejected_topic, partition, key) if rejected_topic in topics else []
    kept_at = {source_offset(r.headers): r.offset for r in events}
    reasons = {source_offset(r.headers): _header(r, REJECTED_HEADER) for r in rejected}
    # a rejected record's raw copy may be unkeyed: it is found through its rejected record
    known = {r.offset for r in raws}
    for offset in sorted(o for o in reasons if o is not None and o not in known):
        raws += next(log.read_range(raw, partition, offset, offset + 1), [])
    raws.sort(key=lambda r: r.offset)
    kept_by_source: dict[str, int] = {}
    sources = {r.offset: _fields(r.value) for r in raws}
    for record in raws:
        if record.offset in kept_at:
            kept_by_source.setdefault(sources[record.offset][0], record.offset)
    progress = _dedupe_progress(log, [EVENTS, rejected_topic], topics, partition)
    workspace = settings.dedupe.scope == "workspace"
    for record in raws:
        source, received = sources[record.offset]
        offset = record.offset
        if offset in kept_at:
            verdict = Verdict("kept", events_offset=kept_at[offset])
        elif offset in reasons:
            verdict = Verdict("rejected", reason=reasons[offset] or "rejected")
        else:
            owner = (
                min(kept_by_source.values(), default=None)
                if workspace
                else kept_by_source.get(source)
            )
            if owner is not None:
                verdict = Verdict("duplicate", duplicate_of=owner)
            elif progress is None or offset > progress:
                verdict = Verdict("pending", reason="dedupe has not reached this record yet")
            else:
                verdict = Verdict(
                    "duplicate", reason="dropped by dedupe; the kept copy is not in events"
                )
        result.copies.append(Copy(partition, offset, source, received, record.timestamp, verdict))
    return {(partition, r.offset): r.value for r in events}


def _find(log: Log, topic: str, partition: int, key: bytes) -> list[LogRecord]:
    found = log.find(topic, partition, key)
    if found is None:
        raise NotIndexed(
            f"trace needs an index by messageId, which the log {log!r} does not keep (only the "
            "sqlite log does): unavailable for this log; trace on a pipeline whose log is sqlite://"
        )
    return found


def _header(record: LogRecord, name: str) -> str | None:
    for header, value in record.headers:
        if header == name:
            return value.decode("utf-8", "replace")
    return None


def _fields(value: bytes) -> tuple[str, str | None]:
    """The record's ``sourceId`` ("" when none, as dedupe reads it) and ``receivedAt``."""
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError:
        return "", None
    if not isinstance(event, dict):
        return "", None
    source, received = event.get("sourceId"), event.get("receivedAt")
    return (
        source if isinstance(source, str) else "",
        received if isinstance(received, str) else None,
    )


def _dedupe_progress(log: Log, outputs: list[str], topics: set[str], partition: int) -> int | None:
    """The newest raw offset dedupe's outputs name in ``partition`` (None: none yet)."""
    from exactly.dedupe.recovery import last_source

    found = [last_source(log, topic, partition) for topic in outputs if topic in topics]
    offsets = [offset for offset in found if offset is not None]
    return max(offsets, default=None)


def _counted(settings: Settings, kept: list[tuple[int, int | None]], result: Trace) -> None:
    from exactly.aggregate import open_db

    if _missing(settings.aggregate_url):
        result.notes.append("no aggregate database yet: nothing counted")
        return
    with open_db(settings.aggregate_url, retry_seconds=0) as db:
        markers = db.markers(EVENTS)
    by_query: dict[str, list[Any]] = {}
    for marker in markers:
        by_query.setdefault(marker.query_id, []).append(marker)
    for partition, offset in kept:
        if offset is None:
            continue
        for query_id, batches in sorted(by_query.items()):
            hit = None
            for index, marker in enumerate(batches):
                ends = marker.end_offsets or {}
                if ends.get(partition, 0) > offset:
                    exact = index > 0 or marker.batch_id == 0
                    hit = Counted(query_id, marker.batch_id, marker.committed_at, exact)
                    break
            result.counted.append(hit or Counted(query_id, None))
    if not by_query:
        result.notes.append("no aggregate query has counted events yet")


def _landed(
    settings: Settings,
    kept: list[tuple[int, int | None]],
    result: Trace,
    events: dict[tuple[int, int], bytes],
) -> None:
    """The lake table's version of each kept record: with a ``[lake] url``, or once the default
    table exists; with the segment layout, each of its tables' too (``events``: the kept
    records, by partition and offset)."""
    from exactly.lake.warehouse import Warehouse

    if not settings.has_lake:
        return
    with Warehouse.open(settings.lake_url) as warehouse:
        existing = set(warehouse.tables()) if settings.lake.layout == "segment" else set()
        for partition, offset in kept:
            if offset is None:
                continue
            result.lake.append(_landing(settings, warehouse.events, partition, offset))
            if settings.lake.layout != "segment":
                continue
            for name, key in _rows_of(events.get((partition, offset))):
                if name in existing:
                    found = _landing(settings, warehouse.table(name), partition, offset)
                    result.lake.append(dataclasses.replace(found, name=name, key=key))
                else:
                    result.notes.append(f"lake: no table {name} (the table limit held it back?)")


def _landing(settings: Settings, table: LakeTable, partition: int, offset: int) -> Landed:
    """Where ``table`` holds the ``events`` record at (``partition``, ``offset``)."""
    from exactly.text import place

    where = place(table.url, settings.data_dir)
    landing = table.landed_in(partition, offset)
    if landing is not None:
        return Landed(table.url, where, True, landing.version, landing.exact, table.name)
    end = table.end_offsets() or {}
    return Landed(table.url, where, end.get(partition, 0) > offset, name=table.name)


def _rows_of(value: bytes | None) -> list[tuple[str, str | None]]:
    """The segment layout's tables an ``events`` record has a row in, as the lake query shapes
    it, each with the merged row's id for ``users`` and ``accounts``."""
    from exactly.lake.segment import MERGED, rows_of

    try:
        event = orjson.loads(value) if value else None
    except orjson.JSONDecodeError:
        return []
    if not isinstance(event, dict):
        return []
    return [(name, key if name in MERGED else None) for name, key in rows_of(event)]


def _delivered(settings: Settings, message_id: str, result: Trace) -> None:
    from exactly.delivery.jobdb import open_jobdb
    from exactly.delivery.jobdb.faces import JobReader

    if _missing(settings.jobdb_url):
        return
    jobdb: JobReader
    with open_jobdb(settings.jobdb_url) as jobdb:
        live = jobdb.jobs_with(message_id)
        for job, transitions in live:
            steps = [asdict(t) for t in transitions]
            # a pack's key is its message id; a batch the director formed is looked up
            batch = job.message_id if job.packed else jobdb.batch_of(job.destination, job.id)
            history = None if batch is None else jobdb.batch_history(batch)
            if history is not None:  # a batch's member: its attempts are the batch's steps
                steps = [asdict(step) for step in history[1]]
            found = _delivery(job.destination, job.id, job.created_at, steps, False)
            result.deliveries.append(dataclasses.replace(found, batch=batch))
    result.deliveries += _archived(settings, message_id, result, {j.id for j, _ in live})


def _archived(settings: Settings, message_id: str, result: Trace, seen: set[int]) -> list[Delivery]:
    """Jobs of ``message_id`` in the archive files of the datasets that were open from an hour
    (one dataset span) before its first receipt to a day after it: not a scan of the archive."""
    from exactly.delivery.archive import open_archive

    received = [c.stored_at / 1000 for c in result.copies]
    if not received or _missing(settings.archive_url):
        return []
    span = settings.delivery.dataset_minutes * 60
    low, high = min(received) - span, max(received) + 86_400
    archive = open_archive(settings.archive_url)
    found = []
    for name in archive.names():
        created = calendar.timegm(time.strptime(name.split("-")[1], "%Y%m%dT%H%M%SZ"))
        if not low <= created <= high:
            continue
        for job in archive.records(name):
            if job["message_id"] == message_id and job["id"] not in seen:
                found.append(
                    dataclasses.replace(
                        _delivery(
                            job["destination"],
                            job["id"],
                            job["created_at"],
                            job["transitions"],
                            True,
                        ),
                        batch=job.get("batch"),  # a pack's member: its pack's key
                    )
                )
    return found


def _delivery(
    destination: str, job_id: int, created: float, steps: list[dict[str, Any]], archived: bool
) -> Delivery:
    """A job's attempts from its transitions: ``executing`` starts one, the next state ends it."""
    attempts: list[Attempt] = []
    started: float | None = None
    state = "awaiting-scheduling"
    for step in steps:
        if step["state"] == "executing":
            started = step["time"]
            state = "executing"
            continue
        if step["state"] in ("archiving", "archived"):
            terminal = ("succeeded", "discarded", "expired", "failed")
            state = step["state"] if state not in terminal else state
            continue
        state = step["state"]
        latency = None if started is None else round((step["time"] - started) * 1000, 1)
        error = step.get("error_type") or None
        if error and step.get("response"):
            error = f"{error}: {step['response']}"
        attempts.append(
            Attempt(
                step["attempt"],
                started,
                step["time"],
                step["state"],
                step.get("status_code"),
                error,
                latency,
                step.get("retry_at"),
            )
        )
        started = None
    if started is not None:  # in flight
        attempts.append(
            Attempt(len(attempts) + 1, started, started, "executing", None, None, None, None)
        )
    return Delivery(destination, job_id, state, created, tuple(attempts), archived)


def _missing(url: str) -> bool:
    """An embedded store (``sqlite://`` or a directory) not created yet: nothing to read."""
    path = embedded_path(url)
    return path is not None and not path.exists()


def render(found: Trace) -> str:
    """The trace as text, each line within 80 columns (long ids and errors are cut)."""
    lines = [_cut(f"message {found.message_id} (raw partition {found.partition})")]
    lines.append(f"accepted {len(found.copies)} time{'s' if len(found.copies) != 1 else ''}")
    for copy in found.copies:
        lines += _copy_lines(copy)
    if found.counted:
        lines.append("counted")
        for counted in found.counted:
            if counted.batch_id is None:
                lines.append(f"  query {_short(counted.query_id)}: not counted yet")
            else:
                at = "" if counted.exact else "at or before "
                lines.append(
                    _cut(f"  {at}batch {counted.batch_id} of query {_short(counted.query_id)}")
                )
                lines.append(_cut(f"    committed {counted.committed_at}"))
    for landed in found.lake:
        if landed.name == EVENTS:
            lines.append(_cut(f"lake {landed.where}"))
            head = "  "
        else:
            row = "" if landed.key is None else f" (row {landed.key})"
            head = f"  {landed.name}{row}: "
        if not landed.landed:
            lines.append(_cut(f"{head}not landed yet"))
        elif landed.version is None:
            lines.append(_cut(f"{head}landed (the table keeps no versions)"))
        else:
            at = "" if landed.exact else "at or before "
            lines.append(_cut(f"{head}{at}version {landed.version}"))
    lines.append(
        f"delivered: {len(found.deliveries)} job(s)" if found.deliveries else "delivered: no jobs"
    )
    for delivery in found.deliveries:
        lines += _delivery_lines(delivery)
    lines += [_cut(f"note: {note}") for note in found.notes]
    return "\n".join(lines)


def _copy_lines(copy: Copy) -> list[str]:
    verdict = copy.verdict
    source = copy.source or "(no source)"
    lines = [
        _cut(
            f"  raw {copy.partition}:{copy.offset}  source {source}  received "
            f"{copy.received_at or '?'}"
        ),
    ]
    if verdict.outcome == "kept":
        text = f"kept -> events {copy.partition}:{verdict.events_offset}"
    elif verdict.outcome == "duplicate" and verdict.duplicate_of is not None:
        text = f"duplicate of raw {copy.partition}:{verdict.duplicate_of}"
    else:
        text = f"{verdict.outcome}: {verdict.reason}"
    lines.append(_cut(f"    dedupe: {text}"))
    return lines


def _delivery_lines(delivery: Delivery) -> list[str]:
    where = " (archived)" if delivery.archived else ""
    lines = [_cut(f"  {delivery.destination}: {delivery.state}, job {delivery.job_id}{where}")]
    if delivery.batch is not None:
        lines.append(_cut(f"    in batch {delivery.batch}"))
    for attempt in delivery.attempts:
        status = "" if attempt.status_code is None else f" {attempt.status_code}"
        latency = "" if attempt.latency_ms is None else f" {attempt.latency_ms:.0f} ms"
        error = "" if not attempt.error else f" {' '.join(attempt.error.split())}"
        lines.append(
            _cut(
                f"    #{attempt.attempt} {_when(attempt.started or attempt.finished)} "
                f"{attempt.state}{status}{latency}{error}"
            )
        )
    return lines


def _when(seconds: float) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        + f".{int(seconds * 1000) % 1000:03d}Z"
    )


def _short(text: str) -> str:
    return text if len(text) <= 36 else text[:35] + "…"


def _cut(line: str) -> str:
    return line if len(line) <= 80 else line[:79] + "…"


__all__ = ["Trace", "render", "trace"]
