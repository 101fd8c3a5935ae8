"""Aggregate table definitions: additive measures only, names SQL can take, the audit's compare."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from exactly.aggregate.audit import compare
from exactly.aggregate.spec import EVENT_COUNTS, parse_measure, parse_table, table_specs
from exactly.aggregate.stats import parse_since
from exactly.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "function", "argument"),
    [
        ("count(*)", "count", "*"),
        (" COUNT( userId ) ", "count", "userId"),
        ("sum(try_cast(properties.seats AS INT))", "sum", "try_cast(properties.seats AS INT)"),
    ],
)
def test_additive_measures_parse(text: str, function: str, argument: str) -> None:
    measure = parse_measure("t", "m", text)
    assert (measure.function, measure.argument) == (function, argument)


@pytest.mark.parametrize(
    "text",
    [
        "avg(properties.price)",
        "max(timestamp)",
        "min(x)",
        "count(DISTINCT userId)",
        "approx_count_distinct(userId)",
        "stddev(x)",
    ],
)
def test_non_additive_measures_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"measure 'm' = .* is not additive"):
        parse_measure("t", "m", text)


@pytest.mark.parametrize(
    ("name", "group_by", "measures", "message"),
    [
        ("Bad-Name", {"a": "event"}, {"n": "count(*)"}, "lower-case letters"),
        ("event_counts", {"a": "event"}, {"n": "count(*)"}, "built in"),
        ("exactly_batches", {"a": "event"}, {"n": "count(*)"}, "reserved"),
        ("t", {}, {"n": "count(*)"}, "at least one group_by"),
        ("t", {"a": "event"}, {}, "at least one measure"),
        ("t", {"n": "event"}, {"n": "count(*)"}, "named twice"),
        ("t", {"a": "event"}, {"n": "sum(*)"}, "sum"),
        ("t", {"a": "event"}, {"n": "properties.x"}, "write count"),
        ("t" * 64, {"a": "event"}, {"n": "count(*)"}, "64 characters; PostgreSQL keeps only 63"),
        ("t", {"a" * 64: "event"}, {"n": "count(*)"}, "64 characters; PostgreSQL keeps only 63"),
    ],
)
def test_bad_tables_are_refused(
    name: str, group_by: dict[str, str], measures: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_table(name, group_by, measures)


def test_event_counts_come_first_and_names_are_unique() -> None:
    specs = table_specs([("plans", {"plan": "properties.plan"}, {"n": "count(*)"})])
    assert [s.name for s in specs] == ["event_counts", "plans"]
    assert EVENT_COUNTS.columns == ("source", "type", "event", "minute", "count", "revenue")
    with pytest.raises(ConfigError, match="declared twice"):
        table_specs([("p", {"a": "event"}, {"n": "count(*)"})] * 2)


def test_a_definition_changes_with_any_expression() -> None:
    one = parse_table("p", {"plan": "properties.plan"}, {"n": "count(*)"})
    two = parse_table("p", {"plan": "properties.tier"}, {"n": "count(*)"})
    assert one.definition() != two.definition()


def test_compare_finds_missing_extra_and_changed_rows() -> None:
    key = ("web", "track", "A", "2024-01-01 00:00:00")
    truth = [(*key, 2, Decimal("1.500000"))]
    assert compare(EVENT_COUNTS, truth, truth, True) == []
    changed = compare(EVENT_COUNTS, [(*key, 3, Decimal("1.500000"))], truth, True)
    assert [(d.counted, d.recounted) for d in changed] == [
        ((3, Decimal("1.500000")), (2, Decimal("1.500000")))
    ]
    assert compare(EVENT_COUNTS, [], truth, True)[0].counted is None
    assert compare(EVENT_COUNTS, truth, [], True)[0].recounted is None
    # SQLite's REAL sums: a last-digit difference is no difference, a cent is
    near = [(*key, 2, Decimal("1.5000000000001"))]
    assert compare(EVENT_COUNTS, near, truth, False) == []
    assert compare(EVENT_COUNTS, [(*key, 2, Decimal("1.51"))], truth, False)


def test_since_takes_a_duration_or_a_time() -> None:
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert parse_since("90m", now) == "2024-05-01 10:30:00"
    assert parse_since("2024-04-30T08:15", now) == "2024-04-30 08:15:00"
    assert parse_since("2024-04-30T08:15:00+02:00", now) == "2024-04-30 06:15:00"
    with pytest.raises(ConfigError, match="--since"):
        parse_since("yesterday", now)
