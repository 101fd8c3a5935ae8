"""The segment layout's shaper: a batch of events as the rows of Segment's tables, with the columns
to add, the rejects and what the limits held back."""

from __future__ import annotations

import copy
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly.errors import ConfigError
from exactly.events import Receipt, normalise
from exactly.lake.segment.kinds import cell, fits, json_text
from exactly.lake.segment.limits import Limits
from exactly.lake.segment.names import column_name, leaves, reserved
from exactly.lake.segment.shape import COMMON, Shaped, own_columns, shape

LOADED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
UTC_TIME = pa.timestamp("us", tz="UTC")
CONTEXT = {  # analytics.js (next) in a browser
    "library": {"name": "analytics.js", "version": "next-1.70.0"},
    "page": {
        "path": "/checkout",
        "referrer": "https://www.google.com/",
        "search": "?utm_source=google",
        "title": "Checkout",
        "url": "https://shop.example/checkout?utm_source=google",
    },
    "campaign": {"name": "spring_sale", "source": "google", "medium": "cpc", "term": "shoes"},
    "userAgent": "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36",
    "userAgentData": {
        "brands": [{"brand": "Chromium", "version": "120"}],
        "mobile": False,
        "platform": "macOS",
    },
    "locale": "en-US",
    "timezone": "Europe/Berlin",
    "ip": "203.0.113.7",
}
TIMES = {
    "timestamp": "2026-03-01T10:00:00.000Z",
    "originalTimestamp": "2026-03-01T11:00:00.000+01:00",
    "sentAt": "2026-03-01T10:00:00.250Z",
    "receivedAt": "2026-03-01T10:00:00.400Z",
}
TRACK = {
    "type": "track",
    "event": "Order Completed",
    "messageId": "ajs-next-7f5a1c2e",
    "anonymousId": "5c3f3c1e-0b7a-4a59-9f4e-2a7f0b8e1d11",
    "userId": "user-42",
    "properties": {
        "orderId": "50314b8e9bcf000000000000",
        "total": 27.5,
        "revenue": 25,
        "coupon": "hasbros",
        "currency": "USD",
        "products": [{"product_id": "507f1f77bcf86cd799439011", "sku": "45790-32", "price": 19}],
        "shipping": {"method": "express", "cost": 3},
    },
    "context": CONTEXT,
    "integrations": {},
    **TIMES,
}
IDENTIFY = {
    "type": "identify",
    "messageId": "ajs-next-1d2e3f",
    "anonymousId": "5c3f3c1e-0b7a-4a59-9f4e-2a7f0b8e1d11",
    "userId": "user-42",
    "traits": {
        "email": "peter@initech.example",
        "name": "Peter Gibbons",
        "plan": "pro",
        "logins": 5,
        "createdAt": "2025-06-01T08:00:00.000Z",
        "address": {"city": "Austin", "postalCode": "78701"},
        "id": "crm-17",
    },
    "context": CONTEXT,
    **TIMES,
}
PAGE = {
    "type": "page",
    "messageId": "ajs-next-9a8b7c",
    "anonymousId": "5c3f3c1e-0b7a-4a59-9f4e-2a7f0b8e1d11",
    "name": "Checkout",
    "category": "Shop",
    "properties": {
        "name": "Checkout",
        "category": "Shop",
        "path": "/checkout",
        "url": "https://shop.example/checkout",
        "title": "Checkout",
    },
    "context": CONTEXT,
    **TIMES,
}
SCREEN = {
    "type": "screen",
    "messageId": "ios-4f1b",
    "userId": "user-42",
    "name": "Home",
    "category": "Main",
    "properties": {"variation": "blue", "loadTimeMs": 120},
    "context": {"app": {"name": "Shop", "version": "3.2.1", "build": "321"}, "os": {"name": "iOS"}},
    **TIMES,
}
GROUP = {
    "type": "group",
    "messageId": "ajs-next-grp1",
    "userId": "user-42",
    "groupId": "initech",
    "traits": {"name": "Initech", "employees": 329, "industry": "Technology", "groupId": "x"},
    "context": CONTEXT,
    **TIMES,
}
ALIAS = {
    "type": "alias",
    "messageId": "ajs-next-al1",
    "userId": "user-42",
    "previousId": "5c3f3c1e-0b7a-4a59-9f4e-2a7f0b8e1d11",
    "context": CONTEXT,
    **TIMES,
}


