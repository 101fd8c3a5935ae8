"""A micro-batch of events as the rows of Segment's warehouse tables, beside ``events``.

Every table has the common columns of Segment's warehouse schema (:data:`COMMON`): ``id`` (the
messageId), ``anonymous_id``, ``user_id``, the four times as UTC timestamps (``received_at``,
``sent_at``, ``timestamp``, ``original_timestamp``), ``uuid_ts`` (when the row was loaded:
the ``loaded_at`` given) and ``_rejected`` (values that did not fit, :mod:`~.table`), and the
context flattened into ``context_…`` columns. Then, by the event's type:

============  ==========================================================================
track         ``tracks``: ``event`` (the slug, which is the event's table) and ``event_text``
              (the name as sent); and the event's own table: the same and its properties
identify      ``identifies``: its traits (:func:`fields`)
page, screen  ``pages``, ``screens``: ``name``, ``category`` and the properties
group         ``groups``: ``group_id`` and the group's traits
alias         ``aliases``: ``previous_id``
============  ==========================================================================

Names follow :mod:`~.names`, kinds :mod:`~.kinds`, limits :mod:`~.limits`: a track event whose
table the table limit holds back is in ``tracks`` alone and counted in
:attr:`Shaped.held_back`. Events of another type, and a track whose name has no word in it (no
table; ``tracks`` has it with ``event`` null), stay in ``events`` as they are everywhere.

``users`` and ``accounts`` are merged, not appended: :mod:`~.users`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from exactly.lake.segment.kinds import instant
from exactly.lake.segment.limits import Limits, admit
from exactly.lake.segment.names import (
    BUILT_IN_TABLES,
    NAME_LIMIT,
    column_name,
    context_name,
    event_table,
    leaves,
    place,
    reserved,
)
from exactly.lake.segment.table import REJECTED, Draft, TableBatch, build

COMMON = {
    "id": "string",
    "anonymous_id": "string",
    "user_id": "string",
    "received_at": "timestamp",
    "sent_at": "timestamp",
    "timestamp": "timestamp",
    "original_timestamp": "timestamp",
    "uuid_ts": "timestamp",
    REJECTED: "string",
}
_FROM = {  # column -> the event's field
    "id": "messageId",
    "anonymous_id": "anonymousId",
    "user_id": "userId",
    "received_at": "receivedAt",
    "sent_at": "sentAt",
    "timestamp": "timestamp",
    "original_timestamp": "originalTimestamp",
    "name": "name",
    "category": "category",
    "group_id": "groupId",
    "previous_id": "previousId",
}
_TABLES = {  # type -> (table, its own columns besides COMMON, the field made columns)
    "track": ("tracks", ("event", "event_text"), None),
    "identify": ("identifies", (), "traits"),
    "page": ("pages", ("name", "category"), "properties"),
    "screen": ("screens", ("name", "category"), "properties"),
    "group": ("groups", ("group_id",), "traits"),
    "alias": ("aliases", ("previous_id",), None),
}


@dataclass(frozen=True)
class Shaped:
    """A micro-batch's rows per table (only the tables it has rows for, by name), and the
    events held back from their own table by ``Limits.tables``: table -> events."""

    tables: dict[str, TableBatch]
    held_back: dict[str, int]

    @property
    def rejects(self) -> dict[tuple[str, str], int]:
        """Values kept in ``_rejected`` per (table, column), for ``exactly status``."""
        return {
            (table, column): count
            for table, batch in self.tables.items()
            for column, count in batch.rejects.items()
        }

    @property
    def held_back_columns(self) -> dict[str, tuple[str, ...]]:
        """Per table, the new columns ``Limits.columns`` held back (their values in
        ``_rejected``)."""
        return {table: batch.held_back for table, batch in self.tables.items() if batch.held_back}


def own_columns(table: str) -> dict[str, str]:
    """The columns every row of ``table`` has, in order, with their kinds; ``table`` is a
    built-in table's name, or a per-event table's (``event`` stands for any)."""
    extras = {name: columns for name, columns, _ in _TABLES.values()}
    extra = extras[table] if table in BUILT_IN_TABLES else extras["tracks"]
    head, tail = list(COMMON.items())[:3], list(COMMON.items())[3:]
    return dict([*head, *((column, "string") for column in extra), *tail])


def shape(
    events: Iterable[Mapping[str, Any]],
    schemas: Mapping[str, Mapping[str, str]],
    *,
    loaded_at: datetime,
    limits: Limits | None = None,
    can_widen: bool = False,
) -> Shaped:
    """``events`` (Segment events as the ``events`` topic holds them) as rows of each table,
    given the columns each table of the layout has (``schemas``: table -> {column: kind}, in
    order; every table, so that the table limit counts them; a table not in it does not exist
    yet). ``loaded_at`` is every row's ``uuid_ts``. ``can_widen``: the format can change a bigint
    column to double."""
    limits = limits or Limits()
    found = drafts(events, loaded_at=loaded_at, limits=limits)
    held = held_tables({t: len(rows) for t, rows in found.items()}, schemas, limits)
    tables = {
        table: build(
            table,
            found[table],
            own_columns(table),
            schemas.get(table),
            limits=limits,
            can_widen=can_widen,
        )
        for table in sorted(found)
        if table not in held
    }
    return Shaped(tables, held)


def drafts(
    events: Iterable[Mapping[str, Any]], *, loaded_at: datetime, limits: Limits
) -> dict[str, list[Draft]]:
    """Each table's rows of ``events`` before typing, in the events' order: each event's rows
    follow from the event alone (and ``loaded_at``), never from the rest of the batch."""
    found: dict[str, list[Draft]] = {}
    for event in events:
        for table, draft in _rows(event, loaded_at, limits.name_bytes):
            found.setdefault(table, []).append(draft)
    return found


def held_tables(
    rows: Mapping[str, int], schemas: Mapping[str, Mapping[str, str]], limits: Limits
) -> dict[str, int]:
    """The tables of a batch (table -> its rows) that ``Limits.tables`` holds back, by name,
    with their events: new per-event tables past the room left, the most rows first."""
    known_events = {t for t in schemas if t not in BUILT_IN_TABLES}
    new = {t: n for t, n in rows.items() if t not in BUILT_IN_TABLES and t not in known_events}
    _, held = admit(new, limits.tables - len(known_events))
    return {table: new[table] for table in sorted(held)}


def tables_of(event: Mapping[str, Any], *, limit: int = NAME_LIMIT) -> list[str]:
    """The appended tables ``event`` has a row in, as :func:`shape` puts it there (``limit``:
    ``Limits.name_bytes``): its type's table, and for a track its event's table too (none for
    a name with no word). A table ``Limits.tables`` held back does not exist: its events are in
    ``tracks`` alone. ``users`` and ``accounts``: :func:`~.users.merged_key`."""
    found = _TABLES.get(str(event.get("type")))
    if found is None:
        return []
    slug = _slug(event, limit) if found[0] == "tracks" else None
    return [found[0]] if slug is None else [found[0], slug]


def day_of(event: Mapping[str, Any]) -> date | None:
    """The UTC day of ``event``'s rows: of their ``timestamp`` column, else of ``received_at``
    (as stored: text that is no ISO-8601 time is null there), as the events table's ``date``
    is of ``timestamp``, else ``receivedAt``. ``exactly audit`` counts each table's rows per
    this day."""
    for field in ("timestamp", "receivedAt"):
        value = event.get(field)
        at = instant(value) if isinstance(value, str) else None
        if at is not None:
            return at.date()
    return None


def _slug(event: Mapping[str, Any], limit: int) -> str | None:
    name = event.get("event")
    return None if name is None else event_table(str(name), limit=limit)


def _rows(event: Mapping[str, Any], loaded_at: datetime, limit: int) -> list[tuple[str, Draft]]:
    """The tables ``event`` has a row in, each with that row."""
    found = _TABLES.get(str(event.get("type")))
    if found is None:
        return []
    table, own, source = found
    base = {column: event.get(_FROM[column]) for column in (*COMMON, *own) if column in _FROM}
    base["uuid_ts"] = loaded_at
    context = [
        (context_name(path, limit=limit), ("context", *path), value)
        for path, value in leaves(_object(event.get("context")))
    ]
    if table != "tracks":
        return [(table, _draft(base, context, event, source, table, limit))]
    name = event.get("event")
    text = None if name is None else str(name)
    slug = _slug(event, limit)
    base.update(event=slug, event_text=text)
    rows = [("tracks", _draft(base, context, event, None, table, limit))]
    if slug is not None:
        rows.append((slug, _draft(base, context, event, "properties", "event", limit)))
    return rows


def _draft(
    base: Mapping[str, Any],
    context: list[tuple[str, tuple[str, ...], Any]],
    event: Mapping[str, Any],
    source: str | None,
    table: str,
    limit: int,
) -> Draft:
    data = list(context)
    if source is not None:
        taken = reserved(table)
        data += [
            (column_name(path, taken=taken, limit=limit), (source, *path), value)
            for path, value in leaves(fields(event, source))
        ]
    cells, lost = place(data)
    return Draft({**base, **cells}, lost)


def fields(event: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """The event's ``properties`` or ``traits`` (``source``) as an object. An identify's traits
    are also those in ``context.traits``, where RudderStack's SDKs send them; a key in both is
    the top-level one's."""
    found = _object(event.get(source))
    if source != "traits" or event.get("type") != "identify":
        return found
    sent = _object(_object(event.get("context")).get("traits"))
    return {**sent, **found} if sent else found


def _object(value: Any) -> Mapping[str, Any]:
    """A context, properties or traits field as an object (the collector lets only objects
    through; anything else counts as none)."""
    return value if isinstance(value, Mapping) else {}
