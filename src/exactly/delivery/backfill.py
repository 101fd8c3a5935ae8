"""``exactly backfill``: the events already in ``events`` to one destination, each once.

A destination added today gets the live route's events from when the route started with it
(its open *route span*, :meth:`~exactly.delivery.jobdb.faces.RouterJobs.open_routes`). Backfill
routes it what came before: the events of the topic below that span whose ``receivedAt`` lies
in ``[since, until)``, through its ``filter``, ``integrations`` rule and ``transform`` (the
route's own code, :func:`~exactly.delivery.route.collect_jobs`), as Spark batch reads of
about 50,000 records. A run:

1. waits (``wait_seconds``) for the destination's open route span: the live route owns every
   offset from there on, so backfill stays strictly below it;
2. takes the destination's backfill lock (one run at a time; released when its holder dies);
3. reads what the log holds (:meth:`~exactly.log.base.Log.start_offsets`) and refuses a window
   older than that, saying what it holds;
4. reads the offsets below the route span in chunks, skipping what an earlier span covers:
   wholly (a closed route span, or a backfill whose window holds this one's) by not reading
   it, partly (a backfill of another window) event by event;
5. commits each chunk's jobs, its counts and this run's *backfill span* (the offsets read so
   far, with the window) in one JobDB transaction.

So each (destination, event) gets one job however often backfill runs, is killed, or overlaps
the live route: a killed run's rerun skips what it committed, and no other destination is in
its plan. The events of ``events`` are one per messageId within dedupe's window, so one per
offset is one per message.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import orjson

from exactly.delivery.choosing import Choosing
from exactly.delivery.jobdb.base import BACKFILL, ROUTE, NewJob, RouteCounts, Span
from exactly.delivery.jobdb.faces import BackfillJobs
from exactly.delivery.patience import Patience, patiently
from exactly.delivery.route import collect_jobs
from exactly.delivery.settings import ROUTE_RECORDS_PER_TRIGGER, DestinationSettings
from exactly.errors import ConfigError, StreamError
from exactly.forget.readers import Following, kept
from exactly.text import message

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from exactly.config import Settings
    from exactly.log import Log

Say = Callable[[str], None]
Ranges = dict[int, tuple[int, int]]  # partition -> [first offset, end)


@dataclass(frozen=True)
class BackfillPlan:
    """One run of ``exactly backfill``, resolved from settings and flags."""

    log_url: str = field(repr=False)  # may hold secrets: never in a repr
    destination: DestinationSettings
    since_ms: int | None = None  # receivedAt window [since, until); None: unbounded
    until_ms: int | None = None
    topic: str = "events"
    chunk_records: int = ROUTE_RECORDS_PER_TRIGGER
    wait_seconds: float = 60.0  # for the live route to start routing the destination
    allow_unordered: bool = False
    jobdb_patience: float = 60.0
    read_records: int = 10_000
    forget_key: bytes | None = field(default=None, repr=False)  # whom readers skip, when set

    def __post_init__(self) -> None:
        if (
            self.since_ms is not None
            and self.until_ms is not None
            and self.until_ms <= self.since_ms
        ):
            raise ConfigError("--until must be after --since")


@dataclass
class Backfilled:
    """What a run did."""

    run: str
    destination: str
    to_read: int = 0  # records below the route span not covered wholly before
    read: int = 0
    events: int = 0  # read, in the window, and not routed to the destination before
    jobs: int = 0
    chunks: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        rate = self.read / self.seconds if self.seconds > 0 else 0.0
        if not self.to_read:
            return f"backfill {self.destination}: nothing to do, every event is routed to it"
        return (
            f"backfill {self.destination}: {self.jobs:,} jobs for {self.events:,} events, "
            f"{self.read:,} records read in {clock(self.seconds)} ({rate:,.0f} records/s)"
        )


def configured_plan(
    settings: Settings,
    name: str,
    *,
    since: float | None = None,
    until: float | None = None,
    topic: str = "events",
    chunk_records: int = ROUTE_RECORDS_PER_TRIGGER,
    wait_seconds: float = 60.0,
    allow_unordered: bool = False,
) -> BackfillPlan:
    """The plan of ``exactly backfill NAME``: the destination must be configured."""
    from exactly.forget.regulations import load_key

    known = {destination.name: destination for destination in settings.destinations}
    if name not in known:
        raise ConfigError(
            f"{name!r} is not in [[destinations]] "
            f"(configured: {', '.join(sorted(known)) or 'none'})"
        )
    return BackfillPlan(
        log_url=settings.log_url,
        destination=known[name],
        since_ms=None if since is None else int(since * 1000),
        until_ms=None if until is None else int(until * 1000),
        topic=topic,
        chunk_records=chunk_records,
        wait_seconds=wait_seconds,
        allow_unordered=allow_unordered,
        jobdb_patience=settings.delivery.jobdb_patience,
        forget_key=load_key(settings.data_dir),
    )


def drive(
    spark: SparkSession,
    plan: BackfillPlan,
    jobdb: BackfillJobs,
    log: Log,
    *,
    say: Say | None = None,
    run: str | None = None,
) -> Backfilled:
    """Steps 1 to 5 of the module docstring; progress goes to ``say``, the outcome is
    returned (:meth:`Backfilled.line`). ``run`` names the run (its span and the markers of its
    chunks, ``backfill:DEST:RUN``); default: the time it starts, in ms."""
    tell = say or say_line
    name = plan.destination.name
    if plan.destination.ordered and not plan.allow_unordered:
        raise ConfigError(
            f"{name} delivers each user's events in order, and backfilled events would "
            "reach it after newer ones; pass --allow-unordered to send them anyway"
        )
    log.topic_info(plan.topic)  # a missing topic fails here, in one line
    started = time.monotonic()
    # 1. the live route's span: everything from there on is the route's
    routes = _routes(jobdb, plan, tell)
    # 2. one run per destination at a time
    with jobdb.replay_lock(name, kind=BACKFILL):
        # 3. what the log holds
        starts = log.start_offsets(plan.topic)
        check_window(plan, held_since(log, plan.topic, starts))
        # 4. and 5.
        run = run or str(int(time.time() * 1000))
        done = Backfilled(run=run, destination=name)
        spans = jobdb.spans(name, plan.topic)
        todo = remaining(starts, routes, spans, plan.since_ms, plan.until_ms)
        done.to_read = sum(end - first for first, end in _flatten(todo))
        if done.to_read:
            tell(
                f"backfill {name}: {done.to_read:,} records of {plan.topic} to read, "
                f"below where the route started with it"
            )
            _chunks(spark, plan, jobdb, run, starts, todo, spans, done, tell)
    done.seconds = time.monotonic() - started
    return done


def _routes(jobdb: BackfillJobs, plan: BackfillPlan, say: Say) -> list[Span]:
    """The destination's open route spans: where the live route started with it (step 1)."""
    name = plan.destination.name
    deadline = time.monotonic() + plan.wait_seconds
    told = False
    while True:
        spans = jobdb.spans(name, plan.topic)
        routes = [span for span in spans if span.kind == ROUTE and span.end is None]
        if routes:
            return routes
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"{name} is not routed yet: start `exactly route` or `exactly up` with it in "
                "[[destinations]] first (backfill sends what came before the route started)"
            )
        if not told:
            say(
                f"backfill {name}: waiting up to {plan.wait_seconds:g} s for the route query to "
                "start routing it"
            )
            told = True
        time.sleep(1.0)