def track(event: str, message_id: str, /, **properties: Any) -> dict[str, Any]:
    return {**TRACK, "event": event, "messageId": message_id, "properties": properties}


def rows(shaped: Shaped, table: str) -> list[dict[str, Any]]:
    return list(shaped.tables[table].rows.to_pylist())


def test_a_track_is_a_row_of_tracks_and_of_its_events_table() -> None:
    shaped = shape([TRACK], {}, loaded_at=LOADED)
    assert list(shaped.tables) == ["order_completed", "tracks"]
    [tracked] = rows(shaped, "tracks")
    assert tracked["id"] == "ajs-next-7f5a1c2e"
    assert tracked["event"] == "order_completed"
    assert tracked["event_text"] == "Order Completed"
    assert tracked["user_id"] == "user-42"
    assert tracked["anonymous_id"] == "5c3f3c1e-0b7a-4a59-9f4e-2a7f0b8e1d11"
    assert tracked["timestamp"] == datetime(2026, 3, 1, 10, tzinfo=UTC)
    assert tracked["original_timestamp"] == datetime(2026, 3, 1, 10, tzinfo=UTC)
    assert tracked["sent_at"] == datetime(2026, 3, 1, 10, 0, 0, 250000, tzinfo=UTC)
    assert tracked["received_at"] == datetime(2026, 3, 1, 10, 0, 0, 400000, tzinfo=UTC)
    assert tracked["uuid_ts"] == LOADED
    assert tracked["context_page_url"] == "https://shop.example/checkout?utm_source=google"
    assert tracked["context_campaign_name"] == "spring_sale"
    assert tracked["context_library_name"] == "analytics.js"
    assert tracked["context_user_agent_data_mobile"] is False
    assert tracked["context_user_agent_data_brands"] == '[{"brand":"Chromium","version":"120"}]'
    assert tracked["_rejected"] is None
    assert "revenue" not in tracked  # tracks holds no properties
    [order] = rows(shaped, "order_completed")
    assert {k: order[k] for k in tracked} == tracked
    assert order["order_id"] == "50314b8e9bcf000000000000"
    assert (order["total"], order["revenue"], order["shipping_cost"]) == (27.5, 25, 3)
    assert order["shipping_method"] == "express"
    assert orjson.loads(order["products"])[0]["sku"] == "45790-32"


def test_a_new_tables_columns_come_with_their_kinds_own_columns_first() -> None:
    shaped = shape([TRACK], {}, loaded_at=LOADED)
    batch = shaped.tables["order_completed"]
    assert list(batch.new_columns)[:11] == list(own_columns("event"))
    data = list(batch.new_columns)[11:]
    assert data == sorted(data)
    assert batch.new_columns["revenue"] == "bigint"
    assert batch.new_columns["total"] == "double"
    assert batch.new_columns["context_user_agent_data_mobile"] == "boolean"
    assert batch.new_columns["products"] == "string"
    assert batch.kinds == batch.new_columns
    schema = batch.rows.schema
    assert schema.names == list(batch.kinds)
    assert schema.field("timestamp").type == UTC_TIME
    assert schema.field("uuid_ts").type == UTC_TIME
    assert schema.field("revenue").type == pa.int64()
    assert schema.field("total").type == pa.float64()
    assert schema.field("context_user_agent_data_mobile").type == pa.bool_()
    assert schema.field("_rejected").type == pa.string()


def test_identifies_hold_traits_as_columns_and_a_reserved_trait_beside_its_column() -> None:
    shaped = shape([IDENTIFY], {}, loaded_at=LOADED)
    assert list(shaped.tables) == ["identifies"]
    [row] = rows(shaped, "identifies")
    assert row["id"] == "ajs-next-1d2e3f"
    assert row["email"] == "peter@initech.example"
    assert row["name"] == "Peter Gibbons"
    assert row["logins"] == 5
    assert row["created_at"] == datetime(2025, 6, 1, 8, tzinfo=UTC)
    assert row["address_postal_code"] == "78701"
    assert row["_id"] == "crm-17"
    assert shaped.tables["identifies"].new_columns["created_at"] == "timestamp"


