"""The Spark part of ``exactly up``: dedupe, aggregate, route and the lake as queries of one
application (route with ``[[destinations]]``, the lake with ``[lake] url``).

One JVM and one SparkSession instead of one per stage: each query runs in a thread of its own
with a FAIR scheduler pool named after it, so a long aggregate micro-batch does not hold the
dedupe query's tasks back. The session's SQL settings are shared (a query copies them when it
starts): the shuffle partitions are raw's partition count, as the dedupe job sets them, and time
is UTC, as the aggregate job sets it; both are set before any query starts. (A session per query
would keep them apart, but Spark 4 finds a Python data source only in the session it was
registered in.) Every query keeps its guarantee as when it runs alone:
its own checkpoint, lock and marker (the stages' modules say how).

Each second the process records, in ``DATA_DIR/up/queries.json``, which queries Spark has run a
first micro-batch of (:func:`exactly.up.watch.save_progress`): until then ``exactly up`` and the
console show a query as *starting*, not as running with a rate of 0.

The dedupe query runs first far enough to create ``events`` (the others read it). A query that
fails stops the others and the process exits with its one-line error, for ``exactly up`` to
restart the part; SIGTERM ends every query between two micro-batches
(:data:`exactly.spark.streaming.STOPPING`) and the process exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exactly.config import Settings
from exactly.errors import ExactlyError, StreamError
from exactly.spark.streaming import STOPPING

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession

    from exactly.aggregate.job import AggregatePlan
    from exactly.dedupe.job import DedupePlan
    from exactly.delivery.route import RoutePlan
    from exactly.lake.query import LakePlan
    from exactly.up.watch import Progress

RAW, EVENTS = "raw", "events"
APP_NAME = (
    "exactly-up"  # the Spark application: its driver logs to DATA_DIR/logs/spark-exactly-up.log
)


QUERY_NAMES = ("dedupe", "aggregate", "route", "lake")  # the first word of each Spark name


@dataclass(frozen=True)
class Query:
    """One stage of the pipeline as a streaming query: its name and how it runs in a session."""

    name: str
    run: Callable[[SparkSession], object]


@dataclass(frozen=True)
class Plans:
    """Each query's plan, built by the function its own command uses, so ``exactly up`` runs a
    stage as ``exactly dedupe``, ``aggregate`` or ``route`` would with their defaults."""

    dedupe: DedupePlan
    aggregate: AggregatePlan
    route: RoutePlan | None  # None: no [[destinations]], no route query
    lake: LakePlan | None = None  # None: no [lake] url, no lake query


def plans(settings: Settings, trigger_seconds: float = 1.0) -> Plans:
    """The pipeline's plans for ``settings``: dedupe and aggregate; route with destinations;
    the lake query with a ``[lake] url``."""
    from exactly.aggregate import driver as aggregate
    from exactly.dedupe import driver as dedupe
    from exactly.delivery import route
    from exactly.lake import query as lake

    return Plans(
        dedupe=dedupe.configured_plan(
            settings, source=RAW, output=EVENTS, trigger_seconds=trigger_seconds
        ),
        aggregate=aggregate.configured_plan(
            settings, topic=EVENTS, trigger_seconds=trigger_seconds
        ),
        route=route.configured_plan(settings, topic=EVENTS, trigger_seconds=trigger_seconds)
        if settings.destinations
        else None,
        lake=lake.configured_plan(settings, topic=EVENTS, trigger_seconds=trigger_seconds)
        if settings.lake.url
        else None,
    )


def queries(settings: Settings, plan: Plans) -> list[Query]:
    """The pipeline's queries, one per plan."""
    found = [
        Query("dedupe", lambda spark: _dedupe(settings, spark, plan.dedupe)),
        Query("aggregate", lambda spark: _aggregate(spark, plan.aggregate)),
    ]
    if plan.route is not None:
        route = plan.route
        found.append(Query("route", lambda spark: _route(spark, route)))
    if plan.lake is not None:
        lake = plan.lake
        found.append(Query("lake", lambda spark: _lake(spark, lake)))
    return found


