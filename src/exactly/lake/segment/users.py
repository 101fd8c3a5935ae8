"""``users`` and ``accounts``: one row per user (per group) with the newest value of each trait.

``users`` is keyed by the identify's ``userId`` (its ``id`` column; identifies without one are
in ``identifies`` only), ``accounts`` by the group's ``groupId``, from the ``group`` calls'
traits. Trait columns are named as in ``identifies`` (``groups``), so ``traits.email`` is
``email`` in both; an identify's traits include those in ``context.traits``
(:func:`~exactly.lake.segment.shape.fields`).

**Per trait, newest wins.** Each trait carries a :class:`Stamp`: the event's ``timestamp`` (its
``receivedAt`` when it has none), then its messageId to break a tie; a trait value is newer than
another when its stamp is greater, and for the same stamp (one message seen twice) when its JSON
text is greater, so two values are always ordered. A trait absent from a later identify keeps
its earlier value; a null trait counts as absent (as a null property takes no column). Where
one identify gives one column several values (``planId`` and ``plan_id``), the trait is the
value :func:`~exactly.lake.segment.names.place` keeps; the others are in that row of
``identifies``, in its ``_rejected``. A profile's ``received_at`` is the latest of its events'.

So :func:`merge` takes, per trait, the greater of two values: it is associative, commutative and
idempotent. Merging a batch into the table, batches in any order, or one batch twice (a replay)
gives the same table. The stamps live in the row (``_stamps``: JSON, column -> [time,
messageId]) so that a backend's upsert can merge a batch into the stored rows:

1. read the stored rows of the batch's ids (:func:`profile_of_row` gives each one's
   :class:`Profile`);
2. :func:`merge` each with the batch's (:func:`profiles`);
3. write the merged rows (:func:`profile_rows`) with MERGE / upsert / ``ON CONFLICT``, every
   column replaced, in the transaction that holds the batch's marker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from exactly.lake.segment.kinds import instant, json_text
from exactly.lake.segment.limits import Limits
from exactly.lake.segment.names import NAME_LIMIT, column_name, leaves, place, reserved
from exactly.lake.segment.shape import fields, tables_of
from exactly.lake.segment.table import REJECTED, Draft, TableBatch, build

Merged = Literal["users", "accounts"]
MERGED: tuple[Merged, ...] = ("users", "accounts")
STAMPS = "_stamps"
OWN = {"id": "string", "received_at": "timestamp", STAMPS: "string", REJECTED: "string"}
_SOURCE = {  # table -> (event type, the id's field, the table whose trait names it shares)
    "users": ("identify", "userId", "identifies"),
    "accounts": ("group", "groupId", "groups"),
}
_NEVER = datetime.min.replace(tzinfo=UTC)  # the stamp of an event with no time at all


@dataclass(frozen=True, order=True)
class Stamp:
    """When a trait value was set: the event's time, then its messageId."""

    at: datetime
    message_id: str


@dataclass(frozen=True)
class Trait:
    """A trait's value as sent (a scalar, or an array's JSON text) and its stamp."""

    value: Any
    stamp: Stamp

    def rank(self) -> tuple[Stamp, str]:
        """The order of values (module docstring): the stamp, then the value's JSON text."""
        return self.stamp, json_text(self.value)


@dataclass(frozen=True)
class Profile:
    """One user's (group's) row: its id, its latest ``received_at`` and newest traits."""

    id: str
    received_at: datetime | None
    traits: Mapping[str, Trait]


def merge(a: Profile, b: Profile) -> Profile:
    """``a`` and ``b`` (of one id) as one profile: per trait the newer value."""
    if a.id != b.id:
        raise ValueError(f"profiles of {a.id!r} and {b.id!r} do not merge: one id only")
    traits = dict(a.traits)
    for column, trait in b.traits.items():
        if column not in traits or trait.rank() > traits[column].rank():
            traits[column] = trait
    times = [t for t in (a.received_at, b.received_at) if t is not None]
    return Profile(a.id, max(times, default=None), dict(sorted(traits.items())))


