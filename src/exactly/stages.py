"""The pipeline's Spark stages, each declared once: :data:`STAGES`.

An entry says what a stage is: its name (the first word of its Spark query's name and its FAIR
pool under ``exactly up``), the topic it reads, whether the settings enable it, its plan from the
settings (the one builder beside the stage's Spark code; a command's flags are in the settings
already, ``cli/context.with_flags``, and its run options, topic, checkpoint, trigger ..., go as
keywords), its checkpoint, its target (what it writes), what it checks and creates before Spark
starts, how its target is opened, how it is driven in a session, and what ``exactly status``
shows of it::

    stage = AGGREGATE
    plan = stage.plan(settings, until_caught_up=True)
    with stage.open(plan, say) as target:        # the database, the JobDB, the table ...
        spark = build_session(settings, app_name=f"exactly-{stage.name}")
        stage.drive(spark, plan, target, say=say, on_batch=report)

Its command and ``exactly up`` (``up/pipeline.py``) run a stage so; up's view, its console and
``exactly status`` find the stages here; so do the tests (``test_stage_plans.py``). Adding a
stage is one entry here and its package.

Nothing here imports a stage's Spark code until it is asked for (only the stages' settings
modules, which ``exactly.config`` imports anyway), so a command that only reads starts fast; the
plan builders import ``exactly.config``, never the other way (``tests/unit/test_import_graph.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from exactly.aggregate.settings import RECORDS_PER_TRIGGER as AGGREGATE_RECORDS_PER_TRIGGER
from exactly.dedupe.settings import RECORDS_PER_TRIGGER as DEDUPE_RECORDS_PER_TRIGGER
from exactly.delivery.settings import ROUTE_RECORDS_PER_TRIGGER
from exactly.lake.settings import RECORDS_PER_TRIGGER as LAKE_RECORDS_PER_TRIGGER

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from exactly.aggregate.base import AggregateDB
    from exactly.aggregate.job import AggregatePlan
    from exactly.aggregate.job import Progress as Counted
    from exactly.config import Settings
    from exactly.dedupe.driver import Output, Summary
    from exactly.dedupe.job import DedupePlan
    from exactly.delivery.jobdb.faces import RouterJobs
    from exactly.delivery.route import Progress as Routed
    from exactly.delivery.route import RoutePlan
    from exactly.lake.base import LakeTable
    from exactly.lake.query import LakePlan
    from exactly.lake.query import Progress as Landed
    from exactly.log import Log

RAW, EVENTS = "raw", "events"
Say = Callable[[str], None]


class Plan(Protocol):
    """What every stage's plan has."""

    @property
    def checkpoint(self) -> Path: ...


@dataclass(frozen=True)
class Shown:
    """A stage as ``exactly status`` shows it: its figures as JSON, its sections of text."""

    json: Any
    sections: list[str]


PlanT = TypeVar("PlanT", bound=Plan)
TargetT = TypeVar("TargetT")
DoneT = TypeVar("DoneT")


