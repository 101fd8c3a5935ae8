"""Archiving one finished dataset, step by step: the seconds each holds the SQLite JobDB.

    .venv/bin/python bench/archive_steps.py [--rows 100000] [--rounds 3]

``JobDB.archive`` marks every job of a dataset ``archiving`` (one statement, SQLite's write
lock held throughout), writes the file (reads only: a WAL reader holds no lock a writer waits
for), marks every job ``archived`` (the write lock again), then drops the dataset (after checking
again, with reads, that it is finished and archived). While a mark
or the drop holds the write lock, every director's commit and the route query's insert wait. Per
round: an empty sqlite JobDB gets two datasets of ``--rows`` jobs (``bench/directors.py``'s
fill), the first all ``succeeded``; then each step of archiving it, timed alone, into a
directory archive. Prints each step's seconds and the CPU seconds of all four, per round.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from directors import fill  # type: ignore[import-not-found]
from exactly.delivery.archive import archive_name, open_archive
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import ARCHIVED, ARCHIVING, SUCCEEDED, Transition


def one_round(rows: int) -> dict[str, float]:
    """Seconds of each step for one dataset of ``rows`` finished jobs, and their CPU."""
    with tempfile.TemporaryDirectory() as home:
        url = f"sqlite://{home}"
        fill(url, 2 * rows, 4, dataset_rows=rows)
        archive = open_archive(f"file://{home}/archive")
        with open_jobdb(url, dataset_rows=rows) as db:
            for start in range(1, rows + 1, 10_000):
                last = min(rows, start + 9_999)
                db.record([Transition(job, SUCCEEDED, 1) for job in range(start, last + 1)])
            number = db.archivable()[0]
            name = archive_name({d.number: d for d in db.datasets()}[number])
            cursor = db._cursor()  # the steps of JobDB.archive, one at a time
            steps: dict[str, float] = {}
            cpu = time.process_time()
            began = time.perf_counter()
            db._mark(cursor, number, ARCHIVING)
            steps["mark archiving"] = time.perf_counter() - began
            began = time.perf_counter()
            archive.write(name, db._records(cursor, number))
            steps["write the file"] = time.perf_counter() - began
            began = time.perf_counter()
            db._mark(cursor, number, ARCHIVED)
            steps["mark archived"] = time.perf_counter() - began
            began = time.perf_counter()
            db.archive(number, lambda records: None)  # step 4 as the director runs it: all
            # found archived, so archive()'s checks (reads) and the drop, nothing written again
            steps["drop"] = time.perf_counter() - began
            steps["CPU, all four"] = time.process_time() - cpu
            return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for round_ in range(1, args.rounds + 1):
        steps = one_round(args.rows)
        print(f"round {round_}: " + ", ".join(f"{k} {v:.3f} s" for k, v in steps.items()))


if __name__ == "__main__":
    main()
