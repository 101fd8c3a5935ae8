"""Steps 1 to 3 of archiving a dataset, in a process of its own at a lower priority.

    python -m exactly.delivery.archive.apart   # JSON lines on stdin, answers on stdout

The director that holds partition 0 archives every dataset whose jobs are all finished
(:mod:`.archiving`). Encoding a dataset's jobs as gzip JSON lines is CPU work: in a thread of the
director it took the event loop's GIL and made that director the slowest of those sharing a
drain. Here it runs in a child at ``nice`` 10, on a connection of its own; the director still
drops the dataset itself (step 4), in line with its other JobDB calls.

The first line on stdin opens the child: ``parent`` (the director's pid), ``jobdb`` and
``archive`` (their URLs, credentials included, so never on the command line). Each line after
it asks for one dataset (``number``, and ``name``, its file) and gets one line back: ``ok``
once the dataset is marked ``archived``, else ``error`` and why not. The child ends at the end
of its stdin, and dies with the director (``PR_SET_PDEATHSIG``): a director killed mid-archive
leaves no child writing, and the next pass archives the dataset again, as after any crash
before step 4.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
NICE = 10


def die_with_parent(parent: int) -> None:
    """Be killed when the process that started this one dies (Linux); exit at once if it
    already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(1)


def archive_dataset(jobdb: Any, archive: Any, number: int, name: str) -> None:
    """``JobDB.archive``'s steps 1 to 3 for dataset ``number``, into the file ``name``."""

    def write(records: Iterator[dict[str, Any]]) -> None:
        archive.write(name, records)

    jobdb.archive(number, write, drop=False)


def main() -> None:
    opening = json.loads(sys.stdin.readline())
    die_with_parent(int(opening["parent"]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C is the director's to handle
    os.nice(NICE)
    from exactly.delivery.archive import open_archive
    from exactly.delivery.jobdb import open_jobdb

    try:
        archive = open_archive(str(opening["archive"]))
        jobdb = open_jobdb(str(opening["jobdb"]))
    except Exception as error:  # noqa: BLE001 (a URL or a driver: the first request's answer)
        print(f"error {_line(error)}", flush=True)
        return
    with jobdb:
        for line in sys.stdin:
            request = json.loads(line)
            try:
                archive_dataset(jobdb, archive, int(request["number"]), str(request["name"]))
            except Exception as error:  # noqa: BLE001 (the archive's or the driver's: one line)
                print(f"error {_line(error)}", flush=True)
                return  # the director starts another child for its next pass
            print("ok", flush=True)


def _line(error: Exception) -> str:
    """``Type: message`` on one line, whole (``transforms.one_line`` cuts at 200 characters,
    and an archive's error ends with what to check)."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


if __name__ == "__main__":
    main()
