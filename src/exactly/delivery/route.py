"""The route query: ``events`` into the JobDB, one job per (event, matching destination), once.

A Spark streaming query from the ``exactly`` source with ``foreachBatch``. Per micro-batch:

1. Spark records the batch's offset range in its checkpoint (``offsets/<batch id>``);
2. the events some destination takes (its ``sources``, ``events`` and ``filter``, and the
   event's ``integrations``: :mod:`exactly.delivery.choosing`) are collected to the driver, in
   log order (partition, offset), with their stored JSON and, for a destination with a
   ``transform``, its outcome; the others are only counted;
3. :func:`jobs_for` makes one :class:`~exactly.delivery.jobdb.base.NewJob` per (event,
   destination that takes it): the payload is the event's JSON as kept in ``events`` (or the
   transform's body), the message id its ``messageId``, the destination its name (never its URL
   or headers: the director resolves those when it sends), the expiry now + the destination's
   ``expire``; a batching destination that is not ordered gets its jobs as packs, a job per
   batch of its events (:func:`packed`, :mod:`exactly.delivery.packs`);
4. the jobs, the counts and the marker (query id, batch id, the stream, the end offsets of step
   1) commit in one JobDB transaction (:meth:`~exactly.delivery.jobdb.faces.RouterJobs.add`);
   a marker at or past the batch id means a replay: nothing is added;
5. Spark commits the batch (``commits/<batch id>``).

A crash anywhere repeats at most the last batch, whose marker stops it at 4. A JobDB that fails
at step 4 (a lost connection, a server restarting) is tried again on a new connection for
``jobdb_patience`` seconds: the marker makes a retry of a commit whose answer was lost add
nothing. Past that the query stops with one :class:`~exactly.errors.JobDBError`. A
checkpoint that is lost (or new, over a JobDB the same checkpoint path filled) starts from the
end offsets of the last batch the JobDB took from this stream, so the JobDB, not the checkpoint,
is the source of truth. No HTTP request is made here: delivering is the director's (``exactly
deliver``), so a slow destination cannot stall a micro-batch.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast

from exactly.delivery import packs
from exactly.delivery.batches import cut
from exactly.delivery.choosing import Choosing
from exactly.delivery.jobdb.base import NewJob, RouteCounts, lane_of
from exactly.delivery.jobdb.faces import RouterJobs
from exactly.delivery.jobdb.runs import JobRun, RoutedJobs
from exactly.delivery.packs import packing
from exactly.delivery.patience import Patience, patiently
from exactly.delivery.settings import ROUTE_RECORDS_PER_TRIGGER, DestinationSettings
from exactly.delivery.transforms import DROPPED, SENT
from exactly.errors import ConfigError, StreamError
from exactly.forget.readers import Following, kept
from exactly.spark import checkpoint as spark_checkpoint
from exactly.spark.batches import BatchFunction, run_batches
from exactly.spark.datasource import offsets

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from exactly.config import Settings

OnBatch = Callable[[int, int, int, bool], None]  # batch id, events routed, jobs, added
EVENT_COLUMNS = ("source", "name", "message_id", "user_id", "value", "partition", "offset")
# a micro-batch's sources, payloads, message ids and users: what its jobs are made of
Columns = tuple[Sequence[str], Sequence[bytes], Sequence[str], Sequence[str | None]]


@dataclass(frozen=True)
class RoutePlan:
    """Everything one run of the route query needs, resolved from settings and flags."""

    log_url: str = field(repr=False)  # may hold secrets: never in a repr
    checkpoint: Path
    destinations: tuple[DestinationSettings, ...]
    topic: str = "events"
    until_caught_up: bool = False
    max_records_per_trigger: int | None = ROUTE_RECORDS_PER_TRIGGER
    trigger_seconds: float = 1.0
    read_records: int = 10_000
    jobdb_patience: float = 60.0  # seconds a failing JobDB is tried again before stopping
    jobdb_url: str = field(default="", repr=False)  # may hold a password: never in a repr
    dataset_rows: int = 100_000  # the JobDB starts a new dataset after this many jobs
    dataset_minutes: float = 60.0  # ... or after this many minutes
    forget_key: bytes | None = field(default=None, repr=False)  # whom readers skip, when set

    @property
    def stream(self) -> str:
        """What the JobDB's markers call this query's input: the topic and the checkpoint."""
        return f"{self.topic}@{self.checkpoint}"


class Event(NamedTuple):
    """What routing needs of one stored event."""

    source: str | None
    name: str | None
    message_id: str | None
    user_id: str | None
    payload: bytes
    partition: int
    offset: int


@dataclass
class Progress:
    """Per micro-batch: events routed, jobs made, and whether the JobDB took them (not a replay)."""

    batches: dict[int, tuple[int, int, bool]] = field(default_factory=dict)

    @property
    def jobs(self) -> int:
        return sum(jobs for _, jobs, added in self.batches.values() if added)

    @property
    def events(self) -> int:
        return sum(events for events, _, added in self.batches.values() if added)

    @property
    def replays(self) -> int:
        return sum(1 for _, _, added in self.batches.values() if not added)


class Outcome(NamedTuple):
    """A transform's result on one event (:mod:`exactly.delivery.transforms`)."""

    outcome: int
    body: bytes | None
    error: str | None


