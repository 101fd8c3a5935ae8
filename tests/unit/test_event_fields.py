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
from exactly.events.fields import LIMIT, Field, Fields, _within_limits, parse, spark_text

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
        b'{"properties":{"revenue":3}}',  # a number: read as the text Spark gives it
        b'{"properties":{"revenue":3.50}}',
        b'{"properties":{"revenue":3e10}}',  # a number whose text is left to Spark
    ]
    assert parse(values, FIELDS).to_pylist() == [
        {"type": "a", "properties": [("revenue", "1")]},
        {"type": None, "properties": []},
        {"type": None, "properties": [("revenue", "2"), ("a b", "x")]},
        {"type": None, "properties": []},
        {"type": "b", "properties": None},
        {"type": None, "properties": [("revenue", "3")]},
        {"type": None, "properties": [("revenue", "3.5")]},
        None,
    ]
    assert parse([], FIELDS).to_pylist() == []


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (b"0", b"0"),
        (b"-0", b"0"),
        (b"120", b"120"),
        (b"123456789012345678901234567890", b"123456789012345678901234567890"),
        (b"12.50", b"12.5"),
        (b"-0.0", b"-0.0"),
        (b"1E+2", b"100.0"),
        (b"125e-2", b"1.25"),
        (b"9999999.99", b"9999999.99"),
        (b"12.499999999999999999", b"12.5"),
        (b"10000000.5", None),  # Java writes 1.00000005E7
        (b"1e10", None),
        (b"0.001", None),  # three digits after the point: not in the set checked
        (b"0.125", None),
        (b"1e400", None),
    ],
)
def test_a_number_has_sparks_text_or_none(number: bytes, text: bytes | None) -> None:
    assert spark_text(number) == text


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["ok", "number", "unsure", "broken", "blank", "two"]), max_size=300)
)
def test_each_value_keeps_its_place_whatever_fails_around_it(kinds: list[str]) -> None:
    """A batch that fails is split until the values at fault are alone; the rest are read, in
    order, each in its own row."""
    made = {
        "ok": lambda n: orjson.dumps({"type": f"t{n}"}),
        "number": lambda n: b'{"type":%d}' % n,  # read as Spark's text of it
        "unsure": lambda n: b'{"type":%d.5e10}' % n,  # left to Spark
        "broken": lambda n: b'{"type":"t%d"' % n,
        "blank": lambda n: b"",
        "two": lambda n: b'{"type":"t%d"}\n{"type":"x"}' % n,
    }
    values = [made[kind](n) for n, kind in enumerate(kinds)]
    fields_of = {"ok": lambda n: {"type": f"t{n}"}, "number": lambda n: {"type": f"{n}"}}
    expected = [fields_of[kind](n) if kind in fields_of else None for n, kind in enumerate(kinds)]
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
    """Numeric revenues (Segment's own spec) must not split a batch value by value: the pattern
    finds them, those whose text is known are read as it in one more call with the rest, and the
    others (one in ten here) are set aside for Spark."""
    from exactly.events import fields

    calls: list[int] = []
    read_block = fields._read_block

    def counted(values: list[bytes], schema: object) -> object:
        calls.append(len(values))
        return read_block(values, schema)

    monkeypatch.setattr(fields, "_read_block", counted)
    values = [
        orjson.dumps({"type": "track", "properties": {"revenue": revenue}})
        for n in range(1000)
        for revenue in [(n + 1) * 1e10 if n % 10 == 0 else n / 4 if n % 10 == 5 else str(n)]
    ]
    read = parse(values, FIELDS)
    assert calls == [1000, 900]
    assert [row is None for row in read.to_pylist()] == [n % 10 == 0 for n in range(1000)]
