"""What one ``JobDB.summary`` costs (the per-destination counts `exactly up`'s view and the
console read each second) on a sqlite JobDB holding a backlog while it is delivered.

    .venv/bin/python bench/jobdb_summary.py [--jobs 1000000] [--calls 5] [--step 2000]

Fills an empty sqlite JobDB with ``--jobs`` single-event jobs from 16 sources (datasets of the
default 100,000 rows), then ``--calls`` times: a director's and a router's step (``--step`` of
the oldest pending jobs succeed, ``--step`` new jobs are added), then a summary from a JobDB
kept open between calls (as the view and the console keep it) and one from a JobDB opened for
the call (what each summary cost before they kept one: every job scanned). Prints the median
seconds of each and their ratio; the two summaries must agree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delivery import empty_jobdb  # type: ignore[import-not-found]
from exactly.delivery.jobdb import JobDB, open_jobdb
from exactly.delivery.jobdb.base import SUCCEEDED, Members, NewJob

PAYLOAD = b'{"messageId":"m","event":"Order Completed","properties":{"total":12.5}}'
SOURCES = 16


def add(db: JobDB, first: int, count: int, batch: int) -> None:
    expire = time.time() + 4 * 3600
    made = [
        NewJob(f"s{i % SOURCES}", "bench", PAYLOAD, f"m{i}", expire_at=expire)
        for i in range(first, first + count)
    ]
    db.add(made, query_id="bench", batch_id=batch)


def timed(db: JobDB) -> tuple[float, dict[str, dict[str, int]]]:
    began = time.perf_counter()
    found = db.summary(time.time())
    return time.perf_counter() - began, {name: entry.states for name, entry in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--step", type=int, default=2_000)
    args = parser.parse_args()
    with empty_jobdb("sqlite") as url, open_jobdb(url) as db, open_jobdb(url) as kept:
        batches = 0
        for batches, first in enumerate(range(0, args.jobs, 10_000)):
            add(db, first, min(10_000, args.jobs - first), batches)
        added = args.jobs
        timed(kept)  # the first summary reads every dataset
        kept_times, fresh_times = [], []
        for call in range(args.calls):
            for source in range(SOURCES):  # the director: the oldest pending jobs succeed
                ids = [job.id for job in db.pending(f"s{source}/bench", limit=args.step // SOURCES)]
                db.record([], members=[Members(tuple(ids), SUCCEEDED, 1, status_code=200)])
            add(db, added, args.step, batches + 1 + call)  # the router
            added += args.step
            seconds, found = timed(kept)
            with open_jobdb(url) as fresh:
                fresh_seconds, expected = timed(fresh)
            assert found == expected, (found, expected)
            kept_times.append(seconds)
            fresh_times.append(fresh_seconds)
            print(f"call {call + 1}: kept {seconds:.3f} s, opened for it {fresh_seconds:.3f} s")
        datasets = len(kept.datasets())
    kept_median, fresh_median = statistics.median(kept_times), statistics.median(fresh_times)
    print(f"{args.jobs:,} jobs in {datasets} datasets, {args.step:,} delivered and added a call")
    print(f"summary, median: kept {kept_median:.3f} s, opened for the call {fresh_median:.3f} s")
    print(f"kept / opened for the call: {kept_median / fresh_median:.3f}")


if __name__ == "__main__":
    main()