def test_pages_and_screens_hold_the_name_and_the_properties() -> None:
    shaped = shape([PAGE, SCREEN], {}, loaded_at=LOADED)
    [page] = rows(shaped, "pages")
    assert page["name"] == "Checkout"
    assert page["_name"] == "Checkout"  # properties.name, beside the name column
    assert (page["category"], page["_category"]) == ("Shop", "Shop")
    assert (page["path"], page["title"]) == ("/checkout", "Checkout")
    assert page["user_id"] is None
    [screen] = rows(shaped, "screens")
    assert (screen["name"], screen["category"]) == ("Home", "Main")
    assert (screen["variation"], screen["load_time_ms"]) == ("blue", 120)
    assert screen["context_app_version"] == "3.2.1"
    assert screen["context_os_name"] == "iOS"


def test_groups_hold_the_group_id_and_traits_aliases_the_previous_id() -> None:
    shaped = shape([GROUP, ALIAS], {}, loaded_at=LOADED)
    [group] = rows(shaped, "groups")
    assert (group["group_id"], group["name"], group["employees"]) == ("initech", "Initech", 329)
    assert group["_group_id"] == "x"
    [alias] = rows(shaped, "aliases")
    assert alias["previous_id"] == "5c3f3c1e-0b7a-4a59-9f4e-2a7f0b8e1d11"
    assert alias["user_id"] == "user-42"
    assert set(shaped.tables["aliases"].kinds) == set(own_columns("aliases")) | {
        c for c in shaped.tables["aliases"].kinds if c.startswith("context_")
    }


def test_other_types_and_wordless_event_names_have_no_table_of_their_own() -> None:
    odd = {**TRACK, "event": "注文完了", "messageId": "m2"}
    shaped = shape([{"type": "unknown", "messageId": "m1"}, odd], {}, loaded_at=LOADED)
    assert list(shaped.tables) == ["tracks"]
    [row] = rows(shaped, "tracks")
    assert (row["event"], row["event_text"]) == (None, "注文完了")


def test_an_event_named_as_a_built_in_table_gets_its_own_table_beside_it() -> None:
    shaped = shape([track("Users", "m1", count=1), track("tracks", "m2")], {}, loaded_at=LOADED)
    assert list(shaped.tables) == ["tracks", "tracks__event", "users__event"]
    assert [r["event"] for r in rows(shaped, "tracks")] == ["users__event", "tracks__event"]
    assert rows(shaped, "users__event")[0]["count"] == 1


def test_event_names_of_one_slug_share_a_table_and_keep_their_text() -> None:
    batch = [track("Order Completed", "m1"), track("order_completed", "m2")]
    shaped = shape(batch, {}, loaded_at=LOADED)
    found = rows(shaped, "order_completed")
    assert [r["event_text"] for r in found] == ["Order Completed", "order_completed"]


def test_known_columns_keep_their_order_and_new_ones_follow() -> None:
    first = shape([track("Signed Up", "m1", plan="pro")], {}, loaded_at=LOADED)
    known = {t: b.kinds for t, b in first.tables.items()}
    second = shape([track("Signed Up", "m2", trial=True)], known, loaded_at=LOADED)
    batch = second.tables["signed_up"]
    assert list(batch.kinds)[: len(known["signed_up"])] == list(known["signed_up"])
    assert batch.new_columns == {"trial": "boolean"}
    assert batch.rows.column("plan").to_pylist() == [None]  # known, absent: null
    assert second.tables["tracks"].new_columns == {}


def test_a_value_that_does_not_fit_its_known_column_is_rejected_and_counted() -> None:
    known = {"order_completed": {**own_columns("event"), "revenue": "double"}}
    batch = [
        track("Order Completed", "m1", revenue=9.5),
        track("Order Completed", "m2", revenue="free"),
    ]
    shaped = shape(batch, known, loaded_at=LOADED)
    found = shaped.tables["order_completed"]
    assert found.rows.column("revenue").to_pylist() == [9.5, None]
    assert found.rows.column("_rejected").to_pylist() == [None, '{"revenue":"free"}']
    assert found.rejects == {"revenue": 1}
    assert shaped.rejects == {("order_completed", "revenue"): 1}


def test_a_fraction_in_a_bigint_column_widens_it_or_is_rejected() -> None:
    known = {"order_completed": {**own_columns("event"), "quantity": "bigint"}}
    batch = [track("Order Completed", "m1", quantity=1.5)]
    wide = shape(batch, known, loaded_at=LOADED, can_widen=True).tables["order_completed"]
    assert wide.widened == {"quantity": "double"} and wide.rejects == {}
    strict = shape(batch, known, loaded_at=LOADED).tables["order_completed"]  # Delta, Iceberg
    assert strict.widened == {} and strict.rejects == {"quantity": 1}


