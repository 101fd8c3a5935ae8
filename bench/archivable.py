"""The director's archive check: ``JobDB.archivable()`` over a backlog being delivered.

    .venv/bin/python bench/archivable.py [--datasets 10] [--rows 100000] [--done 0.6]
                                         [--repeat 5]

The holder of partition 0 runs an archive pass every ``archive_seconds`` (5 s), and each pass
asks ``archivable()`` which closed datasets have every job finished; ``archive()`` checks the
one it archives again. During a drain that is every closed dataset, each a scan of its jobs.
This fills an empty sqlite JobDB with ``--datasets`` datasets of ``--rows`` jobs (the route
query's size), records ``succeeded`` for the first ``--done`` of them by id (a drain under way:
the oldest delivered first), then times ``archivable()`` and ``archive()``'s own check of the
first finished dataset, ``--repeat`` times each; prints the medians. The ``exactly`` imported
is the first on ``PYTHONPATH``, so two checkouts compare in turn with ``bench/pairs.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from directors import fill  # type: ignore[import-not-found]
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import SUCCEEDED, Transition


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", type=int, default=10)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--done", type=float, default=0.6)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    total = args.datasets * args.rows
    with tempfile.TemporaryDirectory() as home:
        url = f"sqlite://{home}"
        fill(url, total, 4, dataset_rows=args.rows)
        with open_jobdb(url, dataset_rows=args.rows) as db:
            done = int(total * args.done)
            for start in range(1, done + 1, 10_000):
                db.record(
                    [
                        Transition(job_id, SUCCEEDED, 1)
                        for job_id in range(start, min(done, start + 9_999) + 1)
                    ]
                )
            checks, ones, ready = [], [], []
            for _ in range(args.repeat):
                began = time.perf_counter()
                ready = db.archivable()
                checks.append(time.perf_counter() - began)
                if not ready:
                    continue
                began = time.perf_counter()
                with db._mutex:  # archive()'s own check, without the archiving
                    checker = getattr(db, "_archivable", None)
                    if checker is not None:
                        checker(db._cursor(), ready[0])
                    else:  # the code before: the whole archivable() again
                        assert ready[0] in db.archivable()
                ones.append(time.perf_counter() - began)
    print(
        f"{args.datasets} datasets of {args.rows:,} jobs, {args.done:.0%} delivered, "
        f"{len(ready)} archivable: archivable() {statistics.median(checks) * 1000:.0f} ms "
        + (f"archive()'s check {statistics.median(ones) * 1000:.0f} ms " if ones else "")
        + f"(medians of {args.repeat})"
    )


if __name__ == "__main__":
    main()
