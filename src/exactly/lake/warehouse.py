"""The segment layout's tables beside ``events``, each committed exactly once per micro-batch.

:mod:`exactly.lake.segment` shapes a micro-batch into rows per table; a :class:`Warehouse`
commits them to the tables of the events table's backend (:meth:`LakeTable.sibling
<exactly.lake.base.LakeTable.sibling>`: the same directory, namespace and catalog, or schema).
One micro-batch commits to many tables, each in **its own transaction with the marker**, so per
table (:meth:`Warehouse.commit`):

1. **the marker**: a table whose marker has the batch is skipped (``replayed``);
2. **the rows conformed**: done by :func:`~exactly.lake.segment.shape` against the schemas this
   warehouse read (:meth:`Warehouse.schemas`): every column of the table after the batch, new
   ones last, bigints widened to double where the backend can (``can_widen``);
3. **one transaction**: the new (and widened) columns, the rows and the marker.

A run killed between two tables left some tables with the batch and some without; the batch run
again commits only the tables still missing it, so every table holds each row once.

``users`` and ``accounts`` are merged, not appended (:mod:`~exactly.lake.segment.users`): the
stored rows of the batch's ids are read (:meth:`LakeTable.lookup`), merged per trait with the
batch's profiles, and written back by key (Delta MERGE, Iceberg overwrite by ``id IN``,
PostgreSQL ``ON CONFLICT``) in one transaction with the marker, so a replayed batch is skipped
like any other. The marker is not what makes this right, though: the merge keeps per trait the
value with the greatest stamp (time, messageId, JSON text), a maximum, so merging a batch into
rows that already hold it gives the same rows. Were the marker check skipped, a replay would
rewrite every row of its ids unchanged; batches in any order give the same table.

Single writer per query (Spark's checkpoint lock), as for ``events``: the schemas read once are
kept and updated from each commit, and step 1 reads the marker before the transaction (inside
it too on PostgreSQL). A commit that fails forgets them, so the next batch reads them again.

Cost: a table a batch has rows for costs one commit (Delta: a log entry; Iceberg: a metadata
file and a catalog swap; PostgreSQL: a transaction), so a batch's cost grows with the number of
event names it holds, not with the number of tables there are; docs/segment.md has the figures
for 300 tables. The lake formats commit tables on ``workers`` threads (each table is its own
log or metadata file); PostgreSQL's tables share one connection and commit one after another.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from types import TracebackType
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]

from exactly.lake import open_table
from exactly.lake.base import LakeTable, Marker
from exactly.lake.segment import (
    Limits,
    Profile,
    Shaped,
    TableBatch,
    merge_all,
    profile_of_row,
    profile_rows,
    profiles,
    schema_kinds,
    shape,
)
from exactly.lake.segment.table import REJECTED
from exactly.lake.segment.users import MERGED, Merged

KEY = "id"


@dataclass(frozen=True)
class Outcome:
    """What one table did with a batch: ``committed`` False when its marker already had the
    batch (a replay: nothing written); ``rows`` how many rows it wrote (merged, for ``users``
    and ``accounts``)."""

    committed: bool
    rows: int


@dataclass(frozen=True)
class Batch:
    """A micro-batch shaped for the warehouse: the appended tables' rows and the profiles to
    merge into ``users`` and ``accounts`` (table -> id -> profile)."""

    shaped: Shaped
    profiles: Mapping[Merged, Mapping[str, Profile]]

    @property
    def tables(self) -> list[str]:
        """The tables the batch writes to."""
        return sorted([*self.shaped.tables, *(t for t, p in self.profiles.items() if p)])


Progress = Callable[[str, Outcome], None]


class Warehouse:
    """Segment's tables beside an ``events`` table (module docstring: the protocol)."""

    def __init__(
        self, events: LakeTable, *, limits: Limits | None = None, workers: int = 4
    ) -> None:
        self.events = events
        self.owns_events = False  # closed with the warehouse only when it opened it (open)
        self.limits = limits or Limits()
        self.can_widen = events.can_widen
        self.workers = workers if events.parallel_commits else 1
        self._tables: dict[str, LakeTable] = {}
        self._kinds: dict[str, dict[str, str]] | None = None

    @classmethod
    def open(cls, events_url: str, **options: Any) -> Warehouse:
        """The warehouse beside the events table at ``events_url``
        (:func:`~exactly.lake.open_table`'s URLs)."""
        warehouse = cls(open_table(events_url), **options)
        warehouse.owns_events = True
        return warehouse

    def table(self, name: str) -> LakeTable:
        """The table ``name`` of the layout, opened once."""
        if name not in self._tables:
            self._tables[name] = self.events.sibling(name)
        return self._tables[name]

    # readers

    def tables(self) -> list[str]:
        """The layout's tables that exist: every table beside ``events`` but itself."""
        return [name for name in self.events.siblings() if name != self.events.name]

    def read(self, name: str) -> pa.Table:
        """Every row of the table ``name`` (none when it does not exist)."""
        return self.table(name).read()

    def committed(self, query_id: str) -> dict[str, int | None]:
        """Per table that exists, the last batch of ``query_id`` it committed (None: none),
        so that ``exactly status`` shows each table's lag behind ``events``."""
        return {name: self.table(name).committed(query_id) for name in self.tables()}

    def rejects(self, name: str) -> dict[str, int]:
        """The values table ``name`` keeps in ``_rejected``, counted per column (the key they
        are kept under: a column's name, or the dotted path of a value that lost its column to
        another value of its row), for ``exactly status``. Reads that one column."""
        counted: Counter[str] = Counter()
        for text in self.table(name).present(REJECTED).to_pylist():
            try:
                found = orjson.loads(text)
            except orjson.JSONDecodeError:
                continue
            if isinstance(found, dict):
                counted.update(found.keys())
        return dict(sorted(counted.items()))

    def schemas(self) -> dict[str, dict[str, str]]:
        """Each existing table's columns as kinds, read once and then kept from the commits."""
        if self._kinds is None:
            kinds = {}
            for name in self.tables():
                schema = self.table(name).schema()
                if schema is not None:
                    kinds[name] = schema_kinds(schema)
            self._kinds = kinds
        return self._kinds

    # writing

    def shape(self, events: Iterable[Mapping[str, Any]], *, loaded_at: datetime) -> Batch:
        """``events`` (Segment events, as the ``events`` topic holds them) as a :class:`Batch`
        of the tables as they are."""
        found = list(events)
        shaped = shape(
            found,
            self.schemas(),
            loaded_at=loaded_at,
            limits=self.limits,
            can_widen=self.can_widen,
        )
        merged = {name: profiles(found, table=name, limits=self.limits) for name in MERGED}
        return Batch(shaped, merged)

    def write(
        self,
        events: Iterable[Mapping[str, Any]],
        marker: Marker,
        *,
        loaded_at: datetime,
        progress: Progress | None = None,
    ) -> dict[str, Outcome]:
        """:meth:`shape` then :meth:`commit`: what the lake query runs per micro-batch."""
        return self.commit(self.shape(events, loaded_at=loaded_at), marker, progress=progress)

    def commit(
        self, batch: Batch, marker: Marker, *, progress: Progress | None = None
    ) -> dict[str, Outcome]:
        """Each table of ``batch`` committed in its own transaction with ``marker`` (module
        docstring, steps 1-3); per table, what it did. ``progress`` hears of each table as it is
        done (for the crash tests: a kill between two tables)."""
        appended = [batch.shaped.tables[name] for name in sorted(batch.shaped.tables)]
        merged = [(name, found) for name, found in batch.profiles.items() if found]
        jobs: list[Callable[[], tuple[str, Outcome]]] = [
            *(partial(self._append, found, marker) for found in appended),
            *(partial(self._merge, name, found, marker) for name, found in merged),
        ]
        outcomes: dict[str, Outcome] = {}
        try:
            if self.workers > 1 and len(jobs) > 1:
                with ThreadPoolExecutor(self.workers, thread_name_prefix="warehouse") as pool:
                    for name, outcome in pool.map(lambda job: job(), jobs):
                        outcomes[name] = outcome
                        if progress is not None:
                            progress(name, outcome)
            else:
                for job in jobs:
                    name, outcome = job()
                    outcomes[name] = outcome
                    if progress is not None:
                        progress(name, outcome)
        except BaseException:
            self._kinds = None  # a table may have changed or not: read them again
            raise
        return dict(sorted(outcomes.items()))

    def _append(self, found: TableBatch, marker: Marker) -> tuple[str, Outcome]:
        # 1. the marker, 2. conformed by shape(), 3. one transaction
        committed = self.table(found.table).commit_shaped(found.rows, marker)
        self._learn(found, committed)
        return found.table, Outcome(committed, found.rows.num_rows if committed else 0)

    def _merge(
        self, name: Merged, found: Mapping[str, Profile], marker: Marker
    ) -> tuple[str, Outcome]:
        table = self.table(name)
        # 1. the marker
        if table.replayed(marker):
            return name, Outcome(committed=False, rows=0)
        # 2. the stored rows of the batch's ids, merged with its profiles, typed
        stored = table.lookup(KEY, sorted(found))
        merged = merge_all((profile_of_row(row) for row in stored.to_pylist()), found.values())
        rows = profile_rows(
            merged.values(),
            self.schemas().get(name),
            table=name,
            limits=self.limits,
            can_widen=self.can_widen,
        )
        # 3. one transaction: the rows replace those of their ids, with the marker
        committed = table.commit_shaped(rows.rows, marker, key=KEY)
        self._learn(rows, committed)
        return name, Outcome(committed, rows.rows.num_rows if committed else 0)

    def _learn(self, found: TableBatch, committed: bool) -> None:
        """The table's columns after a commit. A skipped table (a replay) keeps those read
        before the batch was shaped: they are what it holds."""
        if self._kinds is not None and committed:
            self._kinds[found.table] = dict(found.kinds)

    def close(self) -> None:
        for table in self._tables.values():
            table.close()
        self._tables.clear()
        if self.owns_events:  # the lake query's table is its caller's to close
            self.events.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
