"""A batch shaped in parts (one per Spark task) and merged is the batch shaped in one piece:
every table's rows, columns, kinds, rejects and what the limits held back, and the profiles."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exactly.lake.segment.limits import Limits
from exactly.lake.segment.parts import MERGED, Part, shape_in_parts, shape_part
from exactly.lake.segment.shape import Shaped, shape
from exactly.lake.segment.table import Columns, Tally
from exactly.lake.segment.users import Merged, Profile, profiles
from tests.warehouse_events import sdk_events

LOADED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
Events = Sequence[Mapping[str, Any]]
Schemas = Mapping[str, Mapping[str, str]]


def split(events: Events, cuts: Sequence[int]) -> list[Events]:
    bounds = sorted({min(max(c, 0), len(events)) for c in cuts})
    return [events[a:b] for a, b in zip([0, *bounds], [*bounds, len(events)], strict=True)]


def in_parts(
    events: Events,
    cuts: Sequence[int],
    schemas: Schemas | None = None,
    *,
    limits: Limits | None = None,
    can_widen: bool = False,
) -> tuple[Shaped, dict[Merged, dict[str, Profile]], list[Mapping[str, Columns] | None]]:
    """The batch cut at ``cuts``, each part shaped alone, merged; and the runs it took."""
    limits, schemas = limits or Limits(), schemas or {}
    chunks, runs = split(events, cuts), []

    def run(decided: Mapping[str, Columns] | None) -> list[Part]:
        runs.append(decided)
        return [
            shape_part(
                chunk,
                schemas,
                loaded_at=LOADED,
                limits=limits,
                can_widen=can_widen,
                decided=decided,
            )
            for chunk in chunks
        ]

    shaped, made = shape_in_parts(run, schemas, limits=limits, can_widen=can_widen)
    return shaped, made, runs


def assert_whole(
    events: Events,
    cuts: Sequence[int],
    schemas: Schemas | None = None,
    *,
    limits: Limits | None = None,
    can_widen: bool = False,
) -> list[Mapping[str, Columns] | None]:
    """The parts merged equal :func:`shape` and :func:`profiles` of the whole; the runs."""
    limits, schemas = limits or Limits(), schemas or {}
    merged, made, runs = in_parts(events, cuts, schemas, limits=limits, can_widen=can_widen)
    whole = shape(events, schemas, loaded_at=LOADED, limits=limits, can_widen=can_widen)
    assert merged.held_back == whole.held_back
    assert list(merged.tables) == list(whole.tables)
    for name, expected in whole.tables.items():
        found = merged.tables[name]
        assert list(found.kinds.items()) == list(expected.kinds.items()), name
        assert found.new_columns == expected.new_columns, name
        assert found.widened == expected.widened, name
        assert found.held_back == expected.held_back, name
        assert found.rejects == expected.rejects, name
        assert found.rows.schema == expected.rows.schema, name
        assert found.rows.to_pylist() == expected.rows.to_pylist(), name
        assert found == expected, name
    assert made == {name: profiles(events, table=name, limits=limits) for name in MERGED}
    return runs


def track(n: int, event: str = "Order Completed", **properties: Any) -> dict[str, Any]:
    return {
        "type": "track",
        "event": event,
        "messageId": f"m-{n}",
        "userId": f"u-{n % 3}",
        "timestamp": f"2026-03-01T10:00:{n % 60:02d}.000Z",
        "receivedAt": "2026-03-01T10:01:00.000Z",
        "properties": properties,
    }


def test_sdk_events_in_parts_are_the_whole() -> None:
    events = sdk_events(0, 400, users=7)
    for cuts in ([], [200], [1, 2, 3], [50, 51, 300], [399]):
        assert_whole(events, cuts)


def test_sdk_events_in_parts_after_a_first_batch_need_one_run() -> None:
    first = shape(sdk_events(0, 100), {}, loaded_at=LOADED)
    schemas = {name: batch.kinds for name, batch in first.tables.items()}
    rng = random.Random(5)
    for _ in range(4):
        cuts = sorted(rng.sample(range(200), 3))
        assert len(assert_whole(sdk_events(100, 200), cuts, schemas)) == 1


def test_a_column_int_in_one_part_and_double_in_another_is_retyped() -> None:
    events = [track(0, amount=3), track(1, amount=4), track(2, amount=4.5), track(3, amount=5.5)]
    runs = assert_whole(events, [2])
    assert len(runs) == 2 and set(runs[1] or {}) == {"order_completed"}
    merged, _, _ = in_parts(events, [2])
    assert merged.tables["order_completed"].kinds["amount"] == "double"


def test_a_column_free_in_one_part_is_a_reject_of_the_whole() -> None:
    events = [track(n, revenue=v) for n, v in enumerate(["free", "free", 10, 12.5, 7, "n/a"])]
    assert_whole(events, [2])
    merged, _, _ = in_parts(events, [2])
    assert merged.tables["order_completed"].rejects == {"revenue": 3}


def test_a_tie_between_kinds_across_parts() -> None:
    events = [track(0, at="2026-03-01T10:00:00Z"), track(1, at=True), track(2, at=12)]
    for cuts in ([1], [2], [1, 2]):
        assert_whole(events, cuts)


def test_a_part_without_a_column_conforms_with_nulls() -> None:
    events = [track(0, a=1), track(1, b="x"), track(2, c=2.5, a=3)]
    assert_whole(events, [1, 2])


def test_colliding_names_across_parts() -> None:
    events = [
        track(0, productId="a", product_id="b"),
        track(1, productId=1),
        track(2, product_id=2.5),
        track(3, **{"product ID": True}),
    ]
    for cuts in ([1], [2], [1, 3]):
        assert_whole(events, cuts)


def test_widening_where_only_one_part_has_a_fraction() -> None:
    schemas = {"order_completed": {**own(), "qty": "bigint"}}
    events = [track(0, qty=1), track(1, qty=2**60 + 1), track(2, qty=2.5)]
    for can_widen in (True, False):
        assert_whole(events, [2], schemas, can_widen=can_widen)


def own() -> dict[str, str]:
    from exactly.lake.segment.shape import own_columns

    return own_columns("event")


def test_the_column_limit_counts_the_whole_batch() -> None:
    room = 32 - len(own()) - 1
    events = [track(n, **{f"p{n}_{k}": k for k in range(n + 1)}) for n in range(room)]
    events += [track(99, **{f"p{n}_0": 1 for n in range(room)})]  # the first of each: 2 values
    for cuts in ([1], [room // 2], [1, 2, 3, room]):
        assert_whole(events, cuts, limits=Limits(columns=32))


def test_the_table_limit_counts_the_whole_batch() -> None:
    events = [track(n, f"Event {n % 5}" if n < 20 else "Event 4", x=n) for n in range(30)]
    schemas = {"event_0": own()}
    for cuts in ([10], [5, 25], [29]):
        assert_whole(events, cuts, schemas, limits=Limits(tables=3))
        assert_whole(events, cuts, limits=Limits(tables=0))


def test_empty_parts_and_an_empty_batch() -> None:
    assert_whole([], [])
    assert_whole(sdk_events(0, 10), [0, 0, 10])


def test_profiles_merge_across_parts() -> None:
    events = [e for e in sdk_events(0, 400, users=3) if e["type"] in ("identify", "group")]
    events += [{**events[0], "messageId": "late", "timestamp": "2027-01-01T00:00:00Z"}]
    assert_whole(events, [5, 17])


def test_tallies_add_up_in_any_order() -> None:
    part = shape_part(sdk_events(0, 50), {}, loaded_at=LOADED, limits=Limits(), can_widen=False)
    other = shape_part(sdk_events(50, 9), {}, loaded_at=LOADED, limits=Limits(), can_widen=False)
    a, b = part.tallies["tracks"], other.tallies["tracks"]
    assert a.add(b) == b.add(a)
    assert a.add(Tally()) == a and a.add(b).rows == a.rows + b.rows


KEYS = ("amount", "Amount", "productId", "product_id", "id", "context", "x.y", "名前", "when")
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2**53 + 1, 2**63, -(2**63), 1.0, 0.5, 1e300]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["free", "12.5", "2026-03-01T10:00:00Z", "2026-03-01", "", "true"]),
    st.text(max_size=4),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(st.sampled_from(KEYS), inner, max_size=2)
    ),
    max_leaves=4,
)


@st.composite
def adversarial(draw: st.DrawFn, n: int) -> dict[str, Any]:
    kind = draw(st.sampled_from(["track", "track", "identify", "group", "page", "alias"]))
    fields = draw(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4))
    event: dict[str, Any] = {
        "type": kind,
        "messageId": f"m-{n % 7}",  # repeats: ties between stamps
        "userId": draw(st.sampled_from(["u1", "u2", None, ""])),
        "groupId": draw(st.sampled_from(["g1", "g2", None])),
        "timestamp": draw(st.sampled_from(["2026-03-01T10:00:00Z", "2026-03-02T10:00:00Z", None])),
        "receivedAt": "2026-03-03T10:00:00Z",
        "context": draw(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=2)),
    }
    event["event"] = draw(st.sampled_from(["A", "a", "B b", "Users", "!!", "C"]))
    event["properties" if kind in ("track", "page") else "traits"] = fields
    return event


@settings(max_examples=150, deadline=None)
@given(
    st.integers(min_value=0, max_value=25).flatmap(
        lambda n: st.tuples(*(adversarial(i) for i in range(n)))
    ),
    st.lists(st.integers(min_value=0, max_value=25), max_size=4),
    st.integers(min_value=0, max_value=10),
    st.sampled_from([None, 0, 1, 2]),
    st.sampled_from([32, 34, 1000]),
    st.booleans(),
)
def test_adversarial_events_in_any_parts_are_the_whole(
    events: tuple[dict[str, Any], ...],
    cuts: list[int],
    known: int,
    tables: int | None,
    columns: int,
    can_widen: bool,
) -> None:
    limits = Limits(tables=500 if tables is None else tables, columns=columns)
    first = shape(events[:known], {}, loaded_at=LOADED, limits=limits)
    schemas = {name: batch.kinds for name, batch in first.tables.items()}
    assert_whole(list(events), cuts, schemas, limits=limits, can_widen=can_widen)
