"""Table and column names of the segment layout: Segment's snake_case, made stable.

**Snake case** (:func:`snake`) is the behaviour of Segment's go-snakecase, which names every
table and column of Segment's warehouses. Any character that is not an ASCII letter or digit
separates words and is dropped (spaces, ``-``, ``.``, ``$``, ``:``, accented letters, emoji).
Inside a run of letters and digits a word is a run of capitals and digits followed by a run of
lower-case letters and digits, so ``sampleText`` is ``sample_text``, ``productID`` is
``product_id``, ``2FA Enabled`` is ``2fa_enabled`` and an acronym sticks to the capitalised word
after it: ``HTMLParser`` is ``htmlparser``, ``CStringRef`` is ``cstring_ref``. The words, lower
case, are joined by one ``_``. A snake name therefore never starts or ends with ``_`` and never
holds ``__``.

**Flattening** (:func:`flatten`): a nested object's keys join its parent's with ``_``
(``{"productId": {"sku": 1}}`` is ``product_id_sku``); an array is one value, its JSON text.

**Names made up here never meet names from the data.** Every name this module makes up starts
with ``_`` or holds ``__``, which a snake name never does:

* a property or trait whose column is one of its table's own columns (:func:`reserved`: ``id``,
  ``user_id``, ``event``, ``context_…``, a page's ``name`` …) keeps its value in a column of the
  same name after a ``_``: ``properties.id`` is ``_id``, ``traits.user_id`` is ``_user_id``. The
  value stays queryable under a name that follows from its own, and the table's column keeps its
  meaning. (Segment drops such values.) Reserved is per table: ``name`` and ``category`` only in
  ``pages`` and ``screens``, where they are columns. Segment's ``uuid`` and ``loaded_at`` are
  reserved everywhere too, though no table has them yet: a column of that name added later
  would otherwise rename data that already has a column.
* a table or column name longer than the backend takes (``limit`` bytes; PostgreSQL 63) keeps
  its first ``limit - 12`` bytes (without a trailing ``_``) and ends with ``__`` and ten hex
  digits of the SHA-256 of the whole name: two long names that share their start stay apart, and
  a name shortens the same way in every run and process.
* a key with no ASCII letter or digit (``名前``) is ``_unnamed__`` and ten hex digits of the
  SHA-256 of its original path.
* an event whose slug is a built-in table's name (:data:`BUILT_IN_TABLES`) has its table under
  that name with the suffix ``__event``: the event ``Users`` is the table ``users__event``.

**Colliding names share one column.** Names are a function of the original name alone, never of
what was seen before: ``productId`` and ``product_id`` are the column ``product_id`` in every
event and every batch, as in Segment, so one property that two SDKs spell differently is one
column. Where one event holds several values for one column (``{"productId": 1, "product_id":
2}``), :func:`place` keeps one, the same whatever the keys' order: the one whose keys are already
snake case, then the first path in code-point order; each other value goes to the row's
``_rejected`` under its original dotted path (``properties.productId``).

Event names that are one slug (``Order Completed``, ``order_completed``, ``OrderCompleted``)
share their table, as in Segment; each row's ``event_text`` keeps the name as sent.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

from exactly.lake.segment.kinds import json_text

NAME_LIMIT = 63  # PostgreSQL's identifiers; the lake formats take longer ones
SHORTEST_LIMIT = 24  # room for a readable start, the ``__`` and the hash
BUILT_IN_TABLES = frozenset(
    {
        "tracks",
        "identifies",
        "users",
        "pages",
        "screens",
        "groups",
        "aliases",
        "accounts",
        "events",
        "exactly_lake_batches",  # PostgreSQL's marker table, in the same schema
    }
)
EVENT_SUFFIX = "__event"  # after an event's slug that is a built-in table's name
_WORD = re.compile(r"[A-Z0-9]*[a-z0-9]*")
_HASH_DIGITS = 10
_COMMON = frozenset(
    {
        "id",
        "anonymous_id",
        "user_id",
        "received_at",
        "sent_at",
        "timestamp",
        "original_timestamp",
        "uuid_ts",
        "uuid",  # Segment's, not ours (yet): reserved so that a name never changes
        "loaded_at",
        "_rejected",
    }
)
_OWN = {  # each table's own columns besides the common ones
    "tracks": frozenset({"event", "event_text"}),
    "event": frozenset({"event", "event_text"}),  # a per-event table
    "identifies": frozenset(),
    "pages": frozenset({"name", "category"}),
    "screens": frozenset({"name", "category"}),
    "groups": frozenset({"group_id"}),
    "aliases": frozenset({"previous_id"}),
}


@lru_cache(maxsize=1 << 16)  # a source has few distinct keys, each seen in every event
def snake(name: str) -> str:
    """``name`` in snake case, as Segment's go-snakecase writes it (module docstring)."""
    return "_".join(word.lower() for word in _WORD.findall(name) if word)


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each scalar inside ``value`` with its path of original keys: objects are walked, an array
    is one leaf (its JSON text), null is kept (a caller decides what it means)."""
    found: list[tuple[tuple[str, ...], Any]] = []
    _leaves(value, path, found)
    return iter(found)


def _leaves(value: Any, path: tuple[str, ...], found: list[tuple[tuple[str, ...], Any]]) -> None:
    """:func:`leaves` into ``found``: no generator per object (shaping walks every value)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            _leaves(inner, (*path, str(key)), found)
    elif value is None or isinstance(value, str | int | float):  # before the slower checks
        found.append((path, value))
    elif isinstance(value, list | tuple):
        found.append((path, json_text(value)))
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            _leaves(inner, (*path, str(key)), found)
    else:
        found.append((path, value))


