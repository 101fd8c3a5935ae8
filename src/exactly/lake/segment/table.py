"""One table's share of a micro-batch, typed: the rows as Arrow and how the table changes.

:func:`build` takes the table's rows as :class:`Draft` s (column -> value as sent), the table's
own columns (fixed kinds: ``id``, ``received_at`` …) and the columns it has (None: a new table),
and gives a :class:`TableBatch`:

1. **columns admitted**: the batch's new data columns, as many as ``Limits.columns`` leaves room
   for (:func:`~exactly.lake.segment.limits.admit`); a held-back column's values go to
   ``_rejected``;
2. **kinds**: a new column's inferred from the batch (:func:`~exactly.lake.segment.kinds.infer`),
   a known column's widened where it must and can (:func:`~exactly.lake.segment.kinds.widen`);
3. **cells**: each value typed to its column; one that does not fit is null there and kept as
   sent in the row's ``_rejected`` JSON under the column's name, beside the values that lost their
   column to another value of the row (under their dotted path); ``rejects`` counts them all per
   column.

The rows hold every column of the table after the batch: the known ones in their order, then the
new ones (the table's own first, then the data's by name), null where a row has no value. New
columns and widened kinds are meant to be added in the transaction that writes the rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from exactly.errors import LakeError
from exactly.lake.columns import KINDS
from exactly.lake.segment.kinds import cell, fits, infer_counts, json_text, needs_double, value_kind
from exactly.lake.segment.limits import Limits, admit

REJECTED = "_rejected"
_KIND_TESTS = (  # a stored column's Arrow type -> its kind
    ("boolean", pa.types.is_boolean),
    ("bigint", pa.types.is_integer),
    ("double", pa.types.is_floating),
    ("timestamp", pa.types.is_timestamp),
    ("string", pa.types.is_string),
    ("string", pa.types.is_large_string),
    ("string", pa.types.is_string_view),
)


@dataclass
class Draft:
    """One row before typing: ``cells`` column -> value as sent (a scalar, or an array's JSON
    text); ``lost`` the values that lost their column to another value of the row, as
    {dotted path: (column, value)} (:func:`~exactly.lake.segment.names.place`)."""

    cells: dict[str, Any]
    lost: dict[str, tuple[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class TableBatch:
    """A table's rows of one micro-batch and what the table must become to take them."""

    table: str
    rows: pa.Table
    kinds: dict[str, str]  # every column of the table after the batch -> its kind, in order
    new_columns: dict[str, str]  # the columns to add, in order -> kind
    widened: dict[str, str]  # the known columns whose kind changes -> the new kind
    rejects: dict[str, int]  # column -> values of it kept in _rejected
    held_back: tuple[str, ...] = ()  # new columns past Limits.columns (values in _rejected)


def schema_kinds(schema: pa.Schema) -> dict[str, str]:
    """A stored table's columns as :func:`build` takes them (column -> kind, in order), from its
    Arrow schema: any integer is bigint, any float double, any text string, any timestamp
    timestamp. Another type raises :class:`~exactly.errors.LakeError`: the segment layout did
    not make that column."""
    kinds = {}
    for found in schema:
        kind = next((k for k, test in _KIND_TESTS if test(found.type)), None)
        if kind is None:
            raise LakeError(
                f"column {found.name} is {found.type}: a segment table's columns are "
                f"{', '.join(KINDS)}; drop or rename that column"
            )
        kinds[found.name] = kind
    return kinds


@dataclass
class Tally:
    """What decides a table's columns in a batch (:func:`decide`), counted from its drafts:
    ``rows``; per column the non-null values by kind; the columns given a value only a double
    holds (:func:`~exactly.lake.segment.kinds.needs_double`). Tallies of the parts of a batch
    add up (:meth:`add`) to the whole batch's, in any order."""

    rows: int = 0
    kinds: dict[str, Counter[str]] = field(default_factory=dict)
    doubles: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, drafts: Sequence[Draft]) -> Tally:
        found = cls(len(drafts))
        kinds, doubles = found.kinds, found.doubles
        for draft in drafts:
            for column, value in draft.cells.items():
                kind = value_kind(value)
                if kind is None:
                    continue
                counts = kinds.get(column)  # not setdefault: a Counter made per cell costs
                if counts is None:
                    counts = kinds[column] = Counter()
                counts[kind] += 1
                if kind == "double" and column not in doubles and needs_double(value):
                    doubles.add(column)
        return found

    def add(self, other: Tally) -> Tally:
        """This tally and ``other`` (of another part of the batch) as one."""
        kinds = {column: Counter(found) for column, found in self.kinds.items()}
        for column, found in other.kinds.items():
            kinds.setdefault(column, Counter()).update(found)
        return Tally(self.rows + other.rows, kinds, self.doubles | other.doubles)


