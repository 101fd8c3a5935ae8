"""The lake table interface: micro-batches appended exactly once, and the table's upkeep.

A batch is an Arrow table of the lake's rows (:mod:`exactly.lake.columns`) with its
:class:`Marker`: the streaming query's id and the micro-batch's id. :meth:`LakeTable.append` is
the commit protocol every backend shares:

1. **the marker**: the last batch the table committed for the query
   (:meth:`~LakeTable.committed`); a batch at or below it is a replay and commits nothing;
2. **the rows conformed** to the table's schema: its columns in its order and types, null where
   the batch lacks one, the batch's new columns after them (:func:`~exactly.lake.columns.conform`);
3. **one transaction** (:meth:`~LakeTable.commit`): the new columns added, the rows and the
   marker committed together, so a reader sees the batch whole with its marker or neither.

The lake formats take the batch as files instead (:meth:`~LakeTable.append_files`): the
executors write the Parquet files (:meth:`~LakeTable.file_writer`, :mod:`exactly.lake.files`)
and step 3 commits them, the new columns and the marker in one transaction
(:meth:`~LakeTable.commit_files`).

A batch killed before step 3 leaves at most files no version refers to (a lake format's data
files): readers never see them, and :meth:`~LakeTable.vacuum` removes them.

Single writer per query: Spark's checkpoint lock keeps one run of a query at a time; step 1
reads the marker outside the transaction, and the backends check it again inside only where the
store can (PostgreSQL); the lake formats rely on that lock.

**Siblings.** The segment layout's tables (:mod:`exactly.lake.warehouse`) sit beside ``events``
on its backend (:meth:`~LakeTable.sibling`): unpartitioned, any columns, written by the same
steps with step 2 done by :func:`~exactly.lake.segment.shape` against their schemas, and
``users`` and ``accounts`` by :meth:`~LakeTable.commit` with a ``key``: their rows replace the
stored rows of the same key in the marker's transaction.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import ClassVar

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from exactly.errors import LakeError
from exactly.forget.regulations import ANONYMOUS, USER, Forgotten
from exactly.lake.columns import conform
from exactly.lake.files import DataFile, FileWriter

__all__ = [
    "Compaction",
    "DataFile",
    "FileWriter",
    "LakeTable",
    "Marker",
    "Standing",
    "end_offsets_from",
]


@dataclass(frozen=True)
class Marker:
    """Which micro-batch of which streaming query a batch of rows is, and where in the topic
    it ends (the source's end offsets by partition; None when unknown): a new query over the
    table starts there (:meth:`LakeTable.end_offsets`)."""

    query_id: str
    batch_id: int
    end_offsets: Mapping[int, int] | None = None

    @property
    def end_text(self) -> str | None:
        """The end offsets as stored beside the marker: JSON, partitions as text."""
        if self.end_offsets is None:
            return None
        return json.dumps({str(p): int(self.end_offsets[p]) for p in sorted(self.end_offsets)})


def end_offsets_from(text: str | None) -> dict[int, int] | None:
    """:attr:`Marker.end_text` read back; None for none or for text that is not offsets."""
    if not text:
        return None
    try:
        found = json.loads(text)
        return {int(partition): int(offset) for partition, offset in found.items()}
    except (ValueError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class Landing:
    """The table version a record landed in; ``exact`` False: at or before it (the versions
    before it have expired)."""

    version: int
    exact: bool = True


@dataclass(frozen=True)
class Standing:
    """Where a table stands, read at once: its version, rows and newest end offsets."""

    version: int | None
    rows: int
    end_offsets: dict[int, int] | None


@dataclass(frozen=True)
class Compaction:
    """What :meth:`LakeTable.optimize` did: files (or row groups) before and after."""

    files_removed: int
    files_added: int


class LakeTable(ABC):
    """A table of events in a lake format or a warehouse, written a micro-batch at a time."""

    #: the URL with its secrets masked (:func:`exactly.urls.redact`): safe to print
    url: str
    #: the table's name among its siblings (``events``)
    name: str
    #: whether commits to different siblings may run at once (no shared connection)
    parallel_commits: ClassVar[bool] = True
    #: whether a bigint column can become double inside a commit (PostgreSQL's ``ALTER COLUMN
    #: TYPE``; Delta and Iceberg widen bigint to decimal only)
    can_widen: ClassVar[bool] = False

    def append(self, data: pa.Table, marker: Marker) -> bool:
        """Commit ``data`` with ``marker`` (module docstring, steps 1-3); False for a replay."""
        # 1. the marker
        if self.replayed(marker):
            return False
        # 2. the rows conformed to the table
        rows = conform(data, self.schema())
        # 3. one transaction: new columns, rows and marker
        return self.commit(rows, marker)

    def append_files(self, files: Sequence[DataFile], schema: pa.Schema, marker: Marker) -> bool:
        """Commit the ``files`` executors wrote, their rows conformed to ``schema`` (step 2 done
        by the writer), with ``marker``; False for a replay, whose files vacuum removes."""
        # 1. the marker
        if self.replayed(marker):
            return False
        # 3. one transaction: new columns, files and marker
        return self.commit_files(files, schema, marker)

    def commit_shaped(self, rows: pa.Table, marker: Marker, *, key: str | None = None) -> bool:
        """Steps 1 and 3 for rows conformed already (the segment layout's tables, whose step 2
        is :func:`~exactly.lake.segment.shape`): False for a replay. A backend may read the
        marker and commit on one load of the table."""
        # 1. the marker
        if self.replayed(marker):
            return False
        # 3. one transaction: new columns, rows and marker
        return self.commit(rows, marker, key=key)

    def replayed(self, marker: Marker) -> bool:
        """Whether the table holds ``marker``'s batch already: it is at or below the last batch
        committed for its query."""
        last = self.committed(marker.query_id)
        return last is not None and marker.batch_id <= last

    @abstractmethod
    def committed(self, query_id: str) -> int | None:
        """The last batch id committed for ``query_id``; None when none was."""

    @abstractmethod
    def end_offsets(self) -> dict[int, int] | None:
        """The end offsets of the newest batch committed with them, by any query: where a
        query whose checkpoint is new starts, so that it appends nothing twice."""

    @abstractmethod
    def schema(self) -> pa.Schema | None:
        """The table's columns as Arrow; None while the table does not exist."""

    @abstractmethod
    def commit(self, rows: pa.Table, marker: Marker, *, key: str | None = None) -> bool:
        """Step 3: add ``rows``'s new columns, append the rows and record the marker in one
        transaction (creating the table first if it does not exist); False when the marker
        found inside the transaction says the batch is a replay. With ``key`` (a column every
        row has, once), the rows replace the stored rows of the same key instead (MERGE,
        upsert, ``ON CONFLICT``); where :attr:`can_widen`, a bigint column the rows hold as
        double becomes double in the same transaction."""

    def sibling(self, name: str) -> LakeTable:
        """The table ``name`` beside this one on the same backend (the same directory or
        prefix, namespace and catalog, schema), sharing its connections: a table of the
        segment layout, unpartitioned, whose columns are whatever its commits bring."""
        raise LakeError(f"lake table {self.url} has no siblings")

    def siblings(self) -> list[str]:
        """The names of the tables beside this one that exist (this one among them)."""
        raise LakeError(f"lake table {self.url} has no siblings")

    def lookup(self, key: str, values: Sequence[str]) -> pa.Table:
        """The stored rows whose ``key`` column is one of ``values`` (every row of a table
        without that column: none)."""
        rows = self.read()
        if key not in rows.column_names or not values:
            return rows.schema.empty_table()
        found = pc.is_in(rows.column(key).cast(pa.string()), value_set=pa.array(list(values)))
        return rows.filter(found)

    def file_writer(self, schema: pa.Schema, marker: Marker) -> FileWriter | None:
        """The writer the executors run to write ``marker``'s batch as Parquet files of
        ``schema`` where the table's data files go; None for a table without files (PostgreSQL:
        the driver copies the rows in its SQL transaction, which executors cannot join)."""
        return None

    def commit_files(self, files: Sequence[DataFile], schema: pa.Schema, marker: Marker) -> bool:
        """Step 3 for files (:meth:`commit`'s transaction): add ``schema``'s new columns, the
        ``files`` and the marker with its end offsets in one transaction, creating the table
        first if it does not exist. Only a table that gives a :meth:`file_writer` has it."""
        raise LakeError(f"lake table {self.url} takes rows, not files")

    @abstractmethod
    def read(self) -> pa.Table:
        """Every row of the table's current version (an empty table of the base schema when
        the table does not exist yet)."""

    def landed_in(self, partition: int, offset: int) -> Landing | None:
        """The table version whose batch landed the ``events`` record at (``partition``,
        ``offset``): the first whose committed end offsets pass it; None while none does or
        where the table keeps no versions (PostgreSQL)."""
        return None

    def dataset(self) -> pa.Table | pa.dataset.Dataset:
        """The current version for a query engine (``exactly lake sql``'s DuckDB): a lazy Arrow
        dataset where the format gives one (Delta), else :meth:`read`'s rows."""
        return self.read()

    def standing(self) -> Standing:
        """:meth:`version`, :meth:`rows` and :meth:`end_offsets` (``exactly status``), from one
        load of the table where the format allows."""
        return Standing(self.version(), self.rows(), self.end_offsets())

    def rows(self) -> int:
        """How many rows the current version holds (0 without a table): from the files' or
        snapshot's metadata where the format keeps the count."""
        source = self.dataset()
        count = getattr(source, "count_rows", None)
        return int(count()) if count is not None else int(source.num_rows)

    def present(self, column: str) -> pa.Array:
        """The values of ``column`` that are not null, in no order (none when the table or the
        column does not exist): one column read, not the rows (``exactly status`` counts the
        segment layout's ``_rejected`` values so)."""
        source = self.dataset()
        if column not in source.schema.names:
            return pa.array([], pa.string())
        if hasattr(source, "to_table"):
            found = source.to_table(columns=[column], filter=pc.field(column).is_valid())
            return found.column(column).combine_chunks()
        return source.column(column).drop_null().combine_chunks()

    @abstractmethod
    def version(self) -> int | None:
        """The table's current version (Delta's version, Iceberg's snapshot id), None when it
        has none."""

    @abstractmethod
    def optimize(self) -> Compaction:
        """Compact small files; what a query of the table returns does not change."""

    @abstractmethod
    def vacuum(self, older_than: timedelta) -> list[str]:
        """Remove the files no version of the table refers to that were written more than
        ``older_than`` ago (a killed batch's); returns them. A shorter age than the longest
        write could remove the files of a batch being committed: keep it an hour or more."""

    @abstractmethod
    def expire(self, retention: timedelta) -> int:
        """Forget versions older than ``retention`` (never the current one); returns how many
        versions or files went. Their data files go with them or at the next :meth:`vacuum`."""

    def forget(self, forgotten: Forgotten, message_ids: Set[str]) -> int:
        """Delete the rows of the people ``forgotten`` names (by their id columns, or by the
        message ids of their events) and every older version and log entry that holds them
        (``exactly forget``); returns the rows deleted. Time travel to before is given up.
        Only while nothing else writes the table (the lake query's checkpoint lock held, or
        between its micro-batches)."""
        raise LakeError(f"the lake table {self.url} cannot forget rows yet")

    def forgotten_ids(self, forgotten: Forgotten, message_ids: Set[str]) -> dict[str, list[str]]:
        """Per column of this table, the values that name a forgotten person: the ids whose
        keyed hash a regulation holds (found among the column's distinct values), and the
        message ids of their events. Empty when the table holds none of them."""
        found: dict[str, list[str]] = {}
        schema = self.schema()
        names = set() if schema is None else set(schema.names)
        for column, kinds in id_columns(self.name, names):
            values = {str(v) for v in self.present(column).unique().to_pylist() if v is not None}
            if kinds:
                hits = sorted(v for v in values if any(forgotten.holds(k, v) for k in kinds))
            else:
                hits = sorted(values & message_ids)
            if hits:
                found[column] = hits
        return found

    def close(self) -> None:  # noqa: B027 - most backends hold nothing
        """Release connections."""

    def __enter__(self) -> LakeTable:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


KEYED_BY_PERSON = ("users",)  # segment tables whose ``id`` is the person's userId


def id_columns(table: str, names: Set[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The columns of a lake table that name a person or an event, with the kinds of id each
    holds (``exactly.forget.regulations``: user, anonymous; none: a message id)."""
    both = (USER, ANONYMOUS)
    wanted: list[tuple[str, tuple[str, ...]]] = [
        ("userId", (USER,)),
        ("anonymousId", (ANONYMOUS,)),
        ("user_id", (USER,)),
        ("anonymous_id", (ANONYMOUS,)),
        ("previous_id", both),
        ("messageId", ()),
    ]
    if table in KEYED_BY_PERSON:
        wanted.append(("id", (USER,)))
    elif table != "accounts":
        wanted.append(("id", ()))
    return [(column, kinds) for column, kinds in wanted if column in names]
