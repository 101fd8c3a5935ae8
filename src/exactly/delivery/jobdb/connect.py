"""A JobDB connected before any work, or one line saying why it cannot be.

What a command or a stage that writes the JobDB opens it with (``exactly route``, the route
query of ``exactly up``): the first use connects, so a database that does not exist, a wrong
password or a server that does not answer stops it with one line naming the JobDB (password
masked) and the driver's reason, not the driver's traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import JobDB
from exactly.errors import ExactlyError, JobDBError
from exactly.urls import scrub


@contextlib.contextmanager
def connected(url: str, **options: Any) -> Iterator[JobDB]:
    """The JobDB at ``url`` (``options`` go to :func:`open_jobdb`), connected once: see the
    module docstring."""
    database = open_jobdb(url, **options)
    try:
        database.datasets()  # the first use connects (and creates the tables)
    except ExactlyError:
        database.close()
        raise
    except Exception as error:  # noqa: BLE001 (each driver has its own error tree)
        with contextlib.suppress(Exception):
            database.close()
        raise JobDBError(
            f"cannot open the JobDB {database.describe()}: {reason(error, url)}; check its URL "
            "(--jobdb, EXACTLY_DELIVERY__JOBDB or [delivery] jobdb), that the server runs and "
            "that the database exists"
        ) from None
    with database:
        yield database


def reason(error: Exception, url: str) -> str:
    """The driver's message on one line, without the password it might quote."""
    args = error.args
    text = args[1] if len(args) == 2 and isinstance(args[0], int) else str(error)  # PyMySQL's
    try:
        secrets = [urlsplit(url).password or ""]
    except ValueError:
        secrets = []
    return " ".join(scrub(str(text) or type(error).__name__, secrets).split())[:300]
