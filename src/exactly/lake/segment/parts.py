"""A micro-batch shaped in parts (one per Spark task), merged into what :func:`~.shape.shape`
gives for the whole batch in one piece.

What :func:`~.shape.shape` decides for a batch is a function of counts (:class:`~.table.Tally`):
which new event tables fit (rows per table), which new columns fit and their kinds (values per
column and kind), which bigint columns widen (a value only a double holds). Everything else is
row by row: a row's cells and its ``_rejected`` follow from the event and the kinds of the
columns it has values for (:func:`~.table.typed`). So:

1. **each part alone** (:func:`shape_part`, on an executor): its events' rows per table, typed
   with the columns its own tally decides, and the tally; its ``users`` and ``accounts``
   profiles;
2. **the driver settles** (:func:`settle`): the tallies summed decide each table's columns and
   the held-back tables exactly as the whole batch would. A part whose every column with a
   value got the kind (or was held back) as in the whole is right as it is: its rows only
   lack the columns it had no value for, which are null. A part that decided otherwise (a new
   column with ``12`` in one part and ``12.5`` in another; a column admitted in one part and
   held back by ``Limits.columns`` in the whole) puts its table on the ``redo`` list;
3. **the redo tables retyped** (rare: only a batch that brings new columns or widens one can
   disagree): each part types its rows of those tables with the settled columns
   (``decided``), which gives the whole's rows by step 2's argument;
4. **merged** (:func:`combine`): each table's parts conformed to its columns and concatenated in
   the parts' order, rejects summed; the profiles merged per id (:func:`~.users.merge_all`: per
   trait a maximum, so any grouping gives the same profile).

:func:`shape_in_parts` runs the four steps with a function that runs step 1 (or 3) over every
part; :mod:`exactly.lake.shaping` gives one that runs them as Spark tasks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from exactly.lake.columns import KINDS
from exactly.lake.segment.limits import Limits
from exactly.lake.segment.shape import Shaped, drafts, held_tables, own_columns
from exactly.lake.segment.table import Columns, TableBatch, Tally, decide, typed
from exactly.lake.segment.users import MERGED, Merged, Profile, merge_all, profiles


@dataclass(frozen=True)
class Part:
    """One part of a batch shaped alone: per table its rows (typed with the columns of
    ``decided``, or else its own tally's) and that tally; the profiles it makes per merged
    table (none when ``decided``: step 3 retypes rows only)."""

    tables: dict[str, TableBatch]
    tallies: dict[str, Tally]
    profiles: dict[Merged, dict[str, Profile]]


@dataclass(frozen=True)
class Settled:
    """The whole batch's decisions: each table's columns after it, the tables
    ``Limits.tables`` holds back (table -> events), and the tables some part typed otherwise."""

    columns: dict[str, Columns]
    held_back: dict[str, int]
    redo: tuple[str, ...]


def shape_part(
    events: Iterable[Mapping[str, Any]],
    schemas: Mapping[str, Mapping[str, str]],
    *,
    loaded_at: datetime,
    limits: Limits,
    can_widen: bool,
    decided: Mapping[str, Columns] | None = None,
) -> Part:
    """Step 1 (``decided`` None: every table of the part, typed with its own tally's columns;
    no table is held back here, :func:`settle` drops those the whole holds back) or step 3
    (only the tables of ``decided``, typed with those columns)."""
    found = list(events)
    rows = drafts(found, loaded_at=loaded_at, limits=limits)
    tables, tallies = {}, {}
    for table in sorted(rows):
        if decided is not None:
            if table in decided:
                tables[table] = typed(table, rows[table], decided[table])
            continue
        tally = Tally.of(rows[table])
        mine = decide(
            tally, own_columns(table), schemas.get(table), limits=limits, can_widen=can_widen
        )
        tables[table], tallies[table] = typed(table, rows[table], mine), tally
    made: dict[Merged, dict[str, Profile]] = {}
    if decided is None:
        made = {name: profiles(found, table=name, limits=limits) for name in MERGED}
    return Part(tables, tallies, made)


def settle(
    parts: Sequence[Part],
    schemas: Mapping[str, Mapping[str, str]],
    *,
    limits: Limits,
    can_widen: bool,
) -> Settled:
    """Step 2: the whole batch's decisions from the parts' tallies, and which tables to redo."""
    whole: dict[str, Tally] = {}
    for part in parts:
        for table, tally in part.tallies.items():
            whole[table] = whole[table].add(tally) if table in whole else tally
    held = held_tables({table: tally.rows for table, tally in whole.items()}, schemas, limits)
    columns = {
        table: decide(
            tally, own_columns(table), schemas.get(table), limits=limits, can_widen=can_widen
        )
        for table, tally in sorted(whole.items())
        if table not in held
    }
    redo = tuple(
        table
        for table, settled in columns.items()
        if not all(agrees(part, table, settled) for part in parts)
    )
    return Settled(columns, held, redo)


def agrees(part: Part, table: str, settled: Columns) -> bool:
    """Whether ``part``'s rows of ``table`` are the whole's: every column it has a value for
    has the kind the whole gives it, or is held back in both."""
    if table not in part.tables:
        return True
    mine = part.tables[table].kinds
    return all(
        mine.get(column) == settled.kinds.get(column) for column in part.tallies[table].kinds
    )


def combine(parts: Sequence[Part], settled: Settled, redone: Sequence[Part] = ()) -> Shaped:
    """Step 4: each table's rows from the parts (from ``redone`` for the redo tables),
    conformed to its columns and concatenated in the parts' order."""
    tables = {}
    for table, columns in settled.columns.items():
        source = redone if table in settled.redo else parts
        found = [part.tables[table] for part in source if table in part.tables]
        schema = pa.schema([pa.field(c, KINDS[kind]) for c, kind in columns.kinds.items()])
        rejects: Counter[str] = Counter()
        for batch in found:
            rejects.update(batch.rejects)
        rows = pa.concat_tables([schema.empty_table()] + [conform(b.rows, schema) for b in found])
        tables[table] = TableBatch(
            table,
            rows,
            columns.kinds,
            columns.new_columns,
            columns.widened,
            dict(sorted(rejects.items())),
            columns.held_back,
        )
    return Shaped(tables, settled.held_back)


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with the columns of ``schema``: a column they lack is null; one whose kind
    differs holds only nulls here (:func:`agrees`), so the cast is exact."""
    arrays = [
        rows.column(f.name).cast(f.type)
        if f.name in rows.column_names
        else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def merged_profiles(parts: Sequence[Part]) -> dict[Merged, dict[str, Profile]]:
    """Step 4 for ``users`` and ``accounts``: every part's profiles merged per id."""
    return {
        name: merge_all(*(part.profiles.get(name, {}).values() for part in parts))
        for name in MERGED
    }


Run = Callable[[Mapping[str, Columns] | None], Sequence[Part]]


def shape_in_parts(
    run: Run,
    schemas: Mapping[str, Mapping[str, str]],
    *,
    limits: Limits,
    can_widen: bool,
) -> tuple[Shaped, dict[Merged, dict[str, Profile]]]:
    """Steps 1-4 (module docstring): ``run(None)`` shapes every part alone (:func:`shape_part`),
    ``run(decided)`` retypes them; the batch as :func:`~.shape.shape` and
    :func:`~.users.profiles` give it for the whole."""
    parts = run(None)  # 1.
    settled = settle(parts, schemas, limits=limits, can_widen=can_widen)  # 2.
    redone: Sequence[Part] = ()
    if settled.redo:  # 3.
        redone = run({table: settled.columns[table] for table in settled.redo})
    return combine(parts, settled, redone), merged_profiles(parts)  # 4.