@dataclass(frozen=True)
class EventColumns:
    """A micro-batch's events as columns, in log order: what the route query collects (an
    Arrow table's columns), so no object is made per event."""

    source: Sequence[str | None]
    name: Sequence[str | None]
    message_id: Sequence[str | None]
    user_id: Sequence[str | None]
    payload: Sequence[bytes]
    partition: Sequence[int]
    offset: Sequence[int]
    # per destination, whether it takes each event (empty: by its sources and events lists)
    takes: Sequence[Sequence[bool]] = ()
    # per destination with a transform: each event's (outcome, body, error)
    shaped: Mapping[int, Sequence[Outcome | None]] = field(default_factory=dict)

    @classmethod
    def of(cls, events: Sequence[Event]) -> EventColumns:
        """The columns of ``events`` (rows made elsewhere, as in the tests)."""
        if not events:
            return cls([], [], [], [], [], [], [])
        source, name, message_id, user_id, payload, partition, offset = (
            list(column) for column in zip(*events, strict=True)
        )
        return cls(source, name, message_id, user_id, payload, partition, offset)

    def __len__(self) -> int:
        return len(self.payload)


def jobs_for(
    events: EventColumns, destinations: Sequence[DestinationSettings], now: float
) -> RoutedJobs:
    """One job per (event, destination that takes it): each destination's jobs in turn, in the
    events' order (a bucket's jobs keep log order; a job's id orders it in its bucket).

    A single-event destination's job is in its user's lane (:func:`lane_of`, ``lanes``), so
    several directors share the destination and a user's jobs keep their order. Without a
    transform its jobs are one :class:`~exactly.delivery.jobdb.runs.JobRun` of the columns
    (no object per event); a batching destination's are packs (:func:`packs_of`).

    A destination takes an event when ``events.takes`` says so (the route query's columns), or
    with no such column, when its ``sources`` and ``events`` lists match. With a transform,
    the job's payload is the body it returned; a dropped event makes no job, and a failed one
    a job carrying its error (added as ``failed``, never sent).

    Pure: the route query's rule, tested without Spark. An event without a ``messageId`` (the
    collector always sets one) is named by its place in the log, which a replay sees again.
    """
    found_ids, found_sources = events.message_id, events.source
    message_ids: Sequence[str] = cast("Sequence[str]", found_ids)  # as they are, when whole
    if None in found_ids or "" in found_ids:
        message_ids = [
            found or f"{partition}-{offset}"
            for found, partition, offset in zip(
                found_ids, events.partition, events.offset, strict=True
            )
        ]
    sources: Sequence[str] = cast("Sequence[str]", found_sources)
    if None in found_sources:
        sources = [source or "" for source in found_sources]
    columns = (sources, events.payload, message_ids, events.user_id)
    jobs = RoutedJobs()
    for index, destination in enumerate(destinations):
        expire_at = now + destination.window
        takes = _takes(events, index, destination)
        shaped = events.shaped.get(index)
        if shaped is None and packing(destination):  # the packs straight from the columns
            jobs.extend(packs_of(*columns, takes, destination, expire_at))
        elif shaped is None:  # a job per event taken, as columns
            jobs.add(_run(columns, takes, destination, expire_at))
        else:
            jobs.extend(_shaped(columns, takes, shaped, destination, expire_at))
    return jobs


def _run(
    columns: Columns,
    takes: Sequence[bool],
    destination: DestinationSettings,
    expire_at: float,
) -> JobRun:
    """The jobs of a single-event destination without a transform: the events it takes."""
    sources, payloads, message_ids, user_ids = columns
    if not all(takes):  # the micro-batch's own lists when it takes every event
        sources, payloads = list(compress(sources, takes)), list(compress(payloads, takes))
        message_ids, user_ids = list(compress(message_ids, takes)), list(compress(user_ids, takes))
    lanes = destination.lanes
    return JobRun(
        destination.name,
        sources,
        payloads,
        message_ids,
        user_ids,
        expire_at,
        [lane_of(user, lanes) for user in user_ids] if lanes > 1 else (),
    )


