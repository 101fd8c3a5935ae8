"""SQLite's write-ahead log: switching a file to it (every SQLite store), and emptying it and
rebuilding the file, for ``exactly forget``.

In WAL mode the old image of every page a transaction changed stays in the ``-wal`` file after
the usual checkpoints, which copy the pages back but leave the file as it is; only
``wal_checkpoint(TRUNCATE)`` empties it, and it does nothing while another connection reads.
With ``secure_delete`` on for the changes, the old bytes are then gone from both files
(docs/forget.md, "What was measured"), except the copies a b-tree balance left: inserting in the
middle of a table (an append to a topic's partition other than the last) moves cells between
pages and leaves their old bytes in the space it frees, which ``secure_delete`` does not zero;
:func:`rebuild` (``VACUUM``) writes the file again from its live rows.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from pathlib import Path

from exactly.backoff import backoff

EMPTY_SECONDS = 30.0  # how long :func:`empty_wal` tries while readers hold the WAL


def write_ahead(conn: sqlite3.Connection, seconds: float) -> None:
    """Put the file in WAL mode, waiting out other processes doing the same to a new file.

    Switching reads the header and then upgrades to a write transaction; SQLite answers that
    upgrade ``database is locked`` at once, without its busy handler (waiting could deadlock), when
    another connection holds the write lock. So the first writers of a new file (a job's tasks, or
    ``up``'s route query and directors, starting together) race here: the losers retry, for at
    most ``seconds``.
    """
    deadline = time.monotonic() + seconds
    for attempt in itertools.count(1):
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
        time.sleep(backoff(attempt, minimum=0.001, maximum=0.1))


def rebuild(path: Path) -> None:
    """``VACUUM`` ``path``: every page written again from the live rows, the file cut to them
    (others' writes wait meanwhile, as for a long append)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=60.0)
    try:
        conn.execute("PRAGMA busy_timeout = 60000")
        conn.execute("VACUUM")
    finally:
        conn.close()


def empty_wal(path: Path, seconds: float = EMPTY_SECONDS) -> bool:
    """Copy ``path``'s WAL into it and empty it; False if readers held it for ``seconds``."""
    deadline = time.monotonic() + seconds
    conn = sqlite3.connect(path, isolation_level=None, timeout=60.0)
    try:
        conn.execute("PRAGMA busy_timeout = 60000")
        while True:
            busy, frames, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy == 0 and frames == 0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
    finally:
        conn.close()