def test_properties_that_collide_after_snake_case_keep_one_column() -> None:
    batch = [
        track("Product Viewed", "m1", productId="a", product_id="b"),
        track("Product Viewed", "m2", productId="c"),
    ]
    found = shape(batch, {}, loaded_at=LOADED).tables["product_viewed"]
    assert found.rows.column("product_id").to_pylist() == ["b", "c"]
    assert found.rows.column("_rejected").to_pylist() == ['{"properties.productId":"a"}', None]
    assert found.rejects == {"product_id": 1}


def test_a_property_with_a_reserved_name_keeps_its_value_beside_the_column() -> None:
    batch = [track("Order Completed", "m1", id="o-1", user_id="u-9", event="x", context={"a": 1})]
    [row] = rows(shape(batch, {}, loaded_at=LOADED), "order_completed")
    assert (row["id"], row["_id"]) == ("m1", "o-1")
    assert (row["user_id"], row["_user_id"]) == ("user-42", "u-9")
    assert (row["event"], row["_event"]) == ("order_completed", "x")
    assert row["_context_a"] == 1


def test_own_columns_that_do_not_fit_are_rejects_too() -> None:
    odd = {**TRACK, "userId": 42, "sentAt": "yesterday"}
    [row] = rows(shape([odd], {}, loaded_at=LOADED), "tracks")
    assert row["user_id"] == "42"
    assert row["sent_at"] is None
    assert orjson.loads(row["_rejected"]) == {"sent_at": "yesterday"}


def test_a_long_property_name_is_cut_to_the_name_limit() -> None:
    long = "whatTheCustomerSaidAboutTheCheckoutExperienceInTheFeedbackFormField"
    batch = [track("Order Completed", "m1", **{long: "fine"})]
    found = shape(batch, {}, loaded_at=LOADED, limits=Limits(name_bytes=40))
    names = [n for n in found.tables["order_completed"].kinds if n.startswith("what")]
    assert len(names) == 1 and len(names[0]) <= 40 and "__" in names[0]
    tables = shape([track("X" * 80, "m1")], {}, loaded_at=LOADED, limits=Limits(name_bytes=40))
    assert all(len(name) <= 40 for name in tables.tables)


def test_past_the_table_limit_an_event_stays_in_tracks_and_is_counted() -> None:
    known = {"signed_up": own_columns("event"), "tracks": own_columns("tracks")}
    batch = [
        track("Order Completed", "m1"),
        track("Cart Viewed", "m2"),
        track("Order Completed", "m3"),
        track("Signed Up", "m4"),
        track("Banner Seen", "m5"),
    ]
    shaped = shape(batch, known, loaded_at=LOADED, limits=Limits(tables=2))
    assert list(shaped.tables) == ["order_completed", "signed_up", "tracks"]
    assert shaped.held_back == {"banner_seen": 1, "cart_viewed": 1}
    assert len(rows(shaped, "tracks")) == 5
    none_left = shape(batch, known, loaded_at=LOADED, limits=Limits(tables=1))
    assert list(none_left.tables) == ["signed_up", "tracks"]
    assert none_left.held_back == {"banner_seen": 1, "cart_viewed": 1, "order_completed": 2}


def test_past_the_column_limit_values_go_to_rejected_and_the_columns_are_named() -> None:
    room = 32 - len(own_columns("event")) - 1  # one context column below
    props = {f"p{i:02d}": i for i in range(room + 3)}
    many = {**track("Big", "m1", **props), "context": {"ip": "203.0.113.7"}}
    fewer = {**track("Big", "m2", p00=1, p01=2), "context": {}}
    shaped = shape([many, fewer], {}, loaded_at=LOADED, limits=Limits(columns=32))
    found = shaped.tables["big"]
    assert len(found.kinds) == 32
    # p00 and p01 have the most values, then names in order: context_ip, p02 ... p19
    assert found.held_back == ("p20", "p21", "p22")
    first = orjson.loads(found.rows.column("_rejected")[0].as_py())
    assert first == {"p20": 20, "p21": 21, "p22": 22}
    assert found.rejects == {"p20": 1, "p21": 1, "p22": 1}
    assert found.rows.column("context_ip").to_pylist() == ["203.0.113.7", None]
    assert shaped.held_back_columns == {"big": ("p20", "p21", "p22")}