def run(settings: Settings, trigger_seconds: float = 1.0) -> None:
    """Run every query until SIGTERM or SIGINT (then return) or a failure (then raise it)."""
    from exactly.log import open_log
    from exactly.spark.session import build_session, spark_log
    from exactly.up.watch import Progress, progress_path, save_progress

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: STOPPING.set())
    plan = plans(settings, trigger_seconds)
    progress = Progress(os.getpid(), time.time(), {})
    where = progress_path(settings.data_dir)
    save_progress(where, progress)
    with open_log(settings.log_url, max_record_bytes=settings.log.max_record_bytes) as log:
        from exactly.dedupe.job import prepare

        partitions = prepare(log, plan.dedupe)  # creates events for the others
    spark = build_session(
        settings,
        APP_NAME,
        conf={
            "spark.scheduler.mode": "FAIR",
            "spark.sql.shuffle.partitions": str(partitions),
            "spark.sql.session.timeZone": "UTC",
        },
    )
    failures: list[tuple[str, BaseException]] = []
    threads = [
        threading.Thread(
            target=_in_pool, args=(spark, query, failures), name=query.name, daemon=True
        )
        for query in queries(settings, plan)
    ]
    for thread in threads:
        thread.start()
    try:
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(0.5)
            if len(progress.first_batch) < len(threads):
                _note_first_batches(spark, progress, where)
            if failures or (not STOPPING.is_set() and not all(t.is_alive() for t in threads)):
                STOPPING.set()  # one query ended or failed: end the others too
    finally:
        spark.stop()
    if failures:
        name, error = failures[0]
        if isinstance(error, ExactlyError):
            raise type(error)(f"{name}: {error}") from None
        first = next((line for line in str(error).splitlines() if line.strip()), "")
        traces = spark_log(settings, APP_NAME)
        raise StreamError(
            f"{name}: {type(error).__name__}: {first.strip()} (stack traces in {traces})"
        ) from error


def _note_first_batches(spark: SparkSession, progress: Progress, where: Path) -> None:
    """Record the queries whose first micro-batch Spark reported (``lastProgress`` is set)."""
    from exactly.up.watch import save_progress

    try:
        fresh = {
            name: time.time()
            for query in spark.streams.active
            if (name := (query.name or "").split(" ")[0]) in QUERY_NAMES
            and name not in progress.first_batch
            and query.lastProgress is not None
        }
    except Exception:  # noqa: BLE001 - a stopping session: the queries report their own failure
        return
    if fresh:
        progress.first_batch.update(fresh)
        save_progress(where, progress)


def _in_pool(spark: SparkSession, query: Query, failures: list[tuple[str, BaseException]]) -> None:
    try:
        # The JVM's active session is per thread; without it a new thread's query does not find
        # the ``exactly`` data source, which is registered in this session.
        jvm_session = type(spark)._get_j_spark_session_class(spark._jvm)
        jvm_session.setActiveSession(spark._jsparkSession)
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", query.name)
        query.run(spark)
        if not STOPPING.is_set():
            raise StreamError("the query stopped by itself")
    except BaseException as error:  # noqa: BLE001 - reported by run() in the main thread
        failures.append((query.name, error))
        STOPPING.set()


def _say(name: str) -> Callable[[str], None]:
    def say(line: str) -> None:
        print(f"{name}: {line}", file=sys.stderr, flush=True)

    return say


def _dedupe(settings: Settings, spark: SparkSession, plan: DedupePlan) -> None:
    from exactly.dedupe.driver import drive

    drive(settings, plan, quiet=True, spark=spark)


def _aggregate(spark: SparkSession, plan: AggregatePlan) -> None:
    from exactly.aggregate.driver import drive, open_plan_db

    say = _say("aggregate")
    with open_plan_db(plan, say) as database:
        drive(spark, plan, database, say=say)


def _route(spark: SparkSession, plan: RoutePlan) -> None:
    from exactly.delivery.jobdb import open_jobdb
    from exactly.delivery.route import drive

    with open_jobdb(
        plan.jobdb_url, dataset_rows=plan.dataset_rows, dataset_minutes=plan.dataset_minutes
    ) as jobdb:
        drive(spark, plan, jobdb, say=_say("route"))


def _lake(spark: SparkSession, plan: LakePlan) -> None:
    from exactly.lake import open_table
    from exactly.lake.query import drive

    with open_table(plan.table_url) as table:
        drive(spark, plan, table, say=_say("lake"))
