"""The pure parts of destinations that choose and shape: settings, the integrations rule, a
transform's outcome on one event, and the jobs a micro-batch's columns make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from exactly.config import anchor_paths
from exactly.delivery.integrations import takes
from exactly.delivery.jobdb.base import bucket_of
from exactly.delivery.route import EventColumns, Outcome, dropped, jobs_for
from exactly.delivery.settings import DestinationSettings
from exactly.delivery.transforms import DROPPED, FAILED, SENT, one_line, shape_one


def destination(**given: Any) -> DestinationSettings:
    return DestinationSettings(name=given.pop("name", "crm"), url="http://127.0.0.1:9/", **given)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"filter": "  "}, "filter is blank"),
        ({"filter": "type = '" + "x" * 5000 + "'"}, "at most 5,000"),
        ({"transform": "shapes"}, "is not MODULE:FUNCTION"),
        ({"transform": "shapes:to crm"}, "is not MODULE:FUNCTION"),
        ({"transform": "1shapes:f"}, "is not MODULE:FUNCTION"),
        ({"name": "All"}, "Segment's integrations object uses it"),
        ({"lanes": 4, "batch": {"max_events": 100}}, "lanes is for single-event destinations"),
    ],
)
def test_a_filter_transform_or_name_that_cannot_work_is_refused(
    given: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        destination(**given)
    assert says in str(raised.value)


def test_a_transform_is_looked_for_beside_the_config_file(tmp_path: Path) -> None:
    document = {
        "destinations": [
            {"name": "a", "url": "http://x/", "transform": "shapes:f"},
            {"name": "b", "url": "http://x/"},
            {"name": "c", "url": "http://x/", "transform": "s:f", "transform_dir": "lib"},
        ]
    }
    anchored = anchor_paths(document, tmp_path)["destinations"]
    assert anchored[0]["transform_dir"] == str(tmp_path / ".")
    assert "transform_dir" not in anchored[1]
    assert anchored[2]["transform_dir"] == str(tmp_path / "lib")


def segment_rule(integrations: Any, name: str) -> bool:
    """analytics-next's: disabled when the key is false, or when All is false and the key is
    missing or null (a string "false" counts as false here, as Spark reads it)."""
    if not isinstance(integrations, dict):
        return True
    value = integrations.get(name)
    if value is False or value == "false":
        return False
    all_ = integrations.get("All")
    return not (value is None and (all_ is False or all_ == "false"))


values = st.one_of(
    st.booleans(), st.none(), st.just("false"), st.text(max_size=3), st.just({"opt": 1})
)


@given(st.dictionaries(st.sampled_from(["All", "crm", "CRM", "other"]), values), st.just("crm"))
def test_the_integrations_rule_is_segments(integrations: dict[str, Any], name: str) -> None:
    assert takes(integrations, name) == segment_rule(integrations, name)


def test_the_integrations_examples_of_the_issue() -> None:
    assert takes({"All": False, "crm": True}, "crm") and not takes({"All": False}, "crm")
    assert not takes({"crm": False}, "crm") and takes({"crm": False}, "other")
    assert takes({"CRM": False}, "crm")  # names match exactly, as in Segment
    assert takes(None, "crm") and takes({}, "crm") and takes({"crm": {"key": 1}}, "crm")


def test_a_transform_sends_a_dict_drops_none_and_fails_anything_else_alone() -> None:
    event = orjson.dumps({"messageId": "m1", "properties": {"n": 2}})

    def double(found: dict[str, Any]) -> Any:
        return {"n": found["properties"]["n"] * 2}

    assert shape_one(double, event) == (SENT, b'{"n":4}', None)
    assert shape_one(lambda _: None, event) == (DROPPED, None, None)
    assert shape_one(lambda _: [1], event) == (
        FAILED,
        None,
        "the transform returned list, not a dict",
    )
    outcome, body, error = shape_one(lambda _: {"s": {1}}, event)
    assert (outcome, body) == (FAILED, None) and error is not None and error.startswith("TypeError")

    def boom(_: dict[str, Any]) -> Any:
        raise ValueError("first\nsecond " + "x" * 500)

    def leaves(_: dict[str, Any]) -> Any:
        raise SystemExit(3)  # a transform calling sys.exit() fails its event, not the worker

    assert shape_one(leaves, event) == (FAILED, None, "SystemExit: 3")
    outcome, _, error = shape_one(boom, event)
    assert outcome == FAILED and error == one_line(ValueError("first\nsecond " + "x" * 500))
    assert error is not None and "\n" not in error and len(error) <= 200


def test_jobs_follow_the_columns_takes_and_the_transforms_outcomes() -> None:
    events = EventColumns(
        source=["web", "web", "ios"],
        name=["A", "B", None],
        message_id=["m1", "m2", "m3"],
        user_id=["u1", None, "u3"],
        payload=[b"1", b"2", b"3"],
        partition=[0, 0, 1],
        offset=[0, 1, 0],
        takes=[[True, False, True], [True, True, True]],
        shaped={
            1: [
                Outcome(SENT, b"shaped-1", None),
                Outcome(DROPPED, None, None),
                Outcome(FAILED, None, "ValueError: no"),
            ]
        },
    )
    plain, crm = destination(name="plain"), destination(name="crm", transform="s:f")
    jobs = jobs_for(events, [plain, crm], now=0.0)
    assert [(job.destination, job.message_id, job.payload, job.error) for job in jobs] == [
        ("plain", "m1", b"1", None),
        ("plain", "m3", b"3", None),
        ("crm", "m1", b"shaped-1", None),
        ("crm", "m3", b"3", "ValueError: no"),  # the stored event, for trace and the archive
    ]
    assert dropped(events, [plain, crm]) == {"crm": 1}


def test_a_single_event_destinations_jobs_are_in_their_users_lanes() -> None:
    """With ``lanes = 8`` each user's jobs share a lane (one bucket, so an ordered destination
    keeps their order); by default, and for a batching destination, every job is in lane 0."""
    users = [f"u{i}" for i in range(40)] * 2
    events = EventColumns(
        source=["web"] * 80,
        name=["A"] * 80,
        message_id=[f"m{i}" for i in range(80)],
        user_id=users,
        payload=[b"{}"] * 80,
        partition=[0] * 80,
        offset=list(range(80)),
    )
    hook, one, packed = (
        destination(name="hook", lanes=8),
        destination(name="one"),
        destination(name="packed", batch={"max_events": 100}),
    )
    assert (one.lanes, packed.lanes) == (1, 1)
    jobs = jobs_for(events, [hook, one, packed], now=0.0)
    lanes = {job.user_id: job.lane for job in jobs if job.destination == "hook"}
    assert all(
        job.lane == lanes[job.user_id] and job.bucket == bucket_of("web", "hook", job.lane)
        for job in jobs
        if job.destination == "hook"
    )
    assert len(set(lanes.values())) == 8  # 40 users fill 8 lanes
    assert {job.bucket for job in jobs if job.destination != "hook"} == {"web/one", "web/packed"}
