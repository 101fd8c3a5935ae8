"""One run of the route query for the SIGKILL tests: ``python -m tests.route_job_child``.

Arguments: CONFIG JOBDB_URL CHECKPOINT MODE. Like ``tests/pipeline_job_child.py``: it
starts Spark, prints ``warm``, waits for ``go`` on stdin, prints ``running``, then routes
``events`` into the JobDB for CONFIG's ``[[destinations]]`` in small micro-batches, printing
``batch N`` after each: MODE ``streaming`` until killed, ``catch-up`` until caught up, then
``done``. With ``EXACTLY_TEST_KILL_AFTER_COMMIT=N`` in its environment the run kills its process
group right after its N-th JobDB commit, before Spark's: ``on_batch`` runs between the two.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from exactly.config import load_settings
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.route import RoutePlan, drive
from exactly.spark.session import build_session
from tests.job_child import CATCH_UP_SCALE, read_in_several_tasks

KILL_AFTER_COMMIT = "EXACTLY_TEST_KILL_AFTER_COMMIT"


def main(config: str, jobdb_url: str, checkpoint: str, mode: str) -> None:
    settings = load_settings(Path(config))
    read_in_several_tasks()
    spark = build_session(settings, "exactly-route-crash", master="local[2]")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    plan = RoutePlan(
        settings.log_url,
        Path(checkpoint),
        settings.destinations,
        until_caught_up=mode == "catch-up",
        trigger_seconds=0.2,
        # the last run, which no kill ends, in batches CATCH_UP_SCALE times as large
        max_records_per_trigger=200 * (CATCH_UP_SCALE if mode == "catch-up" else 1),
        read_records=100,
    )
    print("warm", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    print("running", flush=True)
    kill_after = int(os.environ.get(KILL_AFTER_COMMIT) or 0)
    commits = 0

    def on_batch(batch: int, _events: int, _jobs: int, added: bool) -> None:
        nonlocal commits
        print(f"batch {batch}" + ("" if added else " replayed"), flush=True)
        commits += added
        if kill_after and commits >= kill_after:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # after the JobDB commit, before Spark's

    with open_jobdb(jobdb_url) as jobdb:
        drive(spark, plan, jobdb, say=lambda _: None, on_batch=on_batch)
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
