"""Whom a regulation forgets (``forget/regulations.py``'s :class:`Forgotten`): pure, keyed
hashes; each id's answer remembered, which must never change an answer."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.forget import regulations
from exactly.forget.regulations import ANONYMOUS, USER, Forgotten, digest

KEY = bytes(range(32))


def forgetting(users: list[str], anonymous: list[str]) -> Forgotten:
    return Forgotten(
        KEY,
        {
            USER: frozenset(digest(KEY, USER, value) for value in users),
            ANONYMOUS: frozenset(digest(KEY, ANONYMOUS, value) for value in anonymous),
        },
    )


def test_an_event_is_theirs_by_its_user_id_or_its_anonymous_id_of_the_right_kind() -> None:
    forgotten = forgetting(["alice"], ["anon-a"])
    assert forgotten.ids("alice", None) and forgotten.ids(None, "anon-a")
    assert forgotten.ids("bob", "anon-a") and forgotten.ids("alice", "anon-b")
    assert not forgotten.ids("anon-a", "alice")  # a user id is no anonymous id
    assert not forgotten.ids("bob", "anon-b") and not forgotten.ids(None, None)
    assert not forgotten.ids(7, ["alice"]) and not forgotten.ids("", "")


def test_a_stored_value_is_parsed_and_anything_not_a_json_object_is_nobodys() -> None:
    forgotten = forgetting(["alice"], [])
    assert forgotten.value(orjson.dumps({"userId": "alice", "type": "track"}))
    assert not forgotten.value(orjson.dumps({"userId": "bob"}))
    assert not forgotten.value(b"not json") and not forgotten.value(b'["alice"]')
    assert not forgotten.value(None) and not forgotten.value(b"")
    assert not Forgotten(KEY, {}).value(orjson.dumps({"userId": "alice"}))


@given(
    st.lists(st.text(min_size=1, max_size=4), max_size=5),
    st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=4)), st.text(max_size=4))),
)
def test_remembered_answers_are_the_hashes_answers(
    users: list[str], events: list[tuple[str | None, str]]
) -> None:
    forgotten = forgetting(users, [])
    for _ in range(2):  # the second time from memory
        for user_id, anonymous_id in events:
            expected = bool(user_id) and forgotten.holds(USER, user_id or "")
            assert forgotten.ids(user_id, anonymous_id) == expected


def test_the_memory_is_bounded_and_answers_the_same_once_cleared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(regulations, "SEEN_IDS", 3)
    forgotten = forgetting(["u1"], [])
    answers = [forgotten.ids(f"u{n}", None) for n in range(10)]
    assert len(forgotten._seen) <= 3
    assert answers == [n == 1 for n in range(10)]
    assert [forgotten.ids(f"u{n}", None) for n in range(10)] == answers