def held_since(log: Log, topic: str, starts: Mapping[int, int]) -> tuple[int, str] | None:
    """When the log's oldest events were received, if retention removed any: the latest
    ``receivedAt`` (ms) among the first records of the partitions that lost some, and which
    partitions start where. None: the log holds every event it ever took."""
    trimmed = {p: start for p, start in sorted(starts.items()) if start > 0}
    if not trimmed:
        return None
    latest = 0
    for partition, start in trimmed.items():
        records = log.read(topic, partition, start, max_records=1, headers=False)
        received = received_ms(records[0].value) if records else None
        latest = max(latest, received or 0)
    where = ", ".join(f"{p} from offset {start:,}" for p, start in trimmed.items())
    return latest, f"partition{'s' if len(trimmed) > 1 else ''} {where}"


def check_window(plan: BackfillPlan, held: tuple[int, str] | None) -> None:
    """Refuse a window that starts before what the log still holds (step 3)."""
    if held is None:
        return
    since, where = held
    if plan.since_ms is None or plan.since_ms < since:
        raise ConfigError(
            f"the log holds {plan.topic} received since {iso(since)} ({where}); "
            f"pass --since {iso(since)} or later"
        )


def remaining(
    starts: Mapping[int, int],
    routes: Sequence[Span],
    spans: Sequence[Span],
    since_ms: int | None,
    until_ms: int | None,
) -> dict[int, list[tuple[int, int]]]:
    """Per partition, the offset ranges to read: from where the log starts to where the live
    route started, less what a span holds whole for this window (step 4)."""
    whole = [
        span
        for span in spans
        if span.end is not None and (span.kind == ROUTE or span.within(since_ms, until_ms))
    ]
    todo: dict[int, list[tuple[int, int]]] = {}
    for partition in sorted(starts):
        first = starts[partition]
        end = min(route.begins(partition) for route in routes)
        ranges = [(first, end)] if first < end else []
        for span in whole:
            low, high = span.begins(partition), span.ends(partition)
            assert high is not None
            ranges = _less(ranges, low, high)
        if ranges:
            todo[partition] = ranges
    return todo


