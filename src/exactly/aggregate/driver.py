"""Running the aggregate job from the command line or the demo: lock, Spark, the tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from exactly.aggregate import frame, job
from exactly.aggregate.base import AggregateDB
from exactly.aggregate.spec import TableSpec, table_specs
from exactly.config import Settings
from exactly.log import open_log
from exactly.spark.streaming import checkpoint_lock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def configured_tables(settings: Settings) -> list[TableSpec]:
    """``event_counts`` and the tables of ``[[aggregate.tables]]``, checked without Spark."""
    return table_specs((t.name, t.group_by, t.measures) for t in settings.aggregate.tables)


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
