"""One run of ``exactly backfill`` for the SIGKILL test: ``python -m tests.backfill_child``.

Arguments: CONFIG JOBDB_URL DESTINATION SINCE_MS RUN MODE (``-`` for no SINCE_MS). Like the
other crash children (``tests/job_child.py``): it starts Spark, prints ``warm``, waits for
``go`` on stdin, prints ``running``, then backfills DESTINATION in chunks of 200 records,
printing ``started N`` before chunk N is read and ``committed N`` once the JobDB took it, and
``done`` at the end. The run is named RUN, so the test reads its chunks' marker
(``backfill:DESTINATION:RUN``) to tell whether a kill landed inside a chunk. MODE is unused.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from exactly.config import load_settings
from exactly.delivery import backfill
from exactly.delivery.jobdb import open_jobdb
from exactly.log import open_log
from exactly.spark.session import build_session
from tests.job_child import read_in_several_tasks

CHUNK = re.compile(r"chunk (\d+) (started|committed)")


def main(config: str, jobdb_url: str, destination: str, since: str, run: str) -> None:
    settings = load_settings(Path(config))
    read_in_several_tasks()
    spark = build_session(settings, "exactly-backfill-crash", master="local[2]")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    plan = backfill.configured_plan(
        settings,
        destination,
        since=None if since == "-" else int(since) / 1000,
        chunk_records=200,
        wait_seconds=120,
    )
    print("warm", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    print("running", flush=True)

    def say(line: str) -> None:
        found = CHUNK.search(line)
        if found:
            print(f"{found.group(2)} {found.group(1)}", flush=True)

    with open_log(settings.log_url) as log, open_jobdb(jobdb_url) as jobdb:
        done = backfill.drive(spark, plan, jobdb, log, say=say, run=run)
    print(f"done {done.jobs} {done.read}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