def _less(ranges: list[tuple[int, int]], low: int, high: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for first, end in ranges:
        if high <= first or low >= end or low >= high:
            out.append((first, end))
            continue
        if first < low:
            out.append((first, low))
        if high < end:
            out.append((high, end))
    return out


def _flatten(todo: Mapping[int, list[tuple[int, int]]]) -> list[tuple[int, int]]:
    return [piece for ranges in todo.values() for piece in ranges]


def next_chunk(todo: dict[int, list[tuple[int, int]]], records: int) -> Ranges:
    """Take about ``records`` from the front of ``todo`` (shared between its partitions, each
    from one contiguous range), and remove them from it."""
    if not todo:
        return {}
    share = max(1, math.ceil(records / len(todo)))
    chunk: Ranges = {}
    for partition in list(todo):
        first, end = todo[partition][0]
        stop = min(end, first + share)
        chunk[partition] = (first, stop)
        if stop < end:
            todo[partition][0] = (stop, end)
        else:
            todo[partition].pop(0)
            if not todo[partition]:
                del todo[partition]
    return chunk


def _chunks(
    spark: SparkSession,
    plan: BackfillPlan,
    jobdb: BackfillJobs,
    run: str,
    starts: Mapping[int, int],
    todo: dict[int, list[tuple[int, int]]],
    spans: Sequence[Span],
    done: Backfilled,
    say: Say,
) -> None:
    """Step 5: each chunk read, routed and committed with this run's span."""
    from exactly.spark.session import own_session

    spark = own_session(spark)  # choosing turns ANSI off for itself: here, not in the caller's
    choosing = Choosing.compile(spark, (plan.destination,))
    partial = [
        span
        for span in spans
        if span.kind == BACKFILL and not span.within(plan.since_ms, plan.until_ms)
    ]
    # this run's span: from where the log starts, up to each chunk's end (what lies between
    # chunks was skipped because a span holds it whole for this window, so it is covered)
    covered = {p: (todo[p][0][0] if p in todo else first) for p, first in starts.items()}
    reached = dict(covered)
    rate = Rate()
    number = 0
    following = Following(plan.log_url, plan.forget_key)  # a forgotten person's: never sent
    steps = _Run(spark, plan, jobdb, run, starts, todo, partial, choosing, following, covered,
                 reached, rate, done, say)  # fmt: skip
    try:
        while todo:
            number += 1
            steps.chunk(number)
    finally:
        following.close()


@dataclass
class _Run:
    """A run's chunks and what they share (step 5)."""

    spark: SparkSession
    plan: BackfillPlan
    jobdb: BackfillJobs
    run: str
    starts: Mapping[int, int]
    todo: dict[int, list[tuple[int, int]]]
    partial: Sequence[Span]
    choosing: Choosing
    following: Following
    covered: Mapping[int, int]
    reached: dict[int, int]
    rate: Rate
    done: Backfilled
    say: Say

    def chunk(self, number: int) -> None:
        """One chunk: read, routed, committed with the run's span, and said."""
        name = self.plan.destination.name
        chunk = next_chunk(self.todo, self.plan.chunk_records)
        size = sum(end - first for first, end in chunk.values())
        self.say(f"backfill {name}: chunk {number} started, {size:,} records")
        read = kept(
            read_chunk(self.spark, self.plan, chunk, self.starts), self.following.forgotten()
        )
        records = window(read, self.plan.since_ms, self.plan.until_ms, self.partial, chunk)
        events, jobs, counts = collect_jobs(records, self.choosing, time.time())
        _check_read(chunk, events.partition, events.offset)
        for partition, (_, end) in chunk.items():
            self.reached[partition] = end
        span = Span(
            destination=name,
            topic=self.plan.topic,
            kind=BACKFILL,
            owner=self.run,
            start=self.covered,
            end=dict(self.reached),
            since_ms=self.plan.since_ms,
            until_ms=self.plan.until_ms,
        )
        _add(self.jobdb, self.plan, jobs, counts, self.run, number, span, self.say)
        self.done.read += size
        missed = counts.get(name)  # filtered or skipped: in the window all the same
        self.done.events += len(events) + (missed.filtered + missed.skipped if missed else 0)
        self.done.jobs += len(jobs)
        self.done.chunks = number
        per_second = self.rate.add(size)
        left = self.done.to_read - self.done.read
        eta = f", about {clock(left / per_second)} left" if per_second and left else ""
        done = self.done
        self.say(
            f"backfill {name}: chunk {number} committed, {done.read:,} of {done.to_read:,} "
            f"read ({done.read / done.to_read:.0%}), {done.jobs:,} jobs, "
            f"{per_second:,.0f} records/s{eta}"
        )


def read_chunk(
    spark: SparkSession, plan: BackfillPlan, chunk: Ranges, starts: Mapping[int, int]
) -> DataFrame:
    """A batch read of the chunk's offsets: ``value``, ``partition``, ``offset``. Every
    partition of the topic is named (one the chunk does not read as an empty range): the
    source reads a partition left out from its start to its end."""
    from exactly.spark.session import read_options

    ranges = {p: chunk.get(p, (first, first)) for p, first in starts.items()}
    starting = {str(p): first for p, (first, _) in sorted(ranges.items())}
    ending = {str(p): end for p, (_, end) in sorted(ranges.items())}
    return (
        spark.read.format("exactly")
        .option("log", plan.log_url)
        .option("topic", plan.topic)
        .option("readRecords", str(plan.read_records))
        .options(**read_options(spark))
        .option("headers", "false")
        .option("startingOffsets", orjson.dumps(starting).decode())
        .option("endingOffsets", orjson.dumps(ending).decode())
        .load()
        .select("value", "partition", "offset")
    )


def _check_read(chunk: Ranges, partitions: Sequence[int], offsets: Sequence[int]) -> None:
    """Every event routed lies in the chunk: a read that strayed outside it would route
    offsets another chunk or the live route owns."""
    for partition, offset in zip(partitions, offsets, strict=True):
        first, end = chunk.get(partition, (0, 0))
        if not first <= offset < end:
            raise StreamError(
                f"backfill read partition {partition} offset {offset}, outside its chunk "
                f"{first}-{end}: nothing of this chunk was committed"
            )


def window(
    records: DataFrame,
    since_ms: int | None,
    until_ms: int | None,
    partial: Sequence[Span],
    chunk: Ranges,
) -> DataFrame:
    """The records received in [since, until) that no span of ``partial`` holds."""
    from pyspark.sql import functions as F

    if since_ms is None and until_ms is None and not partial:
        return records
    received = F.unix_millis(
        F.try_to_timestamp(F.get_json_object(F.col("value").cast("string"), "$.receivedAt"))
    )
    framed = records.withColumn("received_ms", received)
    keep = _inside(F.col("received_ms"), since_ms, until_ms)
    for span in partial:
        for partition, (first, end) in chunk.items():
            ends = span.ends(partition)
            low = max(first, span.begins(partition))
            high = end if ends is None else min(end, ends)
            if low >= high:
                continue
            held = (
                (F.col("partition") == partition)
                & (F.col("offset") >= low)
                & (F.col("offset") < high)
                & _inside(F.col("received_ms"), span.since_ms, span.until_ms)
            )
            keep = keep & ~held
    return framed.where(keep).drop("received_ms")


def _inside(received: Column, since_ms: int | None, until_ms: int | None) -> Column:
    """Whether ``received`` lies in [since, until) (never null; unknown only when unbounded)."""
    from pyspark.sql import functions as F

    inside = F.lit(True)
    if since_ms is not None:
        inside = inside & (received >= F.lit(since_ms))
    if until_ms is not None:
        inside = inside & (received < F.lit(until_ms))
    return F.coalesce(inside, F.lit(False))


def _add(
    jobdb: BackfillJobs,
    plan: BackfillPlan,
    jobs: Sequence[NewJob],
    counts: dict[str, RouteCounts],
    run: str,
    number: int,
    span: Span,
    say: Say,
) -> None:
    """Commit a chunk, tried again while the JobDB fails (a retry after a commit whose answer
    was lost finds the chunk's marker and adds nothing)."""
    name = plan.destination.name
    patience = Patience(
        jobdb.describe(),
        plan.jobdb_patience,
        "the backfill stopped, and running it again goes on where it stopped",
        say,
    )
    patiently(
        lambda: jobdb.add(
            jobs,
            query_id=f"backfill:{name}:{run}",
            batch_id=number,
            counts=counts,
            origin=BACKFILL,
            span=span,
        ),
        jobdb,
        patience,
    )


@dataclass
class Rate:
    """Records per second over the last few chunks (a moving average)."""

    window: int = 5
    marks: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.marks.append((time.monotonic(), 0))

    def add(self, records: int) -> float:
        now, total = time.monotonic(), self.marks[-1][1] + records
        self.marks = [*self.marks[-self.window :], (now, total)]
        then, before = self.marks[0]
        return (total - before) / (now - then) if now > then else 0.0


def received_ms(value: bytes) -> int | None:
    """An event's ``receivedAt`` in ms since the epoch, or None."""
    try:
        found = orjson.loads(value).get("receivedAt")
        moment = datetime.fromisoformat(str(found).replace("Z", "+00:00"))
    except (orjson.JSONDecodeError, AttributeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def clock(seconds: float) -> str:
    """``1m45s``, ``2h03m``, ``12s``."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def say_line(line: str) -> None:
    print(message(line), file=sys.stderr, flush=True)