def merge_all(*groups: Iterable[Profile]) -> dict[str, Profile]:
    """Every profile of ``groups`` merged per id, by id."""
    merged: dict[str, Profile] = {}
    for group in groups:
        for profile in group:
            known = merged.get(profile.id)
            merged[profile.id] = profile if known is None else merge(known, profile)
    return dict(sorted(merged.items()))


def merged_key(event: Mapping[str, Any], table: Merged) -> str | None:
    """The row of ``table`` that ``event`` merges into: an identify's ``userId`` for ``users``,
    a group's ``groupId`` for ``accounts``; None when it merges into none."""
    kind, id_field, _ = _SOURCE[table]
    key = event.get(id_field)
    if event.get("type") != kind or key is None or key == "":
        return None
    return str(key)


def rows_of(event: Mapping[str, Any], *, limit: int = NAME_LIMIT) -> list[tuple[str, str]]:
    """Each table ``event`` has a row in, with that row's ``id``: its messageId in the appended
    tables (:func:`~exactly.lake.segment.shape.tables_of`), the user (group) id in ``users``
    (``accounts``). What ``exactly audit`` recounts and ``exactly trace`` looks up."""
    message_id = str(event.get("messageId"))
    found = [(table, message_id) for table in tables_of(event, limit=limit)]
    for table in MERGED:
        key = merged_key(event, table)
        if key is not None:
            found.append((table, key))
    return found


def profiles(
    events: Iterable[Mapping[str, Any]], *, table: Merged, limits: Limits | None = None
) -> dict[str, Profile]:
    """The profiles of ``table`` a batch of events makes (its identifies or its groups), their
    traits named as :func:`~exactly.lake.segment.shape.shape` names them with ``limits``."""
    limit = (limits or Limits()).name_bytes
    names_from = _SOURCE[table][2]
    taken = reserved(names_from)
    found = []
    for event in events:
        key = merged_key(event, table)
        if key is None:
            continue
        at = instant(str(event.get("timestamp"))) or instant(str(event.get("receivedAt")))
        stamp = Stamp(at or _NEVER, str(event.get("messageId") or ""))
        cells, _ = place(
            [
                (column_name(path, taken=taken, limit=limit), ("traits", *path), value)
                for path, value in leaves(fields(event, "traits"))
            ]
        )
        received = instant(str(event.get("receivedAt")))
        found.append(Profile(str(key), received, {c: Trait(v, stamp) for c, v in cells.items()}))
    return merge_all(found)


def profile_rows(
    merged: Iterable[Profile],
    known: Mapping[str, str] | None,
    *,
    table: Merged,
    limits: Limits | None = None,
    can_widen: bool = False,
) -> TableBatch:
    """The rows of ``merged`` profiles for ``table`` (which has the columns ``known``; None:
    it does not exist yet), typed as appended rows are (:func:`~.table.build`)."""
    drafts = [
        Draft(
            {
                "id": profile.id,
                "received_at": profile.received_at,
                STAMPS: json_text(
                    {c: [_text(t.stamp.at), t.stamp.message_id] for c, t in profile.traits.items()}
                ),
                **{column: trait.value for column, trait in profile.traits.items()},
            }
        )
        for profile in sorted(merged, key=lambda p: p.id)
    ]
    return build(table, drafts, OWN, known, limits=limits or Limits(), can_widen=can_widen)


def profile_of_row(row: Mapping[str, Any]) -> Profile:
    """A stored row of ``users`` or ``accounts`` (column -> value, as read back) as a profile:
    each trait's value from its column, or from ``_rejected`` where it did not fit."""
    stamps = orjson.loads(row.get(STAMPS) or "{}")
    rejected = orjson.loads(row.get(REJECTED) or "{}")
    traits = {}
    for column, (at, message_id) in stamps.items():
        value = rejected[column] if column in rejected else row.get(column)
        if isinstance(value, datetime):
            value = _text(value)
        traits[column] = Trait(value, Stamp(instant(at) or _NEVER, message_id))
    received = row.get("received_at")
    return Profile(str(row["id"]), received, dict(sorted(traits.items())))


def _text(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds")
