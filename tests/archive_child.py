"""A process that archives every archivable dataset of a JobDB, for the SIGKILL tests.

``python -m tests.archive_child JOBDB_URL ARCHIVE_URL``: archives dataset after dataset as the
director does (steps 1 to 3, then the drop, without delivering) and prints ``done`` when none
is left.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from exactly.delivery.archive import archive_name, open_archive
from exactly.delivery.jobdb import open_jobdb


def main(jobdb_url: str, archive_url: str) -> None:
    archive = open_archive(archive_url)
    with open_jobdb(jobdb_url) as db:
        while ready := db.archivable():
            datasets = {dataset.number: dataset for dataset in db.datasets()}
            number = ready[0]
            name = archive_name(datasets[number])

            def write(records: Iterator[dict[str, Any]], name: str = name) -> None:
                archive.write(name, records)

            db.archive(number, write, drop=False)  # as the director: 1. to 3. aside,
            db.archive(number, write)  # then 4., which finds the dataset archived
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
