"""The segment layout's names: go-snakecase's snake case, flattening, reserved, colliding and long
names, event tables."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly.lake.segment.names import (
    BUILT_IN_TABLES,
    column_name,
    context_name,
    event_table,
    fit,
    flat_name,
    flatten,
    leaves,
    place,
    reserved,
)
from exactly.lake.segment.names import snake as snake_case
from exactly.lake.segment.shape import own_columns

SNAKE = re.compile(r"([a-z0-9]+(_[a-z0-9]+)*)?")
keys = st.text(alphabet=st.sampled_from("aZ9_ -.$é名Ab3xYq"), max_size=12)

untimed = settings(deadline=None)  # a busy machine is slow, not wrong


@pytest.mark.parametrize(
    ("name", "expected"),
    [  # go-snakecase's own cases
        ("sample text", "sample_text"),
        ("sample-text", "sample_text"),
        ("sample_text", "sample_text"),
        ("sample___text", "sample_text"),
        ("sampleText", "sample_text"),
        ("samPLE text", "sam_ple_text"),
        ("inviteYourCustomersAddInvites", "invite_your_customers_add_invites"),
        ("sample 2 Text", "sample_2_text"),
        ("   sample   2    Text   ", "sample_2_text"),
        ("   $#$sample   2    Text   ", "sample_2_text"),
        ("SAMPLE 2 TEXT", "sample_2_text"),
        ("___$$Base64Encode", "base64_encode"),
        ("FOO:BAR$BAZ", "foo_bar_baz"),
        ("FOO#BAR#BAZ", "foo_bar_baz"),
        ("something.com", "something_com"),
        ("$something%", "something"),
        ("•¶§ƒ˚foo˙∆˚¬", "foo"),
        ("CStringRef", "cstring_ref"),
        ("5test", "5test"),
        ("test5", "test5"),
        ("THE5r", "the5r"),
        ("5TEst", "5test"),
        ("_5TEst", "5test"),
        ("@%#&5TEst", "5test"),
        ("edf_6N", "edf_6n"),
        ("f_pX9", "f_p_x9"),
        ("p_z9Rg", "p_z9_rg"),
        ("2FA Enabled", "2fa_enabled"),
        ("Enabled 2FA", "enabled_2fa"),
        ("@49L0S145_¬fwHƒ0TSLNVp", "49l0s145_fw_h_0tslnvp"),
        ("lk0B@bFmjrLQ_Z6YL", "lk0_b_b_fmjr_lq_z6yl"),
    ],
)
def test_snake_case_is_go_snakecase(name: str, expected: str) -> None:
    assert snake_case(name) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [  # acronyms stick to the capitalised word after them, as in go-snakecase
        ("productId", "product_id"),
        ("productID", "product_id"),
        ("userID2", "user_id2"),
        ("HTMLParser", "htmlparser"),
        ("getHTTPResponseCode", "get_httpresponse_code"),
        ("iPhone", "i_phone"),
        ("URLs", "urls"),
        ("Order Completed", "order_completed"),
        ("order-completed", "order_completed"),
        ("Order Completed!", "order_completed"),
        ("checkout.step_2", "checkout_step_2"),
        ("Café Visited", "caf_visited"),  # only ASCII letters are letters
        ("注文完了", ""),
        ("", ""),
    ],
)
def test_snake_case_of_acronyms_digits_and_punctuation(name: str, expected: str) -> None:
    assert snake_case(name) == expected


@untimed
@given(keys)
def test_a_snake_name_is_lower_words_joined_by_one_underscore_and_stays(name: str) -> None:
    found = snake_case(name)
    assert SNAKE.fullmatch(found)
    assert snake_case(found) == found


@untimed
@given(st.lists(keys, min_size=1, max_size=4))
def test_a_flat_name_is_the_snake_case_of_the_keys_joined(path: list[str]) -> None:
    assert flat_name(path) == snake_case("_".join(path))


def test_flatten_joins_nested_keys_and_keeps_arrays_as_json_text() -> None:
    found = flatten(
        {
            "productId": {"sku": "G-32", "variant": {"colorName": "red"}},
            "products": ["507f1", "505bd"],
            "cart": [{"id": 1}],
            "empty": {},
            "coupon": None,
        }
    )
    assert found == [
        ("product_id_sku", "G-32"),
        ("product_id_variant_color_name", "red"),
        ("products", '["507f1","505bd"]'),
        ("cart", '[{"id":1}]'),
        ("coupon", None),
    ]
    assert flatten({"app": {"version": "1.0.0"}}, "context") == [("context_app_version", "1.0.0")]
    assert list(leaves({"a": {"B": 1}})) == [(("a", "B"), 1)]


@pytest.mark.parametrize(
    ("table", "path", "expected"),
    [
        ("event", ("id",), "_id"),
        ("event", ("userId",), "_user_id"),
        ("event", ("event",), "_event"),
        ("event", ("eventText",), "_event_text"),
        ("event", ("context", "ip"), "_context_ip"),
        ("event", ("context",), "_context"),
        ("event", ("name",), "name"),  # a per-event table has no name column
        ("event", ("originalTimestamp",), "_original_timestamp"),
        ("event", ("uuid_ts",), "_uuid_ts"),
        ("event", ("uuid",), "_uuid"),
        ("identifies", ("loadedAt",), "_loaded_at"),
        ("event", ("rejected",), "rejected"),
        ("pages", ("name",), "_name"),
        ("screens", ("name",), "_name"),
        ("identifies", ("name",), "name"),
        ("identifies", ("email",), "email"),
        ("groups", ("groupId",), "_group_id"),
        ("groups", ("name",), "name"),
        ("aliases", ("previousId",), "_previous_id"),
        ("tracks", ("timestamp",), "_timestamp"),
    ],
)
def test_a_property_never_takes_its_tables_own_column(
    table: str, path: tuple[str, ...], expected: str
) -> None:
    assert column_name(path, taken=reserved(table)) == expected


@pytest.mark.parametrize(
    "table", ["tracks", "event", "identifies", "pages", "screens", "groups", "aliases"]
)
def test_every_own_column_of_a_table_is_reserved_there(table: str) -> None:
    assert set(own_columns(table)) <= reserved(table)


def test_context_columns_are_named_under_context_without_the_reserved_rule() -> None:
    assert context_name(("page", "url")) == "context_page_url"
    assert context_name(("userAgentData", "mobile")) == "context_user_agent_data_mobile"
    assert context_name(("campaign", "name")) == "context_campaign_name"


def test_a_long_name_keeps_its_start_and_a_hash_of_it_within_the_limit() -> None:
    long = "a_very_long_property_name_that_an_sdk_made_from_a_sentence_of_words"
    other = long + "_too"
    assert len(long) > 63
    assert fit(long) == "a_very_long_property_name_that_an_sdk_made_from_a_s__34fbbf2166"
    assert len(fit(long)) <= 63 and len(fit(other)) <= 63
    assert fit(long) != fit(other)
    assert re.fullmatch(r"[a-z0-9_]+__[0-9a-f]{10}", fit(long))
    assert fit(long, 200) == long
    assert fit("revenue") == "revenue"
    assert len(column_name([long], limit=40)) == 40
    with pytest.raises(ValueError, match="no room"):
        fit(long, 10)


def test_the_hash_of_a_long_name_is_fixed_across_runs() -> None:
    # a constant: a name must not change between processes, versions or machines
    assert fit("x" * 70) == "x" * 51 + "__c71bd10922"  # SHA-256's first ten hex digits
    assert fit("ab_" * 30, 30) == "ab_ab_ab_ab_ab_ab" + "__" + fit("ab_" * 30, 30)[-10:]


def test_a_key_with_no_ascii_word_is_named_by_a_hash_of_its_path() -> None:
    first, second = column_name(["名前"]), column_name(["住所"])
    assert first.startswith("_unnamed__") and second.startswith("_unnamed__")
    assert first != second
    assert column_name(["名前"]) == first
    assert column_name(["名前", "city"]) == "city"  # the word-less key drops out


@pytest.mark.parametrize(
    ("event", "table"),
    [
        ("Order Completed", "order_completed"),
        ("order_completed", "order_completed"),
        ("OrderCompleted", "order_completed"),
        ("Signed Up", "signed_up"),
        ("Users", "users__event"),
        ("tracks", "tracks__event"),
        ("Identifies", "identifies__event"),
        ("Pages", "pages__event"),
        ("screens", "screens__event"),
        ("Groups", "groups__event"),
        ("aliases", "aliases__event"),
        ("Accounts", "accounts__event"),
        ("Events", "events__event"),
        ("Exactly Lake Batches", "exactly_lake_batches__event"),
        ("Users Signed Up", "users_signed_up"),
        ("注文完了", None),
        ("!!!", None),
    ],
)
def test_an_event_table_is_its_slug_with_a_suffix_after_a_built_in_name(
    event: str, table: str | None
) -> None:
    assert event_table(event) == table


def test_a_long_event_name_fits_the_table_name_limit() -> None:
    name = "Checkout Step Viewed By A Returning Customer On The Second Visit Of The Day"
    found = event_table(name)
    assert found is not None and len(found) <= 63 and "__" in found
    assert event_table(name, limit=100) == snake_case(name)
    assert event_table("users", built_in=frozenset()) == "users"
    assert "users" in BUILT_IN_TABLES


@untimed
@given(st.lists(keys, min_size=1, max_size=3), st.sampled_from(["event", "pages", "groups"]))
def test_a_made_up_name_never_meets_a_name_from_the_data(path: list[str], table: str) -> None:
    found = column_name(path, taken=reserved(table), limit=30)
    assert len(found.encode()) <= 30 and SNAKE.fullmatch(found.replace("__", "_").strip("_"))
    if found != flat_name(path):
        assert found.startswith("_") or "__" in found
    assert not flat_name(path).startswith("_") and "__" not in flat_name(path)


def test_values_that_collide_in_one_event_keep_the_snake_spelling_and_reject_the_other() -> None:
    cells, lost = place(
        [
            ("product_id", ("properties", "productId"), "a"),
            ("product_id", ("properties", "product_id"), "b"),
            ("product_id", ("properties", "ProductID"), "c"),
            ("coupon", ("properties", "coupon"), None),
            ("sku", ("properties", "sku"), "s"),
        ]
    )
    assert cells == {"product_id": "b", "sku": "s"}
    assert lost == {
        "properties.ProductID": ("product_id", "c"),
        "properties.productId": ("product_id", "a"),
    }


def test_without_a_snake_spelling_the_first_path_in_code_point_order_wins() -> None:
    cells, lost = place(
        [
            ("order_id", ("properties", "orderId"), 1),
            ("order_id", ("properties", "OrderId"), 2),
        ]
    )
    assert cells == {"order_id": 2}  # "O" < "o"
    assert lost == {"properties.orderId": ("order_id", 1)}


@untimed
@given(
    st.permutations(
        [
            ("a_b", ("properties", "a", "b"), 1),
            ("a_b", ("properties", "aB"), 2),
            ("a_b", ("properties", "a_b"), 3),
            ("a_b", ("properties", "A_B"), 4),
            ("c", ("properties", "c"), 5),
            ("c", ("properties", "C"), 6),
        ]
    )
)
def test_which_value_keeps_a_column_does_not_depend_on_key_order(
    values: list[tuple[str, tuple[str, ...], int]],
) -> None:
    cells, lost = place(values)
    assert cells == {"a_b": 1, "c": 5}
    assert lost == {
        "properties.A_B": ("a_b", 4),
        "properties.a_b": ("a_b", 3),
        "properties.aB": ("a_b", 2),
        "properties.C": ("c", 6),
    }