def _shaped(
    columns: Columns,
    takes: Sequence[bool],
    shaped: Sequence[Outcome | None],
    destination: DestinationSettings,
    expire_at: float,
) -> list[NewJob]:
    """The jobs of a destination with a transform: each event's body, or the stored event with
    the transform's error; packed when the destination batches."""
    name = destination.name
    mine: list[NewJob] = []
    for source, payload, message_id, user_id, take, result in zip(
        *columns, takes, shaped, strict=True
    ):
        if not take or result is None or result.outcome == DROPPED:
            continue
        if result.outcome == SENT and result.body is not None:
            mine.append(NewJob(source, name, result.body, message_id, user_id, expire_at))
        else:
            error = result.error or "the transform gave no body"
            mine.append(NewJob(source, name, payload, message_id, user_id, expire_at, error))
    if packing(destination):
        return packed(mine, destination)
    if (lanes := destination.lanes) > 1:
        for job in mine:
            job.lane = lane_of(job.user_id, lanes)
    return mine


def packed(jobs: Sequence[NewJob], destination: DestinationSettings) -> list[NewJob]:
    """``jobs`` of one destination (in log order) as packs: per bucket, in order, cut by the
    destination's ``batch`` limits (:func:`~exactly.delivery.batches.cut`); a job whose
    transform failed stays a job of its own (added ``failed``). The jobs are one micro-batch's,
    so one expiry: the packs take the first job's. Pure: a replay of the same micro-batch makes
    the same packs, though the JobDB's marker adds none of them again."""
    if not jobs:
        return []
    alone = [job for job in jobs if job.error is not None]
    members = [job for job in jobs if job.error is None]
    made = packs_of(
        [job.source for job in members],
        [job.payload for job in members],
        [job.message_id for job in members],
        [job.user_id for job in members],
        [True] * len(members),
        destination,
        jobs[0].expire_at,
    )
    return [*made, *alone]


def packs_of(
    sources: Sequence[str],
    payloads: Sequence[bytes],
    message_ids: Sequence[str],
    user_ids: Sequence[str | None],
    takes: Sequence[bool],
    destination: DestinationSettings,
    expire_at: float,
) -> list[NewJob]:
    """The packs of the events ``takes`` picks, given as columns in log order: per bucket (its
    source), in order, cut by the destination's ``batch`` limits. What :func:`packed` makes of
    their jobs, with no job or member made per event."""
    limits = destination.batch
    picked = list(compress(range(len(takes)), takes))
    by_bucket: dict[str, list[int]] = {}
    if picked and len(set(sources)) == 1:  # the usual micro-batch: one source, one bucket
        by_bucket[sources[0]] = picked
    else:
        for index in picked:
            by_bucket.setdefault(sources[index], []).append(index)
    made: list[NewJob] = []
    for source, indices in by_bucket.items():
        bodies = [payloads[index] for index in indices]
        ids = [message_ids[index] for index in indices]
        users = [user_ids[index] for index in indices]
        sizes = list(map(len, bodies))
        start = 0
        while start < len(indices):
            taken, _ = cut(
                sizes[start : start + limits.max_events],
                max_events=limits.max_events,
                max_bytes=limits.max_bytes,
                form=limits.format,
            )
            stop = start + taken
            payload = packs.pack_columns(ids[start:stop], users[start:stop], bodies[start:stop])
            key = packs.pack_key(destination.name, ids[start:stop])
            made.append(NewJob(source, destination.name, payload, key, None, expire_at))
            start = stop
    return made


def _takes(events: EventColumns, index: int, destination: DestinationSettings) -> Sequence[bool]:
    if events.takes:
        return events.takes[index]
    if destination.sources is None and destination.events is None:
        return [True] * len(events)
    return [
        destination.matches(source, name)
        for source, name in zip(events.source, events.name, strict=True)
    ]


def dropped(events: EventColumns, destinations: Sequence[DestinationSettings]) -> dict[str, int]:
    """Per destination with a transform, the events it took whose transform returned None."""
    return {
        destinations[index].name: sum(
            1 for result in shaped if result is not None and result.outcome == DROPPED
        )
        for index, shaped in events.shaped.items()
    }


