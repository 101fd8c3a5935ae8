"""Validation and normalisation of events: required fields, ids, timestamps and clock skew."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly.errors import InvalidEvent
from exactly.events import (
    MAX_EVENT_BYTES,
    MAX_MESSAGE_ID_LENGTH,
    Receipt,
    format_millis,
    format_time,
    message_id_of,
    normalise,
    parse_millis,
)

NOW = datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def receipt(envelope: dict[str, Any] | None = None, **options: Any) -> Receipt:
    return Receipt.of("web", envelope, received_at=NOW, **options)


def stored(event: object, kind: str | None = None, **envelope: Any) -> dict[str, Any]:
    result = normalise(event, receipt(envelope or None), kind)
    document: dict[str, Any] = json.loads(result.value)
    assert document["messageId"] == result.message_id
    return document


def code_of(event: object, kind: str | None = None, **envelope: Any) -> str:
    with pytest.raises(InvalidEvent) as error:
        normalise(event, receipt(envelope or None), kind)
    return error.value.code


VALID = {
    "track": {"event": "Signed Up", "userId": "u"},
    "identify": {"anonymousId": "a"},
    "page": {"userId": "u", "name": "Home"},
    "screen": {"userId": "u"},
    "group": {"userId": "u", "groupId": "g"},
    "alias": {"userId": "u", "previousId": "p"},
}


@pytest.mark.parametrize("kind", sorted(VALID))
def test_each_type_valid_by_path_and_by_field(kind: str) -> None:
    assert stored(dict(VALID[kind]), kind)["type"] == kind
    assert stored({"type": kind, **VALID[kind]})["type"] == kind


@pytest.mark.parametrize(
    ("kind", "event"),
    [
        ("track", {"userId": "u"}),
        ("track", {"userId": "u", "event": ""}),
        ("track", {"userId": "u", "event": 5}),
        ("track", {"event": "e"}),
        ("track", {"event": "e", "userId": "", "anonymousId": None}),
        ("identify", {"traits": {}}),
        ("group", {"userId": "u"}),
        ("alias", {"userId": "u"}),
        ("alias", {"previousId": "p", "anonymousId": "a"}),
    ],
)
def test_missing_required_fields(kind: str, event: dict[str, Any]) -> None:
    assert code_of(event, kind) == "missing_field"


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ([], "not_an_object"),
        ("text", "not_an_object"),
        ({"userId": "u"}, "invalid_type"),
        ({"type": "Track", "userId": "u"}, "invalid_type"),
        ({"type": ["track"], "userId": "u"}, "invalid_type"),
        ({"type": "identify", "userId": 1.5}, "invalid_field"),
        ({"type": "identify", "userId": True}, "invalid_field"),
        ({"type": "identify", "userId": "u", "traits": []}, "invalid_field"),
        ({"type": "identify", "userId": "u", "context": "x"}, "invalid_field"),
        ({"type": "page", "userId": "u", "name": 3}, "invalid_field"),
        ({"type": "identify", "userId": "u", "messageId": {"a": 1}}, "invalid_field"),
        ({"type": "identify", "userId": "u", "messageId": "m" * 256}, "invalid_field"),
        ({"type": "identify", "userId": "u", "timestamp": "soon"}, "invalid_timestamp"),
        ({"type": "identify", "userId": "u", "timestamp": 1714564800}, "invalid_timestamp"),
        ({"type": "identify", "userId": "u", "sentAt": "2024-13-01"}, "invalid_timestamp"),
        ({"type": "identify", "userId": "u", "blob": "x" * MAX_EVENT_BYTES}, "too_large"),
    ],
)
def test_invalid_events_name_the_rule(event: object, code: str) -> None:
    assert code_of(event) == code


def test_ids_message_id_write_key_source() -> None:
    event = stored({"type": "identify", "userId": 7, "messageId": 12, "writeKey": "secret"})
    assert event["userId"] == "7" and event["messageId"] == "12"
    assert "writeKey" not in event and event["sourceId"] == "web"
    generated = stored({"type": "identify", "userId": "u", "messageId": ""})["messageId"]
    assert len(generated) == 27
    derived = normalise(
        {"type": "identify", "userId": "u"}, receipt(), message_id_for=lambda e: "fixed"
    )
    assert derived.message_id == "fixed"


def test_unknown_fields_and_nulls_are_kept() -> None:
    event = stored({"type": "track", "event": "e", "userId": "u", "anonymousId": None, "x": [1]})
    assert event["anonymousId"] is None and event["x"] == [1]


def test_timestamps_without_client_times_are_the_receipt() -> None:
    event = stored(dict(VALID["track"]), "track")
    assert event["receivedAt"] == event["timestamp"] == "2024-05-01T12:00:00.250Z"
    assert "originalTimestamp" not in event and "sentAt" not in event


def test_without_sent_at_the_client_timestamp_is_kept_in_utc() -> None:
    event = stored({**VALID["track"], "timestamp": "2024-04-30T14:00:00.5+02:00"}, "track")
    assert event["timestamp"] == "2024-04-30T12:00:00.500Z"
    assert event["originalTimestamp"] == "2024-04-30T14:00:00.5+02:00"


def test_clock_skew_is_corrected_from_batch_or_event_sent_at() -> None:
    # the client's clock is 10 minutes fast: it stamped the event 2 s before sending it
    sent = NOW + timedelta(minutes=10)
    original = sent - timedelta(seconds=2)
    iso = original.isoformat().replace("+00:00", "Z")
    batch = stored({**VALID["track"], "timestamp": iso}, "track", sentAt=sent.isoformat())
    assert batch["timestamp"] == format_time(NOW - timedelta(seconds=2))
    assert batch["sentAt"] == sent.isoformat() and batch["originalTimestamp"] == iso
    own = stored({**VALID["track"], "timestamp": iso, "sentAt": sent.isoformat()}, "track")
    assert own["timestamp"] == batch["timestamp"]


def test_original_timestamp_field_wins_and_lowercase_rfc3339_parses() -> None:
    event = stored(
        {**VALID["track"], "originalTimestamp": "2024-01-01t00:00:00z", "timestamp": "junk"},
        "track",
    )
    assert event["timestamp"] == "2024-01-01T00:00:00.000Z"


def test_keep_received_at_replays_an_export() -> None:
    exported = {
        **VALID["track"],
        "receivedAt": "2023-01-01T00:00:10.000Z",
        "sentAt": "2023-01-01T00:00:05.000Z",
        "originalTimestamp": "2023-01-01T00:00:04.000Z",
    }
    replayed = normalise(dict(exported), receipt(keep_received_at=True), "track")
    document = json.loads(replayed.value)
    assert document["receivedAt"] == "2023-01-01T00:00:10.000Z"
    assert document["timestamp"] == "2023-01-01T00:00:09.000Z"
    fresh = json.loads(normalise(dict(exported), receipt(), "track").value)
    assert fresh["receivedAt"] == "2024-05-01T12:00:00.250Z"


@pytest.mark.parametrize(
    ("timestamp", "sent_at"),
    [
        ("0001-01-01T00:00:00Z", None),  # Go's zero time, .NET's DateTime.MinValue
        ("0001-01-01T00:00:00+01:00", None),  # before year 1 in UTC
        ("9999-12-31T23:59:59Z", None),  # .NET's DateTime.MaxValue
        ("1969-12-31T23:59:59.999Z", None),
        ("2024-05-02T12:00:00.251Z", None),  # a day and a millisecond after receivedAt
        ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z"),  # corrected: before year 1
        ("2024-05-01T12:00:00Z", "2000-01-01T00:00:00Z"),  # corrected: 24 years ahead
    ],
)
def test_event_times_out_of_range_become_received_at_flagged(
    timestamp: str, sent_at: str | None
) -> None:
    envelope = {} if sent_at is None else {"sentAt": sent_at}
    event = stored({**VALID["track"], "timestamp": timestamp}, "track", **envelope)
    assert event["timestamp"] == event["receivedAt"] == "2024-05-01T12:00:00.250Z"
    assert event["timestampOutOfRange"] is True
    assert event["originalTimestamp"] == timestamp


@pytest.mark.parametrize(
    "timestamp",
    ["1970-01-01T00:00:00.000Z", "2024-05-02T12:00:00.250Z", "2019-03-04T05:06:07.000Z"],
)
def test_event_times_in_range_are_kept(timestamp: str) -> None:
    event = stored({**VALID["track"], "timestamp": timestamp}, "track")
    assert event["timestamp"] == timestamp
    assert "timestampOutOfRange" not in event


def test_envelope_context_and_integrations_merge_under_the_event() -> None:
    event = stored(
        {**VALID["track"], "context": {"ip": "2"}},
        "track",
        context={"ip": "1", "library": {"name": "x"}},
        integrations={"All": True},
    )
    assert event["context"] == {"ip": "2", "library": {"name": "x"}}
    assert event["integrations"] == {"All": True}
    with pytest.raises(InvalidEvent):
        Receipt.of("web", {"context": []})
    with pytest.raises(InvalidEvent):
        Receipt.of("web", {"sentAt": 5})


@given(st.integers(min_value=-62_135_596_800_000, max_value=253_402_300_799_999))
def test_format_and_parse_millis_round_trip(millis: int) -> None:
    assert parse_millis(format_millis(millis), "t") == millis


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
_FIELDS = st.sampled_from(
    ["type", "event", "userId", "anonymousId", "messageId", "timestamp", "sentAt", "groupId",
     "previousId", "properties", "traits", "context", "name", "originalTimestamp"]
)  # fmt: skip


@given(
    st.dictionaries(_FIELDS, _JSON | st.sampled_from(["track", "2024-01-01T00:00:00Z"])),
    st.sampled_from([None, "track", "alias"]),
)
def test_any_input_is_either_normalised_or_an_invalid_event(event: Any, kind: str | None) -> None:
    try:
        result = normalise(event, receipt(), kind)
    except InvalidEvent as error:
        assert error.code and error.message
        return
    document = json.loads(result.value)
    assert document["type"] in VALID and document["sourceId"] == "web"
    for name in ("timestamp", "receivedAt"):
        parse_millis(document[name], name)


@pytest.mark.parametrize("levels", [253, 300, 1020])
def test_an_event_nested_deeper_than_the_encoder_writes_is_invalid(levels: int) -> None:
    """orjson reads 1,024 levels but writes about 250: such an event is refused, not a crash."""
    nested: list[Any] = []
    inner = nested
    for _ in range(levels - 1):
        inner.append([])
        inner = inner[0]
    event = {"type": "track", "event": "e", "userId": "u", "properties": {"x": nested}}
    assert code_of(event) == "too_deep"


def test_the_record_limit_rejects_the_one_event() -> None:
    event = {"type": "track", "event": "e", "userId": "u", "messageId": "m" * 200}
    small = Receipt.of("web", received_at=NOW, max_record_bytes=300)
    with pytest.raises(InvalidEvent) as error:
        normalise(dict(event), small)
    assert error.value.code == "too_large" and "record limit" in error.value.message
    assert normalise(dict(event), Receipt.of("web", received_at=NOW, max_record_bytes=1000))


def test_a_lower_event_limit() -> None:
    event = {"type": "track", "event": "e", "userId": "u", "properties": {"p": "x" * 2000}}
    with pytest.raises(InvalidEvent) as error:
        normalise(dict(event), Receipt.of("web", received_at=NOW, max_event_bytes=1024))
    assert error.value.code == "too_large" and "1024" in error.value.message


@given(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=["Cs"]), max_size=300)
    | st.lists(st.integers(0, 9), max_size=2)
)
@settings(deadline=None)  # the first example imports the dedupe task (slow on a loaded machine)
def test_dedupe_reads_a_message_id_by_the_collectors_rule(found: object) -> None:
    from exactly.dedupe.task import message_id

    event = {"type": "track", "messageId": found}
    try:
        expected = message_id_of(event)
    except InvalidEvent:
        expected = None
    key, reason = message_id(None, orjson.dumps(event))
    assert key == (None if expected is None else expected.encode())
    assert (reason is None) == (expected is not None)
    if isinstance(found, str) and len(found) > MAX_MESSAGE_ID_LENGTH:
        assert reason == f"messageId is longer than {MAX_MESSAGE_ID_LENGTH} characters"


def test_integers_beyond_64_bits_are_stored_as_floats() -> None:
    body = (
        b'{"event":"e","userId":"u","properties":{"over":18446744073709551616,'
        b'"max":18446744073709551615,"min":-9223372036854775808,"under":-9223372036854775809}}'
    )  # the rule of docs/collector.md: orjson reads integers from -2**63 to 2**64-1 exactly
    event = stored(orjson.loads(body), "track")
    assert event["properties"] == {
        "over": float(2**64),
        "max": 2**64 - 1,
        "min": -(2**63),
        "under": float(-(2**63) - 1),
    }
    assert type(event["properties"]["over"]) is float
