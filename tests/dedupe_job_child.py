"""One run of the dedupe job for the SIGKILL tests: ``python -m tests.dedupe_job_child ...``.

Arguments: DATA_DIR LOG_URL STORE CHECKPOINT MODE. The child starts Spark first, prints ``warm``,
then waits for a line ``go`` on stdin (sent once the previous run is dead), so the next run warms
up while the previous one works and a test can afford many kills; then it prints ``running`` and
runs the job in
small micro-batches (so a kill lands inside one), printing ``batch N`` as they complete: MODE
``streaming`` until killed, ``catch-up`` until caught up, then it prints ``done``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from exactly.config import Settings
from exactly.dedupe.job import DedupePlan, prepare, run
from exactly.dedupe.window import Bounds
from exactly.log import open_log
from exactly.spark.session import build_session
from exactly.spark.streaming import checkpoint_lock

HOUR = 3_600_000


def main(data_dir: str, log_url: str, store: str, checkpoint: str, mode: str) -> None:
    settings = Settings(data_dir=Path(data_dir))
    spark = build_session(settings, "exactly-dedupe-crash", master="local[2]")
    print("warm", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    print("running", flush=True)
    plan = DedupePlan(
        log_url,
        store,
        Path(data_dir),
        Path(checkpoint),
        bounds=Bounds(window=HOUR),
        until_caught_up=mode == "catch-up",
        trigger_seconds=0.2,
        max_records_per_trigger=150,
        read_records=50,
    )
    with open_log(log_url) as log:
        partitions = prepare(log, plan)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    if store != "spark-state":  # Arrow batches smaller than a read task's rows: they span
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "16")  # partitions
    with checkpoint_lock(plan.checkpoint, "dedupe job"):  # as exactly dedupe runs it
        run(spark, plan, partitions, on_batch=lambda r: print(f"batch {r['batchId']}", flush=True))
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