class Stage(ABC, Generic[PlanT, TargetT, DoneT]):
    """One Spark stage: a streaming query from a topic to its target (module docstring)."""

    name: ClassVar[str]
    reads: ClassVar[str]  # the topic
    # --max-records-per-trigger when not given (None: unbounded)
    max_records_per_trigger: ClassVar[int | None] = None
    shown_as: ClassVar[str]  # its part of ``exactly status``: its key in --json, its error lines
    # what that part calls the target in --json; None: the status names its own (each dedupe job
    # its store), and a failure to read it stops the command
    target_as: ClassVar[str | None] = "url"
    target_is: ClassVar[str]  # what the target is, in words (``exactly up``: "the JobDB to open")

    def enabled(self, settings: Settings) -> bool:
        """Whether ``exactly up`` runs the stage with ``settings``."""
        return True

    @abstractmethod
    def plan(self, settings: Settings, **run: Any) -> PlanT:
        """The plan from ``settings``; ``run``: the command's run options (topic, checkpoint,
        until_caught_up, max_records_per_trigger, trigger_seconds), defaults as ``up`` runs."""

    def checkpoint(self, settings: Settings) -> Path:
        """The checkpoint of the stage as ``exactly up`` runs it."""
        return self.plan(settings).checkpoint

    @abstractmethod
    def target(self, settings: Settings) -> str:
        """The URL of what the stage writes (it may hold a password: redact to show)."""

    def prepare(self, log: Log, plan: PlanT) -> None:
        """Check and create, before Spark starts, what other stages read (nothing by default)."""

    @abstractmethod
    def open(self, plan: PlanT, say: Say) -> AbstractContextManager[TargetT]:
        """The stage's target, open for :meth:`drive` (before Spark starts: a target that
        cannot be opened stops the stage with one line)."""

    @abstractmethod
    def drive(
        self,
        spark: SparkSession,
        plan: PlanT,
        target: TargetT,
        *,
        say: Say,
        on_batch: Callable[..., None] | None = None,
    ) -> DoneT:
        """Run the stage's query in ``spark`` until it is caught up (``until_caught_up``) or
        stopped; ``on_batch`` is told of each micro-batch (its arguments are the stage's)."""

    @abstractmethod
    def status(self, settings: Settings, log: Log | None) -> Shown | None:
        """What the stage holds and has done, read from durable sources (``exactly status``);
        None if it never ran: nothing is created by looking. ``log``: the log, if it exists."""

    def __repr__(self) -> str:
        return f"<stage {self.name}>"


class Dedupe(Stage["DedupePlan", "Output", "Summary"]):
    """raw -> events, each messageId once per window (``exactly.dedupe``): claimed in a store,
    or by Spark's own state (the plan's mode)."""

    name = "dedupe"
    reads = RAW
    max_records_per_trigger = DEDUPE_RECORDS_PER_TRIGGER
    shown_as = "dedupe"
    target_as = None
    target_is = "the dedupe store"

    def plan(self, settings: Settings, **run: Any) -> DedupePlan:
        from exactly.dedupe.driver import configured_plan

        return configured_plan(settings, **run)

    def target(self, settings: Settings) -> str:
        return settings.log_url

    def prepare(self, log: Log, plan: DedupePlan) -> None:
        from exactly.dedupe.job import prepare

        prepare(log, plan)  # the output topics, which the other stages read

    def open(self, plan: DedupePlan, say: Say) -> AbstractContextManager[Output]:
        from exactly.dedupe.driver import opened

        return opened(plan)

    def drive(
        self,
        spark: SparkSession,
        plan: DedupePlan,
        target: Output,
        *,
        say: Say,
        on_batch: Callable[..., None] | None = None,
    ) -> Summary:
        from exactly.dedupe.driver import drive

        return drive(spark, plan, target, say=say, on_batch=on_batch)

    def status(self, settings: Settings, log: Log | None) -> Shown | None:
        from exactly.dedupe.status import read_jobs, render

        if log is None:
            return None
        jobs = read_jobs(log, settings.log_url, settings.data_dir, settings.dedupe.store)
        if not jobs:
            return None
        return Shown(
            [{"job": "dedupe", **asdict(job)} for job in jobs],
            [render(job, settings.data_dir) for job in jobs],
        )


class Aggregate(Stage["AggregatePlan", "AggregateDB", "Counted"]):
    """events -> SQL tables, each micro-batch with its marker (``exactly.aggregate``)."""

    name = "aggregate"
    reads = EVENTS
    max_records_per_trigger = AGGREGATE_RECORDS_PER_TRIGGER
    shown_as = "aggregate"
    target_is = "the aggregate database"

    def plan(self, settings: Settings, **run: Any) -> AggregatePlan:
        from exactly.aggregate.driver import configured_plan

        return configured_plan(settings, **run)

    def target(self, settings: Settings) -> str:
        return settings.aggregate_url

    def open(self, plan: AggregatePlan, say: Say) -> AbstractContextManager[AggregateDB]:
        from exactly.aggregate.driver import open_plan_db

        return open_plan_db(plan, say)

    def drive(
        self,
        spark: SparkSession,
        plan: AggregatePlan,
        target: AggregateDB,
        *,
        say: Say,
        on_batch: Callable[..., None] | None = None,
    ) -> Counted:
        from exactly.aggregate.driver import drive

        return drive(spark, plan, target, say=say, on_batch=on_batch)

    def status(self, settings: Settings, log: Log | None) -> Shown | None:
        from exactly.aggregate.status import read, render

        url = self.target(settings)
        marker = read(url)
        if marker is None:
            return None
        return Shown({"marker": asdict(marker)}, [render(marker, url, settings.data_dir)])


