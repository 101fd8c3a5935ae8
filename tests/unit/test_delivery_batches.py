"""Batches' pure parts: ids, where a batch is cut, bodies in each format, the settings."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from exactly.delivery.batches import OVERHEAD, batch_id, body, cut
from exactly.delivery.settings import DestinationSettings

FORMS = st.sampled_from(["json-array", "ndjson", "segment"])


def test_a_batch_id_names_its_destination_and_members() -> None:
    members = [(1, "m1"), (2, "m2")]
    assert batch_id("hook", members) == batch_id("hook", list(members))
    assert batch_id("hook", members) != batch_id("other", members)
    assert batch_id("hook", members) != batch_id("hook", [(1, "m1")])
    assert batch_id("hook", members) != batch_id("hook", [(3, "m1"), (4, "m2")])  # a replay
    assert len(batch_id("hook", members)) <= 64


@given(
    st.lists(st.integers(min_value=1, max_value=5_000), max_size=60),
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=1024, max_value=20_000),
    FORMS,
)
def test_a_cut_keeps_both_limits_and_takes_at_least_one(
    sizes: list[int], max_events: int, max_bytes: int, form: str
) -> None:
    count, full = cut(sizes, max_events=max_events, max_bytes=max_bytes, form=form)
    assert count <= max_events and count <= len(sizes)
    if sizes:
        assert count >= 1
    if count > 1:  # a body holds the events and a separator each, within max_bytes
        assert OVERHEAD[form] + sum(size + 1 for size in sizes[:count]) <= max_bytes
    if count < len(sizes):
        assert full  # cut short only by a limit
    if not full:
        assert count == len(sizes) < max_events


@given(
    st.lists(
        st.dictionaries(st.sampled_from(["messageId", "event", "n"]), st.text(max_size=5)),
        min_size=1,
        max_size=8,
    ),
    FORMS,
)
def test_every_format_gives_the_events_back_in_order(
    events: list[dict[str, str]], form: str
) -> None:
    payloads = [json.dumps(event).encode() for event in events]
    sent = body(form, payloads, 1_700_000_000.5)
    if form == "json-array":
        assert json.loads(sent) == events
    elif form == "ndjson":
        assert [json.loads(line) for line in sent.splitlines()] == events
    else:
        document = json.loads(sent)
        assert document["batch"] == events
        assert document["sentAt"] == "2023-11-14T22:13:20.500Z"


def test_ndjson_puts_a_pretty_printed_payload_on_one_line() -> None:
    sent = body("ndjson", [b'{\n  "a": "x\\ny"\n}', b'{"b":1}'], 0)
    assert sent == b'{"a":"x\\ny"}\n{"b":1}\n'


def test_batch_settings() -> None:
    plain = DestinationSettings(name="d", url="http://x")
    assert plain.batch.max_events == 1 and not plain.batching
    batched = DestinationSettings.model_validate(
        {
            "name": "d",
            "url": "http://x",
            "batch": {"max_events": 50, "max_wait": "200ms", "format": "segment"},
        }
    )
    assert batched.batching and batched.batch.max_wait == pytest.approx(0.2)
    with pytest.raises(ValidationError, match="format"):
        DestinationSettings.model_validate(
            {"name": "d", "url": "http://x", "batch": {"max_events": 5, "format": "csv"}}
        )
    with pytest.raises(ValidationError, match="max_events"):
        DestinationSettings.model_validate(
            {"name": "d", "url": "http://x", "batch": {"max_events": 0}}
        )
