"""The director: the process that sends the JobDB's jobs of its partitions to their destinations.

Its parts, one module each:

* ``loop.py``: :class:`Director`, the main loop wiring the parts and running the chores of
  ``schedule.py`` (a pure schedule: which chore is due);
* ``leases.py``: the partitions this director leases and keeps, its fair share of them, and
  each destination's portion of its limits;
* ``dispatch.py``: each destination's dispatcher: pages its buckets in (``queues.py``, the jobs
  in memory) and takes jobs, or forms batches, in turn;
* ``sending.py``: the three steps of an attempt, one path for whatever one request carries
  (``shipment.py``: one job or a batch), with one ``next_step``, one tally and one expiry;
* ``writer.py``: group commit; ``jobdb_thread.py``: the JobDB calls off the event loop;
* upkeep: ``archiving.py`` (finished datasets archived, then dropped), ``controls.py``
  (operators' pauses and expiries, the breaker's row), ``expiry.py`` (jobs of removed
  destinations, an operator's expiry), ``gauges.py`` (the metrics' queue gauges).

Jobs wait in memory in their bucket (source × destination), each with its own queue and retry
times, so a source with a backlog grows only its own queue. What a receiver can take belongs to
its destination and is shared by its buckets in turn: ``max_in_flight`` requests, the ``rate``,
the pauses a 429 asks for and the breaker of a failing endpoint
(:mod:`exactly.delivery.pacing`). A request's URL, headers and secret are the destination's as
configured when it leaves; the JobDB holds none of them. Nothing one job or destination does
stops the director: any error while a request is built or sent is that attempt's failure,
retried by the destination's rules (:mod:`exactly.delivery.policy`).

Every attempt follows three steps, so a crash can duplicate only the requests in flight:

1. record ``executing`` (attempt n) and commit, for everything taken at once;
2. send the request (the same ``Idempotency-Key`` / ``webhook-id`` on every attempt);
3. record the outcome (``succeeded``, ``discarded``, ``awaiting-retry`` with its time, ``expired``)
   and commit, group-committed with other outcomes.

On start the director pages in what is pending, including jobs a crash left ``executing`` between
steps 1 and 3: they are sent again, the one duplicate window, at most the requests that were in
flight. A receiver drops such copies by their idempotency key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from exactly.delivery.director.expiry import REMOVED
from exactly.delivery.director.leases import PARTITIONS_HELD
from exactly.delivery.director.loop import Director
from exactly.delivery.director.sending import DIRECTOR_HEADER, LAST_TRY, Tally
from exactly.errors import ConfigError

if TYPE_CHECKING:
    from exactly.config import Settings
    from exactly.delivery.archive import Archive
    from exactly.delivery.director.forgetting import Forgetting
    from exactly.delivery.director.jobdb_thread import JobDBThread

__all__ = [
    "DIRECTOR_HEADER",
    "LAST_TRY",
    "PARTITIONS_HELD",
    "REMOVED",
    "Director",
    "Tally",
    "configured_director",
]


@contextlib.contextmanager
def configured_director(settings: Settings) -> Iterator[Director]:
    """The director ``settings`` describe (``[[destinations]]``, ``[delivery]``, the archive),
    with its archive checked and its JobDB open until the block ends. A config without
    destinations, a wrong archive URL or a JobDB that cannot be opened stops here, in one line,
    before any lease is taken."""
    from exactly.delivery.archive import open_archive
    from exactly.delivery.jobdb import opened_jobdb

    if not settings.destinations:
        raise ConfigError("no [[destinations]] in the config: nothing to deliver to")
    options = settings.delivery
    archive = open_archive(settings.archive_url)
    archive.check()
    with opened_jobdb(
        settings.jobdb_url,
        dataset_rows=options.dataset_rows,
        dataset_minutes=options.dataset_minutes,
    ) as database:
        yield Director(
            database,
            settings.destinations,
            page_size=options.page_size,
            archive=archive,
            metrics_port=options.metrics_port,
            jobdb_patience=options.jobdb_patience,
            partitions=options.partitions,
            forgetting=_forgetting(settings),
        )


def _forgetting(settings: Settings) -> Callable[[JobDBThread, Archive | None], Forgetting]:
    """How the director reads ``exactly forget``'s regulations (``forgetting.py``)."""
    from exactly.delivery.director.forgetting import Forgetting
    from exactly.forget.regulations import load_key
    from exactly.log import open_log

    key = load_key(settings.data_dir)

    def made(calls: JobDBThread, archive: Archive | None) -> Forgetting:
        from exactly.delivery.director.loop import say

        return Forgetting(open_log(settings.log_url), key, calls, archive, say)

    return made
