"""Column kinds of the segment layout: inferred from the data, widened, and what fits.

The kinds are the lake's (the keys of :data:`exactly.lake.columns.KINDS`): ``boolean``, ``bigint``,
``double``, ``timestamp`` (UTC, microseconds) and ``string``. A value's own kind
(:func:`value_kind`) is its JSON type: true or false is boolean; an integer is bigint (one past
64 bits is double); a number with a fraction or an exponent is double; text that is an ISO-8601
date *and time of day* is timestamp (without an offset it is UTC; a date alone is a string, as a
birthday is a day and not an instant); other text, and an array's JSON text, is string. Text
never counts as a number or a boolean: ``"12.5"`` is a string. (A Python ``datetime``, as the
loader's own ``uuid_ts``, is a timestamp.)

**A new column's kind** (:func:`infer`) is the kind of most of the batch's non-null values for
it, where bigint values count for double when the batch also has doubles. A tie goes to the first
of timestamp, double, bigint, boolean, string: a typed column the analyst can sum and compare
over a text one. The rule counts, it never looks at order, so a batch gives the same kind however
its rows are ordered; the values that do not fit the kind it chose are rejects (below).

**What fits a column** (:func:`fits`): its kind's values and, without loss, some others. A string
column takes every value (a number or boolean as its JSON text); a double column takes integers
a double holds exactly; a bigint column takes doubles with no fraction inside 64 bits; a
timestamp column takes timestamp text; a boolean column only booleans.

**Widening** (:func:`widen`): a bigint column becomes double when a value arrives that a double
holds and a bigint does not (``12.5``), where the table's format can change the type
(``can_widen``: PostgreSQL can, ``ALTER COLUMN … TYPE double precision``; the type widening of
Delta and of Iceberg goes from bigint to decimal only, so there the value is a reject); nothing
else ever changes a column's kind.

**Rejects**: a value that does not fit its column is null there and kept whole, as sent, in the
row's ``_rejected`` JSON object under the column's name (:mod:`exactly.lake.segment.table`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

KIND_ORDER = ("timestamp", "double", "bigint", "boolean", "string")  # ties go to the first
_LOW, _HIGH = -(2**63), 2**63 - 1
_UNSEEN = object()
_INSTANTS_KEPT = 100_000  # texts whose time (or none) is kept for the next ask
_instants: dict[str, datetime | None] = {}
_INSTANT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.,][0-9]{1,9})?)?"
    r"([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)?"
)


def instant(text: str) -> datetime | None:
    """``text`` as a UTC time when it is an ISO-8601 date and time of day, else None.

    A value is asked about several times as its batch is shaped (its kind counted, checked
    against its column, stored), so the times found are kept for the next asks (a bounded
    dict, emptied when full); most text is not a time and is told so by its first characters.
    """
    if len(text) < 16 or text[4] != "-" or not text[0].isdigit():
        return None
    found = _instants.get(text, _UNSEEN)
    if found is not _UNSEEN:
        return found  # type: ignore[return-value]
    if len(_instants) >= _INSTANTS_KEPT:
        _instants.clear()
    found = _instants[text] = _parsed(text)
    return found


def _parsed(text: str) -> datetime | None:
    if not _INSTANT.fullmatch(text):
        return None
    try:
        found = datetime.fromisoformat(text.replace(",", "."))
    except ValueError:
        return None
    return _utc(found)


def _utc(found: datetime) -> datetime:
    return found.replace(tzinfo=UTC) if found.tzinfo is None else found.astimezone(UTC)


def value_kind(value: Any) -> str | None:
    """The kind of one value (module docstring); None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint" if _LOW <= value <= _HIGH else "double"
    if isinstance(value, float):
        return "double"
    if isinstance(value, datetime) or (isinstance(value, str) and instant(value) is not None):
        return "timestamp"
    return "string"


def infer(values: Iterable[Any]) -> str | None:
    """The kind of a new column holding ``values`` (module docstring); None when all are null."""
    return infer_counts(Counter(kind for kind in map(value_kind, values) if kind is not None))


def infer_counts(counts: Mapping[str, int]) -> str | None:
    """:func:`infer` from the values' kinds counted (kind -> values): a sum of counts gives
    the kind of the union, so parts of a batch counted apart infer what the whole does."""
    found = Counter({kind: n for kind, n in counts.items() if n})
    if not found:
        return None
    if found["double"] and found["bigint"]:
        found["double"] += found.pop("bigint")
    return max(KIND_ORDER, key=lambda kind: (found[kind], -KIND_ORDER.index(kind)))


def fits(value: Any, kind: str) -> bool:
    """Whether a column of ``kind`` holds ``value`` without changing it (null fits anywhere)."""
    if value is None or kind == "string":
        return True
    if kind == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "bigint":
        if isinstance(value, float):
            return value.is_integer() and _LOW <= value <= _HIGH
        return isinstance(value, int) and _LOW <= value <= _HIGH
    if kind == "double":
        if isinstance(value, int):
            return _exact_double(value)
        return isinstance(value, float)
    if kind == "timestamp":
        return value_kind(value) == "timestamp"
    raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KIND_ORDER)}")


def cell(value: Any, kind: str) -> Any:
    """``value`` as a column of ``kind`` stores it; ``value`` must fit (:func:`fits`)."""
    if value is None:
        return None
    if kind == "string":
        if isinstance(value, datetime):
            return _utc(value).isoformat()
        return value if isinstance(value, str) else json_text(value)
    if kind == "bigint":
        return int(value)
    if kind == "double":
        return float(value)
    if kind == "timestamp":
        return _utc(value) if isinstance(value, datetime) else instant(value)
    return value


def widen(kind: str, values: Iterable[Any], *, can_widen: bool) -> str:
    """The kind of a column of ``kind`` once it takes ``values``: double for a bigint column
    given a value only a double holds, where the format allows (``can_widen``); else ``kind``."""
    if kind != "bigint" or not can_widen:
        return kind
    return "double" if any(map(needs_double, values)) else kind


def needs_double(value: Any) -> bool:
    """Whether ``value`` is one a double column holds and a bigint column does not (``12.5``):
    what makes :func:`widen` widen."""
    return not fits(value, "bigint") and fits(value, "double")


def json_text(value: Any) -> str:
    """``value`` as compact JSON, keys sorted (so equal values are equal text); integers past
    64 bits too, which orjson refuses."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _exact_double(value: int) -> bool:
    try:
        return int(float(value)) == value
    except OverflowError:
        return False