def flat_name(path: Sequence[str]) -> str:
    """The snake names of ``path``'s keys joined by ``_`` (keys with no word drop out)."""
    return "_".join(word for word in map(snake, path) if word)


def flatten(obj: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``obj``'s leaves as (column, value): nested keys joined by ``_`` in snake case after
    ``prefix`` (``flatten(context, "context")`` gives ``context_page_url``); arrays as JSON
    text. No reserved-name or length rule: see :func:`column_name` for those."""
    start = (prefix,) if prefix else ()
    return [(flat_name((*start, *path)), value) for path, value in leaves(obj)]


def fit(name: str, limit: int = NAME_LIMIT) -> str:
    """``name`` if it has at most ``limit`` bytes, else its start, ``__`` and a hash of it."""
    if limit < SHORTEST_LIMIT:
        raise ValueError(f"a name limit of {limit} bytes leaves no room; give {SHORTEST_LIMIT}+")
    if len(name.encode()) <= limit:
        return name
    start = name.encode()[: limit - _HASH_DIGITS - 2].decode(errors="ignore").rstrip("_")
    return f"{start}__{_digest(name)}"


def reserved(table: str) -> frozenset[str]:
    """The columns of ``table`` (``tracks``, ``identifies``, ``pages``, ``screens``, ``groups``,
    ``aliases``, or ``event`` for a per-event table) that no property or trait may take; every
    ``context_…`` name is reserved as well (:func:`is_reserved`)."""
    return _COMMON | _OWN[table]


def is_reserved(name: str, taken: Collection[str]) -> bool:
    """Whether a property's or trait's column ``name`` would overwrite one of ``taken`` or the
    context's columns."""
    return name in taken or name == "context" or name.startswith("context_")


def column_name(
    path: Sequence[str], *, taken: Collection[str] = frozenset(), limit: int = NAME_LIMIT
) -> str:
    """The column of a property or trait at ``path`` (its original keys, below ``properties``
    or ``traits``) in a table whose own columns are ``taken`` (module docstring: the rules)."""
    return _column_name(tuple(path), frozenset(taken), limit)


@lru_cache(maxsize=1 << 16)
def _column_name(path: tuple[str, ...], taken: frozenset[str], limit: int) -> str:
    name = flat_name(path)
    if name and is_reserved(name, taken):
        name = f"_{name}"
    return _named(name, path, limit)


@lru_cache(maxsize=1 << 16)
def context_name(path: tuple[str, ...], *, limit: int = NAME_LIMIT) -> str:
    """The column of the context field at ``path`` (its keys below ``context``): ``context_``
    and the flattened keys."""
    return _named(flat_name(("context", *path)), ("context", *path), limit)


def _named(name: str, path: Sequence[str], limit: int) -> str:
    """``name`` fitted to ``limit``; for a path with no word, a name from a hash of ``path``."""
    if not name:
        name = f"_unnamed__{_digest(json_text(list(path)))}"
    return fit(name, limit)


def event_table(
    event: str, *, limit: int = NAME_LIMIT, built_in: Collection[str] = BUILT_IN_TABLES
) -> str | None:
    """The table of the track event named ``event``: its slug, with the suffix ``__event`` when
    a built-in table has that name; None for a name with no word in it (such events stay in
    ``tracks``)."""
    slug = snake(event)
    if not slug:
        return None
    return fit(f"{slug}{EVENT_SUFFIX}" if slug in built_in else slug, limit)


def place(
    values: Sequence[tuple[str, tuple[str, ...], Any]],
) -> tuple[dict[str, Any], dict[str, tuple[str, Any]]]:
    """One row's (column, original path, value) as {column: value}, and the values that lost
    their column to another of the same row as {dotted path: (column, value)} (for
    ``_rejected``, keyed by the dotted path; counted against the column).

    Nulls take no column. Of several values for one column the one kept is the same whatever
    their order (module docstring)."""
    given = [found for found in values if found[2] is not None]
    if len({column for column, _, _ in given}) == len(given):  # no column twice: the usual row
        return {column: value for column, _, value in sorted(given, key=_first)}, {}
    by_column: dict[str, list[tuple[tuple[str, ...], Any]]] = {}
    for column, path, value in given:
        by_column.setdefault(column, []).append((path, value))
    cells: dict[str, Any] = {}
    lost: dict[str, tuple[str, Any]] = {}
    for column, found in sorted(by_column.items()):
        if len(found) > 1:
            found.sort(key=lambda item: (not _is_snake(item[0]), item[0]))
        cells[column] = found[0][1]
        for path, value in found[1:]:
            key = ".".join(path)
            while key in lost:  # a key with a dot in it: the later path in order gets a "#"
                key += "#"
            lost[key] = (column, value)
    return cells, lost


def _first(found: tuple[str, tuple[str, ...], Any]) -> str:
    return found[0]


def _is_snake(path: Sequence[str]) -> bool:
    return all(snake(key) == key for key in path)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_DIGITS]