def collect_jobs(
    records: DataFrame, choosing: Choosing, now: float
) -> tuple[EventColumns, RoutedJobs, dict[str, RouteCounts]]:
    """Steps 2 and 3 of the module docstring over ``records`` (``value``, ``partition``,
    ``offset``): the events some destination of ``choosing`` takes, their jobs, and per
    destination the events it was not sent. What a micro-batch of the route query and a chunk
    of ``exactly backfill`` both do."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    # a value that does not fit a filter's comparison makes it null (nothing sent), not a
    # failed batch: on this query's own session (foreachBatch's clone), not up's others
    records.sparkSession.conf.set("spark.sql.ansi.enabled", "false")
    # 2. the events some destination takes, in log order: collected as Arrow (no row objects
    # to unpickle, no sort stage in Spark) and put in order here; the events none takes are
    # only counted, by an observation of the same job
    destinations = choosing.destinations
    observation = Observation(f"route-{uuid.uuid4().hex}")
    taken = choosing.taken(choosing.observed(choosing.parse(records), observation))
    flags = [f"take_{index}" for index in range(len(destinations))]
    shaped = [f"shaped_{index}" for index in choosing.transforms]
    table = (
        taken.select(
            F.col("sourceId").alias("source"),
            F.col("event").alias("name"),
            F.col("messageId").alias("message_id"),
            F.coalesce("userId", "anonymousId").alias("user_id"),
            "value",
            "partition",
            "offset",
            *flags,
            *shaped,
        )
        .toArrow()
        .sort_by([("partition", "ascending"), ("offset", "ascending")])
    )
    source, name, message_id, user_id, payload, partition, offset = (
        table.column(column).to_pylist() for column in EVENT_COLUMNS
    )
    events = EventColumns(
        source,
        name,
        message_id,
        user_id,
        payload,
        partition,
        offset,
        takes=[table.column(flag).to_pylist() for flag in flags],
        shaped={
            index: [
                None if found is None else Outcome(**found)
                for found in table.column(f"shaped_{index}").to_pylist()
            ]
            for index in choosing.transforms
        },
    )
    # 3. one job per (event, destination that takes it), and what was not sent, counted
    jobs = jobs_for(events, destinations, now)
    counts = choosing.counts(observation)
    for name_, more in dropped(events, destinations).items():
        counts[name_] = counts[name_] + RouteCounts(dropped=more)
    return events, jobs, counts


def configured_plan(
    settings: Settings,
    *,
    topic: str = "events",
    checkpoint: Path | None = None,
    until_caught_up: bool = False,
    max_records_per_trigger: int | None = ROUTE_RECORDS_PER_TRIGGER,
    trigger_seconds: float = 1.0,
) -> RoutePlan:
    """The route query's plan from ``settings``: what ``exactly route`` and ``exactly up`` both
    run (the flags that name a setting are in ``settings`` already)."""
    from exactly.forget.regulations import load_key

    if not settings.destinations:
        raise ConfigError("no [[destinations]] in the config: nothing to route to")
    delivery = settings.delivery
    return RoutePlan(
        log_url=settings.log_url,
        checkpoint=(checkpoint or default_checkpoint(settings.data_dir, topic)).resolve(),
        destinations=settings.destinations,
        topic=topic,
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
        jobdb_patience=delivery.jobdb_patience,
        jobdb_url=settings.jobdb_url,
        dataset_rows=delivery.dataset_rows,
        dataset_minutes=delivery.dataset_minutes,
        forget_key=load_key(settings.data_dir),
    )


def default_checkpoint(data_dir: Path, topic: str) -> Path:
    return data_dir.resolve() / "checkpoints" / f"route-{topic}"


def starting_offsets(jobdb: RouterJobs, plan: RoutePlan) -> str:
    """``earliest``, or where the JobDB's routing stopped when the checkpoint is new."""
    if spark_checkpoint.planned(plan.checkpoint):
        return "earliest"  # Spark resumes from its checkpoint; this is ignored
    found = jobdb.end_offsets(plan.stream)
    return "earliest" if found is None else json.dumps(offsets.to_json(found))


