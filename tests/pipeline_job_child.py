"""One run of the pipeline's queries in one Spark application, for the SIGKILL tests:
``python -m tests.pipeline_job_child CONFIG MODE``.

As ``exactly up`` runs them: dedupe (raw -> events), aggregate (events -> ``event_counts`` and
the test's ``plan_hours``), route (events -> the JobDB) and, with a ``[lake] url``, the lake
query (events -> the lake table), each in a thread and a FAIR pool of one application, so one
SIGKILL interrupts them all; the backends are CONFIG's. Like
``tests/job_child.py``'s other children it starts Spark, prints ``warm``, waits for ``go``,
prints ``running`` and then ``batch QUERY N`` after each micro-batch (small ones, so a kill
lands inside one). MODE ``streaming`` runs until killed; ``catch-up`` runs dedupe until caught
up, then the others until caught up, and prints ``done``.

With ``EXACTLY_TEST_KILL_AFTER_COMMIT=QUERY:N`` (``aggregate``, ``route`` or ``lake``) the run
kills its process group right after that query's N-th commit to its database, before Spark's.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.aggregate import job, open_db
from exactly.aggregate.driver import drive as aggregate
from exactly.aggregate.spec import EVENT_COUNTS, parse_table
from exactly.config import load_settings
from exactly.dedupe.job import DedupePlan, prepare
from exactly.dedupe.job import run as dedupe
from exactly.dedupe.window import Bounds
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.route import RoutePlan
from exactly.delivery.route import drive as route
from exactly.lake import open_table
from exactly.lake.query import LakePlan
from exactly.lake.query import drive as lake
from exactly.log import open_log
from exactly.spark.session import build_session
from exactly.spark.streaming import checkpoint_lock
from tests.aggregate_stream import PLAN_TABLE
from tests.job_child import CATCH_UP_SCALE, read_in_several_tasks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KILL_AFTER_COMMIT = "EXACTLY_TEST_KILL_AFTER_COMMIT"
HOUR = 3_600_000


def say(line: str) -> None:
    print(line, flush=True)


def committed(query: str) -> Callable[[bool], None]:
    """Counts ``query``'s commits; kills the process group after the one the environment says."""
    wanted, _, count = (os.environ.get(KILL_AFTER_COMMIT) or "").partition(":")
    after = int(count) if wanted == query else 0
    commits = 0

    def note(added: bool) -> None:
        nonlocal commits
        commits += added
        if after and commits >= after:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # after the database's commit, before Spark's

    return note


def main(config: str, mode: str) -> None:
    settings = load_settings(Path(config))
    catch_up = mode == "catch-up"
    # the kills want many small micro-batches to land in; the last run, which no kill ends,
    # works off what they left in batches CATCH_UP_SCALE times as large (the caps change only
    # where a batch ends, never what is kept: each batch is exactly once whatever its size)
    scale = CATCH_UP_SCALE if catch_up else 1
    read_in_several_tasks()
    spark = build_session(
        settings, "exactly-pipeline-crash", master="local[2]", conf={"spark.scheduler.mode": "FAIR"}
    )
    data = settings.data_dir
    plans = parse_table(PLAN_TABLE["name"], PLAN_TABLE["group_by"], PLAN_TABLE["measures"])  # type: ignore[arg-type]
    dedupe_plan = DedupePlan(
        settings.log_url,
        settings.dedupe.store,
        data,
        data / "dedupe",
        bounds=Bounds(window=HOUR),
        until_caught_up=catch_up,
        trigger_seconds=0.2,
        max_records_per_trigger=150 * scale,
        read_records=50,
    )
    aggregate_plan = job.AggregatePlan(
        settings.log_url,
        data / "aggregate",
        (EVENT_COUNTS, plans),
        until_caught_up=catch_up,
        trigger_seconds=0.2,
        max_records_per_trigger=300 * scale,
        read_records=100,
    )
    route_plan = RoutePlan(
        settings.log_url,
        (data / "route").resolve(),
        settings.destinations,
        until_caught_up=catch_up,
        trigger_seconds=0.2,
        max_records_per_trigger=200 * scale,
        read_records=100,
    )
    lake_plan = LakePlan(
        settings.log_url,
        settings.lake_url,
        (data / "lake").resolve(),
        until_caught_up=catch_up,
        trigger_seconds=0.2,
        max_records_per_trigger=200 * scale,
        read_records=100,
        compact_every=5,  # upkeep (optimize, expire) between batches is killed too
        layout=settings.lake.layout,
    )
    with open_log(settings.log_url) as log:
        partitions = prepare(log, dedupe_plan)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    if settings.dedupe.store != "spark-state":  # Arrow batches smaller than a read task's rows:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "16")  # they span partitions
    say("warm")
    if sys.stdin.readline().strip() != "go":
        return
    say("running")
    counted, routed, landed = committed("aggregate"), committed("route"), committed("lake")

    def run_dedupe() -> None:
        with checkpoint_lock(dedupe_plan.checkpoint, "dedupe job"):
            dedupe(
                spark,
                dedupe_plan,
                partitions,
                on_batch=lambda report: say(f"batch dedupe {report['batchId']}"),
            )

    def run_aggregate() -> None:
        def on_batch(batch: int, _events: int, added: bool) -> None:
            say(f"batch aggregate {batch}")
            counted(added)

        with open_db(settings.aggregate_url, retry_seconds=60) as db:
            aggregate(spark, aggregate_plan, db, say=lambda _: None, on_batch=on_batch)

    def run_route() -> None:
        def on_batch(batch: int, _events: int, _jobs: int, added: bool) -> None:
            say(f"batch route {batch}")
            routed(added)

        with open_jobdb(settings.jobdb_url) as jobdb:
            route(spark, route_plan, jobdb, say=lambda _: None, on_batch=on_batch)

    def run_lake() -> None:
        def on_batch(batch: int, _events: int, appended: bool) -> None:
            say(f"batch lake {batch}")
            landed(appended)

        with open_table(lake_plan.table_url) as table:
            lake(spark, lake_plan, table, say=lambda _: None, on_batch=on_batch)

    stages = [run_dedupe, run_aggregate, run_route]
    if settings.lake.url:
        stages.append(run_lake)
    if catch_up:
        in_pool(spark, "dedupe", run_dedupe)
        stages = stages[1:]
    threads = [
        threading.Thread(target=in_pool, args=(spark, stage.__name__, stage), daemon=True)
        for stage in stages
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    say("done")
    spark.stop()


def in_pool(spark: SparkSession, name: str, stage: Callable[[], None]) -> None:
    """Run ``stage`` in a FAIR pool of its own, with the session active in this thread; a
    failure ends the process at once (the test sees the run die, and why on stderr)."""
    try:
        jvm_session = type(spark)._get_j_spark_session_class(spark._jvm)
        jvm_session.setActiveSession(spark._jsparkSession)
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", name)
        stage()
    except BaseException as error:  # noqa: BLE001 - the whole run fails
        traceback.print_exc()
        print(f"{name} failed: {error!r}", file=sys.stderr, flush=True)
        os._exit(1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