def test_limits_refuse_values_that_leave_no_room() -> None:
    with pytest.raises(ConfigError, match="columns"):
        Limits(columns=5)
    with pytest.raises(ConfigError, match="name"):
        Limits(name_bytes=10)
    with pytest.raises(ConfigError, match="tables"):
        Limits(tables=-1)


def test_the_shape_of_a_batch_does_not_depend_on_the_order_of_its_events() -> None:
    batch = [
        track("Order Completed", "m1", revenue=1, productId="a"),
        track("Order Completed", "m2", revenue=2.5, product_id="b", note="x"),
        track("Order Completed", "m3", revenue="free", ProductID="c"),
        track("Cart Viewed", "m4", items=3),
        track("Banner Seen", "m5"),
        IDENTIFY,
        PAGE,
        GROUP,
    ]
    expected = shape(batch, {}, loaded_at=LOADED, limits=Limits(tables=1))
    for seed in range(5):
        shuffled = copy.deepcopy(batch)
        random.Random(seed).shuffle(shuffled)
        found = shape(shuffled, {}, loaded_at=LOADED, limits=Limits(tables=1))
        assert found.held_back == expected.held_back
        assert found.tables.keys() == expected.tables.keys()
        for table, batch_found in found.tables.items():
            assert batch_found.kinds == expected.tables[table].kinds
            assert batch_found.rejects == expected.tables[table].rejects
            key = batch_found.rows.schema.names.index("id")
            assert sorted(map(tuple, _values(batch_found.rows)), key=lambda r: r[key]) == sorted(
                map(tuple, _values(expected.tables[table].rows)), key=lambda r: r[key]
            )


def test_the_common_columns_are_segments() -> None:
    assert list(COMMON)[:8] == [
        "id",
        "anonymous_id",
        "user_id",
        "received_at",
        "sent_at",
        "timestamp",
        "original_timestamp",
        "uuid_ts",
    ]
    assert list(own_columns("tracks"))[3:5] == ["event", "event_text"]
    assert "group_id" in own_columns("groups") and "previous_id" in own_columns("aliases")
    assert "name" in own_columns("pages") and "name" in own_columns("screens")


def _values(table: pa.Table) -> list[list[Any]]:
    return [list(row.values()) for row in table.to_pylist()]


def test_an_identifys_traits_in_context_traits_are_traits_too() -> None:
    rudder = {**IDENTIFY, "traits": {"plan": "pro"}}
    rudder["context"] = {"traits": {"email": "p@initech.example", "plan": "free"}}
    [row] = rows(shape([rudder], {}, loaded_at=LOADED), "identifies")
    assert (row["email"], row["plan"]) == ("p@initech.example", "pro")  # the top-level one first
    assert row["context_traits_plan"] == "free"
    tracked = {**TRACK, "context": {"traits": {"email": "p@initech.example"}}}
    found = shape([tracked], {}, loaded_at=LOADED).tables["order_completed"].kinds
    assert "email" not in found and "context_traits_email" in found


def sdk_events(sdk: str) -> list[dict[str, Any]]:
    """What the official Python SDK sends for each call, as the collector stores it."""
    if sdk == "segment":
        from segment.analytics import Client
        from segment.analytics.request import DatetimeSerializer
    else:
        from rudderstack.analytics import Client
        from rudderstack.analytics.request import DatetimeSerializer
    client = Client("key", send=False)
    when = datetime(2026, 3, 1, 10, tzinfo=UTC)
    calls = [
        client.track(
            "user-42",
            "Order Completed",
            {"revenue": 9.99, "currency": "EUR", "nested": {"a": [1, "b", None]}},
            timestamp=when,
            message_id="t1",
        ),
        client.identify(
            "user-42",
            {"email": "x@example.com", "age": 42, "createdAt": datetime(2025, 1, 1, tzinfo=UTC)},
            timestamp=when,
            message_id="i1",
        ),
        client.page(
            "user-42", "Docs", "Getting started", {"path": "/docs"}, timestamp=when, message_id="p1"
        ),
        client.screen("user-42", "App", "Settings", {"tab": 2}, timestamp=when, message_id="s1"),
        client.group(
            "user-42", "company-1", {"plan": "enterprise"}, timestamp=when, message_id="g1"
        ),
        client.alias("anonymous-7", "user-42", timestamp=when, message_id="a1"),
    ]
    receipt = Receipt.of("web", received_at=when + timedelta(seconds=1))
    sent = [json.loads(json.dumps(message, cls=DatetimeSerializer)) for _, message in calls]
    for event in sent:
        normalise(event, receipt)
    return sent


