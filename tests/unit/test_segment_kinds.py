"""The segment layout's column kinds: a value's kind, a new column's, widening, what fits, and the
rejects a table batch keeps."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly.errors import LakeError
from exactly.lake.columns import KINDS
from exactly.lake.segment.kinds import (
    KIND_ORDER,
    cell,
    fits,
    infer,
    instant,
    json_text,
    value_kind,
    widen,
)
from exactly.lake.segment.limits import Limits
from exactly.lake.segment.table import Draft, build, schema_kinds

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["free", "2026-03-01T10:00:00Z", "2026-03-01", "", "12.5"]),
)

untimed = settings(deadline=None)  # a busy machine is slow, not wrong


def test_the_kinds_are_the_lakes() -> None:
    assert set(KIND_ORDER) == set(KINDS)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, None),
        (True, "boolean"),
        (False, "boolean"),
        (0, "bigint"),
        (-(2**63), "bigint"),
        (2**63 - 1, "bigint"),
        (2**63, "double"),
        (12.5, "double"),
        (12.0, "double"),
        ("2026-03-01T10:00:00.000Z", "timestamp"),
        ("2026-03-01T10:00:00+02:00", "timestamp"),
        ("2026-03-01 10:00", "timestamp"),
        (datetime(2026, 3, 1, tzinfo=UTC), "timestamp"),
        ("2026-03-01", "string"),  # a day, not an instant
        ("2026-02-30T10:00:00Z", "string"),
        ("12.5", "string"),
        ("true", "string"),
        ("", "string"),
        ('["a","b"]', "string"),
    ],
)
def test_a_values_kind_is_its_json_type(value: Any, kind: str | None) -> None:
    assert value_kind(value) == kind


def test_instant_reads_iso_8601_as_utc() -> None:
    assert instant("2026-03-01T23:30:00+02:00") == datetime(2026, 3, 1, 21, 30, tzinfo=UTC)
    assert instant("2026-03-01T10:00:00") == datetime(2026, 3, 1, 10, tzinfo=UTC)
    assert instant("2026-03-01T10:00:00.123456789Z") == datetime(
        2026, 3, 1, 10, 0, 0, 123456, tzinfo=UTC
    )
    assert instant("2026-03-01T10:00:00,5Z") == datetime(2026, 3, 1, 10, 0, 0, 500000, tzinfo=UTC)
    assert instant("2026-03-01") is None
    assert instant("March 1st") is None
    assert instant("2026-03-01T25:00:00Z") is None
    assert instant("٢٠٢٦-03-01T10:00:00Z") is None  # only ASCII digits


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ([1, 2, 3], "bigint"),
        ([1, 2.5], "double"),
        ([1, 2, 3, 4, 0.5], "double"),  # bigint values count for double
        ([True, None, False], "boolean"),
        (["2026-03-01T10:00:00Z", "2026-03-02T10:00:00Z", "never"], "timestamp"),
        (["free", "paid", 12.5], "string"),
        ([12.5, 3.5, "free"], "double"),
        ([12.5, "free"], "double"),  # a tie goes to the typed kind
        ([True, 1], "bigint"),
        (["2026-03-01T10:00:00Z", 1.5], "timestamp"),
        (["a", True], "boolean"),
        ([None, None], None),
        ([], None),
    ],
)
def test_a_new_columns_kind_is_that_of_most_values(values: list[Any], kind: str | None) -> None:
    assert infer(values) == kind


@untimed
@given(st.lists(scalars, max_size=12), st.randoms(use_true_random=False))
def test_a_new_columns_kind_does_not_depend_on_row_order(values: list[Any], rng: Any) -> None:
    shuffled = list(values)
    rng.shuffle(shuffled)
    assert infer(shuffled) == infer(values)


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        (None, "bigint", True),
        ("free", "double", False),
        ("12.5", "double", False),
        (True, "bigint", False),
        (True, "double", False),
        (1, "boolean", False),
        (5, "double", True),
        (2**53 + 1, "double", False),  # a double cannot hold it exactly
        (2**70, "double", True),
        (12.5, "bigint", False),
        (12.0, "bigint", True),
        (1e19, "bigint", False),
        (2**63, "bigint", False),
        ("2026-03-01T10:00:00Z", "timestamp", True),
        ("2026-03-01", "timestamp", False),
        (1_700_000_000, "timestamp", False),
        (12.5, "string", True),
        (True, "string", True),
        ("free", "string", True),
        ("2026-03-01T10:00:00Z", "string", True),
    ],
)
def test_what_fits_a_column(value: Any, kind: str, expected: bool) -> None:
    assert fits(value, kind) is expected


def test_an_unknown_kind_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown kind"):
        fits(1, "decimal")


def test_a_cell_is_the_value_as_its_column_stores_it() -> None:
    assert cell(12.5, "string") == "12.5"
    assert cell(True, "string") == "true"
    assert cell(7, "string") == "7"
    assert cell("2026-03-01T10:00:00+01:00", "string") == "2026-03-01T10:00:00+01:00"
    assert cell(datetime(2026, 3, 1, tzinfo=UTC), "string") == "2026-03-01T00:00:00+00:00"
    assert cell(12.0, "bigint") == 12 and isinstance(cell(12.0, "bigint"), int)
    assert cell(5, "double") == 5.0 and isinstance(cell(5, "double"), float)
    assert cell("2026-03-01T10:00:00+01:00", "timestamp") == datetime(2026, 3, 1, 9, tzinfo=UTC)
    assert cell(None, "double") is None


@untimed
@given(scalars, st.sampled_from(KIND_ORDER))
def test_a_value_that_fits_is_stored_in_its_columns_arrow_type(value: Any, kind: str) -> None:
    if fits(value, kind):
        stored = pa.array([cell(value, kind)], type=KINDS[kind]).to_pylist()[0]
        if kind in ("bigint", "double") and value is not None:
            assert stored == value  # exactly the number sent
        assert (stored is None) is (value is None)


def test_a_bigint_column_widens_to_double_for_a_fraction_where_the_format_can() -> None:
    assert widen("bigint", [1, 2, 12.5], can_widen=True) == "double"
    assert widen("bigint", [1, 2, 12.5], can_widen=False) == "bigint"
    assert widen("bigint", [1, 2, 3.0], can_widen=True) == "bigint"  # no fraction
    assert widen("bigint", [True, "free"], can_widen=True) == "bigint"  # not numbers
    assert widen("bigint", [2**64], can_widen=True) == "double"  # past 64 bits
    assert widen("double", [1, "x"], can_widen=True) == "double"
    assert widen("timestamp", ["free"], can_widen=True) == "timestamp"
    assert widen("boolean", [1], can_widen=True) == "boolean"


def test_json_text_is_compact_sorted_and_takes_any_integer() -> None:
    assert json_text({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert json_text(2**70) == str(2**70)
    assert json_text({"n": 2**70, "s": "é"}) == f'{{"n":{2**70},"s":"é"}}'


def test_a_value_that_does_not_fit_is_null_in_its_column_and_kept_whole_in_rejected() -> None:
    known = {"id": "string", "_rejected": "string", "revenue": "double", "count": "bigint"}
    drafts = [
        Draft({"id": "a", "revenue": 12.5, "count": 1}),
        Draft({"id": "b", "revenue": "free", "count": True}),
        Draft({"id": "c", "revenue": {"amount": 3}, "count": 4}),
    ]
    found = build("orders", drafts, {"id": "string"}, known, limits=Limits(), can_widen=True)
    rows = found.rows.to_pylist()
    assert [r["revenue"] for r in rows] == [12.5, None, None]
    assert [r["count"] for r in rows] == [1, None, 4]
    assert rows[0]["_rejected"] is None
    assert orjson.loads(rows[1]["_rejected"]) == {"revenue": "free", "count": True}
    assert orjson.loads(rows[2]["_rejected"]) == {"revenue": {"amount": 3}}
    assert found.rejects == {"count": 1, "revenue": 2}
    assert found.new_columns == {} and found.widened == {}


def test_a_fraction_widens_a_known_bigint_column_or_is_rejected_where_it_cannot() -> None:
    known = {"id": "string", "_rejected": "string", "quantity": "bigint"}
    drafts = [Draft({"id": "a", "quantity": 2}), Draft({"id": "b", "quantity": 2.5})]
    wide = build("t", drafts, {"id": "string"}, known, limits=Limits(), can_widen=True)
    assert wide.widened == {"quantity": "double"}
    assert wide.rows.schema.field("quantity").type == pa.float64()
    assert wide.rows.column("quantity").to_pylist() == [2.0, 2.5]
    assert wide.rejects == {}
    strict = build("t", drafts, {"id": "string"}, known, limits=Limits(), can_widen=False)
    assert strict.widened == {}
    assert strict.rows.column("quantity").to_pylist() == [2, None]
    assert strict.rejects == {"quantity": 1}
    assert orjson.loads(strict.rows.column("_rejected")[1].as_py()) == {"quantity": 2.5}


def test_a_new_columns_minority_values_are_rejects() -> None:
    drafts = [Draft({"id": str(i), "plan": value}) for i, value in enumerate([1, 2, "pro", None])]
    found = build("t", drafts, {"id": "string"}, None, limits=Limits(), can_widen=True)
    assert found.new_columns == {"id": "string", "_rejected": "string", "plan": "bigint"}
    assert found.rows.column("plan").to_pylist() == [1, 2, None, None]
    assert found.rows.column("_rejected").to_pylist()[2] == '{"plan":"pro"}'
    assert found.rejects == {"plan": 1}


def test_a_stored_tables_arrow_schema_reads_back_as_its_kinds() -> None:
    built = build(
        "t",
        [Draft({"id": "a", "n": 1, "x": 1.5, "ok": True, "at": "2026-03-01T10:00:00Z"})],
        {"id": "string"},
        None,
        limits=Limits(),
        can_widen=False,
    )
    assert schema_kinds(built.rows.schema) == built.kinds
    other = pa.schema([("n", pa.int32()), ("s", pa.large_string()), ("f", pa.float32())])
    assert schema_kinds(other) == {"n": "bigint", "s": "string", "f": "double"}
    with pytest.raises(LakeError, match="date32"):
        schema_kinds(pa.schema([("date", pa.date32())]))
