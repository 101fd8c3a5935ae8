"""What one ``JobDB.summary`` costs (the per-destination counts `exactly up`'s view and the
console read) on a sqlite JobDB holding a backlog.

    .venv/bin/python bench/jobdb_summary.py [--jobs 1000000] [--calls 3]

``bench/directors.py``'s fill (``--jobs`` single-event jobs from 16 sources, none delivered) into
an empty sqlite JobDB, then ``--calls`` calls of ``JobDB.summary``; prints each call's seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delivery import empty_jobdb  # type: ignore[import-not-found]
from directors import fill  # type: ignore[import-not-found]
from exactly.delivery.jobdb import open_jobdb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    with empty_jobdb("sqlite") as url:
        fill(url, args.jobs, 16)
        with open_jobdb(url) as db:
            for _ in range(args.calls):
                began = time.perf_counter()
                db.summary(time.time())
                print(f"summary of {args.jobs:,} jobs: {time.perf_counter() - began:.2f} s")


if __name__ == "__main__":
    main()
