"""One run of the lake query for the SIGKILL tests: ``python -m tests.lake_job_child``.

Arguments: CONFIG TABLE_URL CHECKPOINT MODE. Like ``tests/route_job_child.py``: it starts
Spark, prints ``warm``, waits for ``go`` on stdin, prints ``running``, then appends ``events``
to the lake table in small micro-batches, printing ``batch N`` after each: MODE ``streaming``
until killed, ``catch-up`` until caught up, then ``done``.

Two points a run can be told to kill itself at (its process group, SIGKILL):

* ``EXACTLY_TEST_KILL_AFTER_COMMIT=N``: right after its N-th table commit, before Spark's
  (``on_batch`` runs between the two);
* ``EXACTLY_TEST_KILL_BEFORE_COMMIT=N``: at its N-th commit, after the executors wrote the
  batch's data files into the table's directory and before the commit that would make them a
  version's; their paths are added to :data:`KILLED` beside the checkpoint first.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]

from exactly.config import load_settings
from exactly.lake import Marker, open_table
from exactly.lake.base import DataFile
from exactly.lake.query import LakePlan, drive
from exactly.spark.session import build_session
from tests.job_child import CATCH_UP_SCALE, read_in_several_tasks

KILL_AFTER_COMMIT = "EXACTLY_TEST_KILL_AFTER_COMMIT"
KILL_BEFORE_COMMIT = "EXACTLY_TEST_KILL_BEFORE_COMMIT"
KILLED = "killed-files"  # beside the checkpoint: the files of the batches killed before commit


def main(config: str, table_url: str, checkpoint: str, mode: str) -> None:
    settings = load_settings(Path(config))
    read_in_several_tasks()
    spark = build_session(settings, "exactly-lake-crash", master="local[2]")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    plan = LakePlan(
        settings.log_url,
        table_url,
        Path(checkpoint),
        until_caught_up=mode == "catch-up",
        trigger_seconds=0.2,
        # the last run, which no kill ends, in batches CATCH_UP_SCALE times as large
        max_records_per_trigger=200 * (CATCH_UP_SCALE if mode == "catch-up" else 1),
        read_records=100,
        layout=settings.lake.layout,
    )
    print("warm", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    print("running", flush=True)
    kill_after = int(os.environ.get(KILL_AFTER_COMMIT) or 0)
    kill_before = int(os.environ.get(KILL_BEFORE_COMMIT) or 0)
    commits = 0

    def on_batch(batch: int, _events: int, appended: bool) -> None:
        nonlocal commits
        print(f"batch {batch}" + ("" if appended else " replayed"), flush=True)
        commits += appended
        if kill_after and commits >= kill_after:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # after the table's commit, before Spark's

    with open_table(table_url) as table:
        if kill_before:
            commit_files = table.commit_files

            def dying_commit(files: Sequence[DataFile], schema: pa.Schema, marker: Marker) -> bool:
                if commits + 1 >= kill_before:
                    with (Path(checkpoint).parent / KILLED).open("a") as killed:
                        killed.writelines(f"{file.path}\n" for file in files)
                    os.killpg(os.getpgrp(), signal.SIGKILL)  # its files written, no commit
                return commit_files(files, schema, marker)

            table.commit_files = dying_commit  # type: ignore[method-assign]
        drive(spark, plan, table, say=lambda _: None, on_batch=on_batch)
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