@dataclass(frozen=True)
class Columns:
    """What a table's columns become with a batch (:func:`decide`, steps 1-2 of the module
    docstring); given them, each row types alone (:func:`typed`)."""

    kinds: dict[str, str]  # every column of the table after the batch -> its kind, in order
    new_columns: dict[str, str]  # the columns to add, in order -> kind
    widened: dict[str, str]  # the known columns whose kind changes -> the new kind
    held_back: tuple[str, ...] = ()  # new columns past Limits.columns (values in _rejected)


def build(
    table: str,
    drafts: Sequence[Draft],
    own: Mapping[str, str],
    known: Mapping[str, str] | None,
    *,
    limits: Limits,
    can_widen: bool,
) -> TableBatch:
    """``drafts`` typed for ``table`` (module docstring, steps 1-3)."""
    found = decide(Tally.of(drafts), own, known, limits=limits, can_widen=can_widen)
    return typed(table, drafts, found)


def decide(
    tally: Tally,
    own: Mapping[str, str],
    known: Mapping[str, str] | None,
    *,
    limits: Limits,
    can_widen: bool,
) -> Columns:
    """The table's columns after a batch whose drafts counted ``tally`` (module docstring,
    steps 1-2): a function of the counts alone."""
    known = dict(known or {})
    own = {**own, REJECTED: own.get(REJECTED, "string")}  # every table keeps its rejects
    # 1. columns admitted
    fixed = {**known, **{name: kind for name, kind in own.items() if name not in known}}
    wanted = {c: sum(found.values()) for c, found in tally.kinds.items() if c not in fixed}
    admitted, held_back = admit(wanted, limits.columns - len(fixed))
    # 2. kinds
    kinds = {
        column: "double" if can_widen and kind == "bigint" and column in tally.doubles else kind
        for column, kind in fixed.items()
    }
    new_data = {
        column: infer_counts(tally.kinds[column]) or "string" for column in sorted(admitted)
    }
    kinds.update(new_data)
    new_columns = {c: k for c, k in kinds.items() if c not in known}
    widened = {c: k for c, k in kinds.items() if c in known and known[c] != k}
    return Columns(kinds, new_columns, widened, tuple(held_back))


def typed(table: str, drafts: Sequence[Draft], columns: Columns) -> TableBatch:
    """``drafts`` as rows of ``table`` with ``columns`` (module docstring, step 3): row by
    row, so the rows of a batch's parts typed apart are the rows of the whole."""
    kinds = columns.kinds
    # 3. cells
    rejects: Counter[str] = Counter()
    rejected = [{key: value for key, (_, value) in draft.lost.items()} for draft in drafts]
    # one pass over the cells a row has (not over every column of every row: rows are sparse)
    cells: dict[str, list[Any]] = {column: [None] * len(drafts) for column in kinds}
    for at, (draft, kept) in enumerate(zip(drafts, rejected, strict=True)):
        rejects.update(column for column, _ in draft.lost.values())
        for column, value in draft.cells.items():
            if value is None:
                continue
            kind = kinds.get(column)
            if kind is None or not fits(value, kind):
                kept[column] = value
                rejects[column] += 1
            elif column not in kept:
                cells[column][at] = cell(value, kind)
    cells[REJECTED] = [json_text(kept) if kept else None for kept in rejected]
    schema = pa.schema([pa.field(column, KINDS[kind]) for column, kind in kinds.items()])
    rows = pa.Table.from_pydict(cells, schema=schema)
    return TableBatch(
        table,
        rows,
        kinds,
        columns.new_columns,
        columns.widened,
        dict(sorted(rejects.items())),
        columns.held_back,
    )
