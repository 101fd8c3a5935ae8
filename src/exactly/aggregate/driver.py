"""Running the aggregate job from the command line or the demo: lock, Spark, the tables."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.aggregate import frame, job
from exactly.aggregate.base import AggregateDB
from exactly.aggregate.settings import RECORDS_PER_TRIGGER
from exactly.aggregate.spec import TableSpec, table_specs
from exactly.config import Settings
from exactly.log import open_log
from exactly.spark.streaming import checkpoint_lock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def configured_tables(settings: Settings) -> list[TableSpec]:
    """``event_counts`` and the tables of ``[[aggregate.tables]]``, checked without Spark."""
    return table_specs((t.name, t.group_by, t.measures) for t in settings.aggregate.tables)


def configured_plan(
    settings: Settings,
    *,
    topic: str = "events",
    checkpoint: Path | None = None,
    until_caught_up: bool = False,
    max_records_per_trigger: int | None = RECORDS_PER_TRIGGER,
    trigger_seconds: float = 1.0,
) -> job.AggregatePlan:
    """The aggregate query's plan from ``settings``: what ``exactly aggregate`` and ``exactly
    up`` both run (the flags that name a setting are in ``settings`` already)."""
    return job.AggregatePlan(
        log_url=settings.log_url,
        checkpoint=(checkpoint or job.default_checkpoint(settings.data_dir, topic)).resolve(),
        tables=tuple(configured_tables(settings)),
        topic=topic,
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
        db_url=settings.aggregate_url,
        retry_seconds=settings.aggregate.retry_seconds,
    )


def open_plan_db(plan: job.AggregatePlan, say: Callable[[str], None] = job.say) -> AggregateDB:
    """The plan's aggregate database, retrying an unavailable one as the settings say."""
    from exactly.aggregate import open_db

    return open_db(plan.db_url, retry_seconds=plan.retry_seconds, say=say)


def drive(
    spark: SparkSession,
    plan: job.AggregatePlan,
    db: AggregateDB,
    *,
    say: Callable[[str], None] = job.say,
    on_batch: Callable[[int, int, bool], None] | None = None,
) -> job.Progress:
    """Check the tables with Spark, create them, run the query; returns its progress."""
    specs = frame.check(spark, plan.tables)
    with checkpoint_lock(plan.checkpoint, "aggregate job"):
        with open_log(plan.log_url) as log:
            start = job.prepare(log, db, plan, specs)
        say(job.describe(plan, db, start))
        return job.run(spark, plan, db, specs, start, on_batch)