class BatchRouter(BatchFunction):
    """The ``foreachBatch`` function: steps 2 to 4 of the module docstring."""

    def __init__(
        self,
        jobdb: RouterJobs,
        plan: RoutePlan,
        choosing: Choosing,
        on_batch: OnBatch | None = None,
    ) -> None:
        super().__init__(plan.checkpoint)
        self.jobdb = jobdb
        self.plan = plan
        self.choosing = choosing
        self.on_batch = on_batch
        self.following = Following(plan.log_url, plan.forget_key)  # whom readers skip

    def process(self, records: DataFrame, batch_id: int) -> None:
        records = kept(records, self.following.forgotten())  # a forgotten person's: never sent
        events, jobs, counts = collect_jobs(records, self.choosing, time.time())
        # 4. the jobs, the counts and the marker in one transaction; a replay adds nothing
        taken = self._add(jobs, counts, self.query_id, batch_id)
        # ``on_batch`` runs after the JobDB's commit and before Spark's (step 5)
        if self.on_batch is not None:
            self.on_batch(batch_id, len(events), len(jobs), taken)

    def _add(
        self, jobs: RoutedJobs, counts: dict[str, RouteCounts], query: str, batch_id: int
    ) -> bool:
        """Step 4, tried again while the JobDB fails; False when the batch was there (a replay).

        A retry after a commit whose answer was lost finds the marker and adds nothing (it is
        then reported as a replay).
        """
        end = spark_checkpoint.batch_end(self.plan.checkpoint, batch_id)
        patience = Patience(
            self.jobdb.describe(),
            self.plan.jobdb_patience,
            "the route query stopped, and a restart resumes from its checkpoint",
            say_line,
        )

        def add() -> bool:
            before = self.jobdb.marker(query)  # for the report: add() decides by itself
            self.jobdb.add(
                jobs,
                query_id=query,
                batch_id=batch_id,
                stream=self.plan.stream,
                end_offsets=end,
                counts=counts,
            )
            return before is None or before < batch_id

        return patiently(add, self.jobdb, patience)


def run(
    spark: SparkSession,
    plan: RoutePlan,
    jobdb: RouterJobs,
    start: str = "earliest",
    on_batch: OnBatch | None = None,
    choosing: Choosing | None = None,
) -> Progress:
    """Run the query until caught up (``until_caught_up``) or stopped; returns progress.

    A failure raises the :class:`~exactly.errors.ExactlyError` behind it when there is one.
    """
    progress = Progress()

    def note(batch_id: int, events: int, jobs: int, added: bool) -> None:
        progress.batches[batch_id] = (events, jobs, added)
        if on_batch is not None:
            on_batch(batch_id, events, jobs, added)

    if choosing is None:
        choosing = Choosing.compile(spark, plan.destinations)
    router = BatchRouter(jobdb, plan, choosing, note)
    reading = choosing.source_reading()
    columns = ("partition", "offset", "value", *(["fields"] if reading else []))
    try:
        run_batches(
            spark,
            "route",
            plan,
            router,
            columns,
            start=start,
            failed=StreamError,
            options=reading,
        )
    finally:
        router.following.close()
    return progress


def say_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def drive(
    spark: SparkSession,
    plan: RoutePlan,
    jobdb: RouterJobs,
    *,
    say: Callable[[str], None] = say_line,
    on_batch: OnBatch | None = None,
) -> Progress:
    """Lock the checkpoint, check the topic, find where to start, open the destinations'
    route spans (:meth:`~exactly.delivery.jobdb.faces.RouterJobs.open_routes`), run."""
    from exactly.log import open_log
    from exactly.spark.streaming import checkpoint_lock

    if not plan.destinations:
        raise ConfigError("no [[destinations]] in the config: nothing to route to")
    with checkpoint_lock(plan.checkpoint, "route query"):
        with open_log(plan.log_url) as log:
            log.topic_info(plan.topic)  # a missing topic fails here, in one line
        choosing = Choosing.compile(spark, plan.destinations)  # a bad filter fails here
        patience = Patience(jobdb.describe(), plan.jobdb_patience, "the route query stopped", say)
        start = patiently(lambda: starting_offsets(jobdb, plan), jobdb, patience)
        # what each destination is routed from on, for backfill (``exactly backfill``)
        names = [destination.name for destination in plan.destinations]
        patiently(lambda: jobdb.open_routes(plan.stream, plan.topic, names), jobdb, patience)
        say(describe(plan, jobdb, start))
        return run(spark, plan, jobdb, start, on_batch, choosing)


def describe(plan: RoutePlan, jobdb: RouterJobs, start: str) -> str:
    names = ", ".join(destination.name for destination in plan.destinations)
    origin = "" if start == "earliest" else f", from the JobDB's offsets {start}"
    return (
        f"route {plan.topic} -> {jobdb.describe()}: {names} (checkpoint {plan.checkpoint}{origin})"
    )
