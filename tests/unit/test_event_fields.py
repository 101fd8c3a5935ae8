"""Event fields read in Arrow: the option's text, the order and places of what is read, the
limits. Whether a value is read as Spark reads it is tested against Spark
(``tests/integration/test_event_fields.py``)."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly.errors import ConfigError
from exactly.events.fields import LIMIT, Field, Fields, _within_limits, parse

FIELDS = Fields((Field("type", "string"), Field("properties", "map", ("revenue", "a b"))))


def test_the_option_text_round_trips_and_gives_sparks_ddl() -> None:
    assert Fields.parse(FIELDS.option) == FIELDS
    assert FIELDS.ddl == "`type` string, `properties` map<string, string>"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("type string", "write a JSON list"),
        ('[["type"]]', "write a JSON list"),
        ('[["type", "integer"]]', "type is integer"),
        ('[["properties", "map"]]', "properties is map"),
        ('[["type", "string", ["k"]]]', "type is string"),
        ('[["type", "string"], ["type", "timestamp"]]', "name each field once"),
        ("[]", "name each field once"),
    ],
)
def test_a_bad_option_says_what_to_write(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        Fields.parse(text)


def test_maps_hold_the_keys_read_that_have_text() -> None:
    values = [
        b'{"type":"a","properties":{"revenue":"1","other":2}}',
        b'{"properties":{}}',
        b'{"properties":{"a b":"x","revenue":"2"}}',
        b'{"properties":{"revenue":null}}',
        b'{"type":"b"}',
        b'{"properties":{"revenue":3}}',  # a number: Spark writes its own text of it
    ]
    assert parse(values, FIELDS).to_pylist() == [
        {"type": "a", "properties": [("revenue", "1")]},
        {"type": None, "properties": []},
        {"type": None, "properties": [("revenue", "2"), ("a b", "x")]},
        {"type": None, "properties": []},
        {"type": "b", "properties": None},
        None,
    ]
    assert parse([], FIELDS).to_pylist() == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["ok", "number", "broken", "blank", "two"]), max_size=300))
def test_each_value_keeps_its_place_whatever_fails_around_it(kinds: list[str]) -> None:
    """A batch that fails is split until the values at fault are alone; the rest are read, in
    order, each in its own row."""
    made = {
        "ok": lambda n: orjson.dumps({"type": f"t{n}"}),
        "number": lambda n: b'{"type":%d}' % n,
        "broken": lambda n: b'{"type":"t%d"' % n,
        "blank": lambda n: b"",
        "two": lambda n: b'{"type":"t%d"}\n{"type":"x"}' % n,
    }
    values = [made[kind](n) for n, kind in enumerate(kinds)]
    expected = [{"type": f"t{n}"} if kind == "ok" else None for n, kind in enumerate(kinds)]
    read = parse(values, Fields((Field("type", "string"),)))
    assert read.to_pylist() == expected


def longest_run(value: bytes) -> int:
    runs = re.findall(rb"[-+.0-9eE]+", value)
    return max(map(len, runs), default=0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from([b"{", b"[", b"1", b"e", b"-", b"a", b'"', b"1" * 400, b"[" * 300]),
            min_size=1,
            max_size=12,
        ).map(lambda parts: b"{" + b"".join(parts)),  # as parse's values: a run ends at "{"
        min_size=1,
        max_size=8,
    )
)
def test_the_limits_counted_together_are_each_values_own(values: list[bytes]) -> None:
    expected = [
        value.count(b"[") + value.count(b"{") < LIMIT and longest_run(value) < LIMIT
        for value in values
    ]
    assert _within_limits(values).tolist() == expected


def test_values_whose_fields_are_not_text_are_set_aside_before_splitting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One event in ten with a numeric revenue (Segment's own spec) must not split a batch value
    by value: the pattern sets them aside and the rest is read in one more call."""
    from exactly.events import fields

    calls: list[int] = []
    read_block = fields._read_block

    def counted(values: list[bytes], schema: object) -> object:
        calls.append(len(values))
        return read_block(values, schema)

    monkeypatch.setattr(fields, "_read_block", counted)
    values = [
        orjson.dumps({"type": "track", "properties": {"revenue": n if n % 10 == 0 else str(n)}})
        for n in range(1000)
    ]
    read = parse(values, FIELDS)
    assert calls == [1000, 900]
    assert [row is None for row in read.to_pylist()] == [n % 10 == 0 for n in range(1000)]
