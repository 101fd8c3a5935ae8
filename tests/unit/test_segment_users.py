"""``users`` and ``accounts``: the newest value of each trait per user (group), merged the same way
whatever the order of batches, however often one is replayed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly.lake.segment.limits import Limits
from exactly.lake.segment.shape import shape
from exactly.lake.segment.users import (
    OWN,
    Profile,
    Stamp,
    Trait,
    merge,
    merge_all,
    profile_of_row,
    profile_rows,
    profiles,
)

untimed = settings(deadline=None)  # a busy machine is slow, not wrong
T0 = datetime(2026, 3, 1, 10, tzinfo=UTC)
CONTEXT = {"library": {"name": "analytics.js", "version": "next-1.70.0"}}


def identify(
    message_id: str, minutes: int, user: str | int | None = "user-42", **traits: Any
) -> dict[str, Any]:
    at = (T0 + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")
    return {
        "type": "identify",
        "messageId": message_id,
        "userId": user,
        "anonymousId": "5c3f3c1e-0b7a-4a59-9f4e-2a7f0b8e1d11",
        "timestamp": at,
        "receivedAt": at,
        "traits": traits,
        "context": CONTEXT,
    }


def test_each_trait_holds_its_newest_value_and_an_absent_one_keeps_its_own() -> None:
    batch = [
        identify("m2", 5, plan="pro", email="new@initech.example"),
        identify("m1", 0, plan="free", email="old@initech.example", name="Peter Gibbons"),
        identify("m3", 9, logins=7, plan=None),
    ]
    [user] = profiles(batch, table="users").values()
    assert user.id == "user-42"
    assert {c: t.value for c, t in user.traits.items()} == {
        "email": "new@initech.example",
        "logins": 7,
        "name": "Peter Gibbons",
        "plan": "pro",  # a null is no value: the newer null keeps "pro"
    }
    assert user.traits["name"].stamp == Stamp(T0, "m1")
    assert user.received_at == T0 + timedelta(minutes=9)


def test_a_tie_in_time_goes_to_the_greater_message_id() -> None:
    batch = [identify("b", 0, plan="b"), identify("a", 0, plan="a"), identify("c", 0, plan="c")]
    assert profiles(batch, table="users")["user-42"].traits["plan"].value == "c"


def test_users_are_keyed_by_user_id_and_identifies_without_one_are_skipped() -> None:
    batch = [
        identify("m1", 0, user=None, plan="anon"),
        identify("m2", 0, user="", plan="empty"),
        identify("m3", 0, user=7, plan="seven"),
        {**identify("m4", 0, plan="track"), "type": "track"},
    ]
    found = profiles(batch, table="users")
    assert list(found) == ["7"]
    assert found["7"].traits["plan"].value == "seven"


def test_nested_traits_flatten_and_reserved_ones_keep_their_value_beside_the_id() -> None:
    batch = [identify("m1", 0, id="crm-17", address={"city": "Austin"}, tags=["a", "b"])]
    traits = profiles(batch, table="users")["user-42"].traits
    assert {c: t.value for c, t in traits.items()} == {
        "_id": "crm-17",
        "address_city": "Austin",
        "tags": '["a","b"]',
    }


def test_an_identifys_context_traits_are_its_traits_as_rudderstacks_sdks_send_them() -> None:
    rudder = {**identify("m1", 0), "context": {"traits": {"email": "p@x.example", "plan": "a"}}}
    both = {**identify("m2", 0, plan="b"), "context": {"traits": {"plan": "c"}}}
    found = profiles([rudder, both], table="users")["user-42"].traits
    assert {c: t.value for c, t in found.items()} == {"email": "p@x.example", "plan": "b"}


def test_trait_columns_are_named_as_in_identifies_under_the_same_limits() -> None:
    long = {"favouriteProductCategoryOfTheLastTwelveMonths": "tea", "id": "crm-17"}
    batch = [identify("m1", 0, **long)]
    limits = Limits(name_bytes=30)
    shaped = shape(batch, {}, loaded_at=T0, limits=limits).tables["identifies"].new_columns
    traits = profiles(batch, table="users", limits=limits)["user-42"].traits
    assert set(traits) == {"_id", "favourite_product__6372e90676"}
    assert set(traits) <= set(shaped)


def test_accounts_hold_the_newest_group_traits_per_group_id() -> None:
    group = {
        "type": "group",
        "messageId": "g1",
        "userId": "user-42",
        "groupId": "initech",
        "timestamp": "2026-03-01T10:00:00Z",
        "receivedAt": "2026-03-01T10:00:01Z",
        "traits": {"name": "Initech", "employees": 329, "plan": "enterprise"},
    }
    later = {**group, "messageId": "g2", "timestamp": "2026-03-02T10:00:00Z"}
    later["traits"] = {"employees": 400, "groupId": "x"}
    found = profiles([later, group, identify("m1", 0, plan="free")], table="accounts")
    assert list(found) == ["initech"]
    assert {c: t.value for c, t in found["initech"].traits.items()} == {
        "_group_id": "x",
        "employees": 400,
        "name": "Initech",
        "plan": "enterprise",
    }


def test_the_rows_carry_the_traits_typed_and_each_traits_stamp() -> None:
    batch = [
        identify("m1", 0, plan="free", logins=3, createdAt="2025-06-01T08:00:00Z"),
        identify("m2", 1, plan="pro"),
    ]
    rows = profile_rows(profiles(batch, table="users").values(), None, table="users")
    assert rows.table == "users"
    assert list(rows.kinds)[:4] == list(OWN)
    assert rows.new_columns["created_at"] == "timestamp"
    assert rows.rows.schema.field("logins").type == pa.int64()
    [row] = rows.rows.to_pylist()
    assert (row["id"], row["plan"], row["logins"]) == ("user-42", "pro", 3)
    assert row["created_at"] == datetime(2025, 6, 1, 8, tzinfo=UTC)
    assert row["received_at"] == T0 + timedelta(minutes=1)
    assert orjson.loads(row["_stamps"]) == {
        "created_at": ["2026-03-01T10:00:00.000000+00:00", "m1"],
        "logins": ["2026-03-01T10:00:00.000000+00:00", "m1"],
        "plan": ["2026-03-01T10:01:00.000000+00:00", "m2"],
    }


def test_a_stored_row_reads_back_as_its_profile_with_rejected_values_whole() -> None:
    batch = [identify("m1", 0, plan="pro", logins="many", createdAt="2025-06-01T08:00:00Z")]
    merged = profiles(batch, table="users")
    known = {**OWN, "logins": "bigint"}
    stored = profile_rows(merged.values(), known, table="users")
    [row] = stored.rows.to_pylist()
    assert row["logins"] is None and orjson.loads(row["_rejected"]) == {"logins": "many"}
    assert stored.rejects == {"logins": 1}
    back = profile_of_row(row)
    assert back.traits["logins"] == Trait("many", Stamp(T0, "m1"))
    assert back.traits["plan"] == Trait("pro", Stamp(T0, "m1"))
    assert back.traits["created_at"].value == "2025-06-01T08:00:00.000000+00:00"
    assert back.received_at == T0


def test_merging_a_batch_into_the_stored_rows_is_the_rows_of_all_the_events() -> None:
    first = [identify("m1", 0, plan="free", logins=1), identify("m2", 0, user="u2", plan="pro")]
    second = [identify("m3", 5, logins=2.5), identify("m4", -5, plan="trial", email="p@x.example")]
    stored = profile_rows(profiles(first, table="users").values(), None, table="users")
    known = stored.kinds
    read = [profile_of_row(row) for row in stored.rows.to_pylist()]
    merged = merge_all(read, profiles(second, table="users").values())
    upserted = profile_rows(merged.values(), known, table="users", can_widen=True)
    at_once = profile_rows(
        profiles(first + second, table="users").values(), known, table="users", can_widen=True
    )
    assert upserted.rows.equals(at_once.rows)
    assert upserted.widened == {"logins": "double"}
    [other, user] = upserted.rows.to_pylist()  # by id
    assert (other["id"], other["plan"], other["email"]) == ("u2", "pro", None)
    assert (user["plan"], user["logins"], user["email"]) == ("free", 2.5, "p@x.example")
    replayed = merge_all(
        [profile_of_row(r) for r in upserted.rows.to_pylist()],
        profiles(second, table="users").values(),
    )
    again = profile_rows(replayed.values(), upserted.kinds, table="users")
    assert again.rows.equals(upserted.rows)


times = st.sampled_from([T0 + timedelta(minutes=m) for m in (0, 1, 2)])
values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["a", "b"]))
traits = st.builds(Trait, values, st.builds(Stamp, times, st.sampled_from(["m1", "m2", "m3"])))
profile = st.builds(
    Profile,
    st.just("user-42"),
    st.one_of(st.none(), times),
    st.dictionaries(st.sampled_from(["email", "plan", "logins"]), traits, max_size=3),
)


@untimed
@given(profile, profile, profile)
def test_merge_is_associative(a: Profile, b: Profile, c: Profile) -> None:
    assert merge(merge(a, b), c) == merge(a, merge(b, c))


@untimed
@given(profile, profile)
def test_merge_is_commutative(a: Profile, b: Profile) -> None:
    assert merge(a, b) == merge(b, a)


@untimed
@given(profile, profile)
def test_merge_is_idempotent(a: Profile, b: Profile) -> None:
    assert merge(a, a) == merge(a, Profile(a.id, a.received_at, dict(a.traits)))
    assert merge(merge(a, b), b) == merge(a, b)


event = st.tuples(
    st.sampled_from(["user-1", "user-2", "user-3"]),
    st.integers(0, 3),
    st.dictionaries(st.sampled_from(["plan", "email", "seats"]), values, max_size=3),
)


@untimed
@given(st.lists(event, max_size=12), st.randoms(use_true_random=False), st.integers(0, 12))
def test_batches_in_any_order_and_replays_give_the_same_users(
    found: list[tuple[str, int, dict[str, Any]]], rng: Any, cut: int
) -> None:
    batch = [identify(f"m{i}", minutes, user, **t) for i, (user, minutes, t) in enumerate(found)]
    at_once = profiles(batch, table="users")
    shuffled = list(batch)
    rng.shuffle(shuffled)
    one, two = shuffled[:cut], shuffled[cut:]
    split = merge_all(profiles(two, table="users").values(), profiles(one, table="users").values())
    assert split == at_once
    replayed = merge_all(at_once.values(), profiles(one, table="users").values())
    assert replayed == at_once
    for user in at_once.values():  # each trait is the newest non-null value sent for it
        for column, trait in user.traits.items():
            sent = [
                (e["timestamp"], e["messageId"], e["traits"][column])
                for e in batch
                if e["userId"] == user.id and e["traits"].get(column) is not None
            ]
            assert trait.value == max(sent, key=lambda s: (s[0], s[1]))[2]
