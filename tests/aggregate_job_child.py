"""One run of the aggregate job for the SIGKILL tests: ``python -m tests.aggregate_job_child``.

Arguments: DATA_DIR LOG_URL DB_URL CHECKPOINT MODE. Like ``tests/dedupe_job_child.py``: it starts
Spark, prints ``warm``, waits for ``go`` on stdin, prints ``running``, then counts ``events`` into
``event_counts`` and the test's ``plan_hours`` in small micro-batches, printing ``batch N`` after
each: MODE ``streaming`` until killed, ``catch-up`` until caught up, then ``done``. With
``EXACTLY_TEST_KILL_AFTER_COMMIT=N`` in its environment the run kills its process group right
after its N-th SQL commit, before Spark's: ``on_batch`` runs between the two.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from exactly.aggregate import frame, job, open_db
from exactly.aggregate.driver import drive
from exactly.aggregate.spec import EVENT_COUNTS, parse_table
from exactly.config import Settings
from exactly.spark.session import build_session
from tests.aggregate_stream import PLAN_TABLE

KILL_AFTER_COMMIT = "EXACTLY_TEST_KILL_AFTER_COMMIT"


def main(data_dir: str, log_url: str, db_url: str, checkpoint: str, mode: str) -> None:
    spark = build_session(Settings(data_dir=Path(data_dir)), "exactly-agg-crash", master="local[2]")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    plans = parse_table(PLAN_TABLE["name"], PLAN_TABLE["group_by"], PLAN_TABLE["measures"])  # type: ignore[arg-type]
    plan = job.AggregatePlan(
        log_url,
        Path(checkpoint),
        (EVENT_COUNTS, plans),
        until_caught_up=mode == "catch-up",
        trigger_seconds=0.2,
        max_records_per_trigger=300,
        read_records=100,
    )
    frame.check(spark, plan.tables)  # Spark's planning warmed up before ``warm``
    print("warm", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    print("running", flush=True)
    kill_after = int(os.environ.get(KILL_AFTER_COMMIT) or 0)
    commits = 0

    def on_batch(batch: int, _events: int, counted: bool) -> None:
        nonlocal commits
        print(f"batch {batch}", flush=True)
        commits += counted
        if kill_after and commits >= kill_after:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # after the SQL commit, before Spark's

    with open_db(db_url, retry_seconds=60) as db:
        drive(spark, plan, db, say=lambda _: None, on_batch=on_batch)  # as exactly aggregate runs
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