class Route(Stage["RoutePlan", "RouterJobs", "Routed"]):
    """events -> JobDB, one job per (event, matching destination) (``exactly.delivery.route``);
    with ``[[destinations]]``."""

    name = "route"
    reads = EVENTS
    max_records_per_trigger = ROUTE_RECORDS_PER_TRIGGER
    shown_as = "delivery"  # the JobDB's jobs, routed and delivered
    target_as = "jobdb"
    target_is = "the JobDB"

    def enabled(self, settings: Settings) -> bool:
        return bool(settings.destinations)

    def plan(self, settings: Settings, **run: Any) -> RoutePlan:
        from exactly.delivery.route import configured_plan

        return configured_plan(settings, **run)

    def target(self, settings: Settings) -> str:
        return settings.jobdb_url

    def open(self, plan: RoutePlan, say: Say) -> AbstractContextManager[RouterJobs]:
        from exactly.delivery.jobdb import opened_jobdb

        return opened_jobdb(
            plan.jobdb_url, dataset_rows=plan.dataset_rows, dataset_minutes=plan.dataset_minutes
        )

    def drive(
        self,
        spark: SparkSession,
        plan: RoutePlan,
        target: RouterJobs,
        *,
        say: Say,
        on_batch: Callable[..., None] | None = None,
    ) -> Routed:
        from exactly.delivery.route import drive

        return drive(spark, plan, target, say=say, on_batch=on_batch)

    def status(self, settings: Settings, log: Log | None) -> Shown | None:
        from exactly.delivery.status import read, render

        url = self.target(settings)
        found = read(url, settings.destinations)
        if found is None:
            return None
        return Shown(
            {"destinations": [{**asdict(entry), "queued": entry.queued} for entry in found]},
            [render(found, url, settings.data_dir)],
        )


class Lake(Stage["LakePlan", "LakeTable", "Landed"]):
    """events -> a lake table, each micro-batch with its marker (``exactly.lake``); with a
    ``[lake] url``."""

    name = "lake"
    reads = EVENTS
    max_records_per_trigger = LAKE_RECORDS_PER_TRIGGER
    shown_as = "lake"
    target_is = "the lake table"

    def enabled(self, settings: Settings) -> bool:
        return bool(settings.lake.url)

    def plan(self, settings: Settings, **run: Any) -> LakePlan:
        from exactly.lake.query import configured_plan

        return configured_plan(settings, **run)

    def target(self, settings: Settings) -> str:
        return settings.lake_url

    def open(self, plan: LakePlan, say: Say) -> AbstractContextManager[LakeTable]:
        from exactly.lake import open_table

        return open_table(plan.table_url)

    def drive(
        self,
        spark: SparkSession,
        plan: LakePlan,
        target: LakeTable,
        *,
        say: Say,
        on_batch: Callable[..., None] | None = None,
    ) -> Landed:
        from exactly.lake.query import drive

        return drive(spark, plan, target, say=say, on_batch=on_batch)

    def status(self, settings: Settings, log: Log | None) -> Shown | None:
        from exactly.lake.status import read, render

        found = read(settings)  # with the table's own reading of the log
        if found is None:
            return None
        return Shown(asdict(found), [render(found, settings.data_dir)])


DEDUPE, AGGREGATE, ROUTE, LAKE = Dedupe(), Aggregate(), Route(), Lake()
# In the order ``exactly up`` prepares and starts them: dedupe makes the topic the others read.
STAGES: tuple[Stage[Any, Any, Any], ...] = (DEDUPE, AGGREGATE, ROUTE, LAKE)


def enabled(settings: Settings) -> list[Stage[Any, Any, Any]]:
    """The stages ``exactly up`` runs with ``settings``, in :data:`STAGES`'s order."""
    return [stage for stage in STAGES if stage.enabled(settings)]