@pytest.mark.parametrize("sdk", ["segment", "rudderstack"])
def test_the_python_sdks_payloads_land_in_their_tables(sdk: str) -> None:
    shaped = shape(sdk_events(sdk), {}, loaded_at=LOADED)
    assert list(shaped.tables) == [
        "aliases",
        "groups",
        "identifies",
        "order_completed",
        "pages",
        "screens",
        "tracks",
    ]
    [order] = rows(shaped, "order_completed")
    assert (order["id"], order["user_id"], order["revenue"]) == ("t1", "user-42", 9.99)
    assert order["nested_a"] == '[1,"b",null]'
    assert order["context_library_name"] == "analytics-python"
    assert order["timestamp"] == datetime(2026, 3, 1, 10, tzinfo=UTC)
    assert order["received_at"] == datetime(2026, 3, 1, 10, 0, 1, tzinfo=UTC)
    [identify] = rows(shaped, "identifies")
    assert (identify["email"], identify["age"]) == ("x@example.com", 42)
    assert identify["created_at"] == datetime(2025, 1, 1, tzinfo=UTC)
    [page] = rows(shaped, "pages")
    assert (page["name"], page["category"], page["path"]) == ("Getting started", "Docs", "/docs")
    [screen] = rows(shaped, "screens")
    assert (screen["name"], screen["category"], screen["tab"]) == ("Settings", "App", 2)
    [group] = rows(shaped, "groups")
    assert (group["group_id"], group["plan"]) == ("company-1", "enterprise")
    [alias] = rows(shaped, "aliases")
    assert (alias["previous_id"], alias["user_id"]) == ("anonymous-7", "user-42")
    assert shaped.rejects == {}


leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["free", "2026-03-01T10:00:00Z", "2026-03-01", "x" * 3]),
    st.lists(st.integers(0, 3), max_size=2),
)
prop_keys = st.sampled_from(["revenue", "Revenue", "plan", "id", "userId", "a", "A", "名", "n_1"])
props = st.recursive(
    st.dictionaries(prop_keys, leaf, max_size=5),
    lambda inner: st.dictionaries(prop_keys, st.one_of(leaf, inner), max_size=3),
    max_leaves=8,
)


@settings(deadline=None)  # a busy machine is slow, not wrong
@given(st.lists(st.tuples(st.sampled_from(["Order Completed", "Signed Up"]), props), max_size=6))
def test_every_property_value_is_in_its_column_or_in_rejected(
    sent: list[tuple[str, dict[str, Any]]],
) -> None:
    batch = [track(name, f"m{i}", **found) for i, (name, found) in enumerate(sent)]
    known = {"order_completed": {**own_columns("event"), "revenue": "bigint", "plan": "boolean"}}
    shaped = shape(batch, known, loaded_at=LOADED, limits=Limits(columns=36))
    for event in batch:
        table = shaped.tables[event["event"].lower().replace(" ", "_")]
        [row] = [r for r in table.rows.to_pylist() if r["id"] == event["messageId"]]
        rejected = json.loads(row["_rejected"] or "{}")  # any integer, as sent
        for path, value in leaves(event["properties"]):
            if value is None:
                continue
            column = column_name(path, taken=reserved("event"))
            dotted = ".".join(("properties", *path))
            kind = table.kinds.get(column)
            typed = kind is not None and row[column] is not None and fits(value, kind)
            kept = [json_text(rejected[key]) for key in (column, dotted) if key in rejected]
            assert (typed and row[column] == cell(value, kind)) or json_text(value) in kept, (
                path,
                value,
                row,
            )
    shuffled = shape(batch[::-1], known, loaded_at=LOADED, limits=Limits(columns=36))
    assert {t: b.kinds for t, b in shuffled.tables.items()} == {
        t: b.kinds for t, b in shaped.tables.items()
    }
    assert {t: b.rejects for t, b in shuffled.tables.items()} == {
        t: b.rejects for t, b in shaped.tables.items()
    }
