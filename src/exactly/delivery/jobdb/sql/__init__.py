"""The JobDB's SQL, written once for every backend and split by who uses it.

* ``schema.py``: :class:`SQLSchema`, what a backend provides (connection, dialect, locks), the
  tables and the datasets; the ground of the others;
* ``routing.py``: the router's ``add`` with its marker, ``marker``, ``end_offsets``;
* ``coverage.py``: the spans of offsets routed per destination, which backfill reads;
* ``directing.py``: the director's ``buckets``, ``pending``, ``unpaged``, ``record``,
  ``datasets``;
* ``batching.py``: batches and their steps (written inside ``record``), ``open_batches``,
  ``batch_history``;
* ``archiving.py``: the director's upkeep, ``archivable``, ``archive``, ``drop_orphans``;
* ``reading.py``: the readers', ``history``, ``states``, ``summary``, ``jobs_of``, ``jobs_with``;
* ``leasing.py``: partition leases on the director's own connection, directors' heartbeats;
* ``forgetting.py``: ``forget_jobs``, ``exactly forget``'s: a person's jobs expired and emptied;
* ``controls.py``: ``controls`` and ``set_control``, what operators and the director set per
  destination;
* ``rows.py``: a job's columns and how a row becomes a job or a transition.

A backend (``sqlite.py``, ``postgres.py``, ``mysql.py`` beside this package) subclasses
:class:`SQLJobDB` and writes the abstract methods of :class:`SQLSchema` (its connection, dialect
and locks), and ``sqlite.py`` its own leases; it is the one implementation of every face in
``faces.py``.
"""

from __future__ import annotations

from exactly.delivery.jobdb.sql.archiving import Archiving
from exactly.delivery.jobdb.sql.controls import Controls
from exactly.delivery.jobdb.sql.directing import Directing
from exactly.delivery.jobdb.sql.forgetting import Forgetting
from exactly.delivery.jobdb.sql.leasing import Leasing
from exactly.delivery.jobdb.sql.reading import Reading
from exactly.delivery.jobdb.sql.routing import Routing
from exactly.delivery.jobdb.sql.schema import MARKER_COLUMNS, SQLSchema

__all__ = ["MARKER_COLUMNS", "SQLJobDB", "SQLSchema"]


class SQLJobDB(Routing, Directing, Archiving, Reading, Controls, Leasing, Forgetting):
    """The JobDB in SQL, for every backend: they give a connection, a dialect and their locks.
    :func:`~exactly.delivery.jobdb.open_jobdb` returns one (as ``JobDB``); each user takes it
    through the face of its role (:mod:`exactly.delivery.jobdb.faces`)."""
