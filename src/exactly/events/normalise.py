"""Validation and normalisation of Segment events, as the collector and the importer store them.

An event is a JSON object whose ``type`` is one of :data:`EVENT_TYPES` (the tracking API's path
gives it for single-event calls). Required, besides the type:

* every type but ``alias``: a non-empty ``userId`` or ``anonymousId`` (strings or integers);
* ``track``: a non-empty string ``event``;
* ``group``: a ``groupId``;
* ``alias``: ``userId`` and ``previousId``.

``properties``, ``traits``, ``context`` and ``integrations`` are objects when present; timestamps
are ISO-8601 strings (without a zone they are UTC). Normalisation keeps every field the client
sent, except ``writeKey``, and sets:

* ``messageId``: the client's (at most :data:`MAX_MESSAGE_ID_LENGTH` characters, integers
  become strings), else a new KSUID. A generated id is new on every retry of the client, so such
  events cannot be deduplicated across client retries;
* ``receivedAt``: the server's clock when the request arrived;
* ``originalTimestamp``: the client's ``timestamp`` as sent (or its ``originalTimestamp``);
* ``timestamp``: corrected for the client's clock skew, ``receivedAt - (sentAt -
  originalTimestamp)``, when the client sent both ``sentAt`` and a timestamp; the client's
  timestamp when it sent no ``sentAt``; ``receivedAt`` when it sent no timestamp, and also
  when either lies before 1970 or more than a day after ``receivedAt`` (year 1 and 9999 are the
  zero and maximum dates of Go and .NET): then ``timestampOutOfRange`` is ``true`` and
  ``originalTimestamp`` keeps what was sent;
* ``sourceId``: the source the write key belongs to;
* batch-level ``context`` and ``integrations`` merged under the event's own.

The stored event (its JSON, with these fields) is at most ``receipt.max_event_bytes`` (default
:data:`MAX_EVENT_BYTES`), and with its messageId at most ``receipt.max_record_bytes`` (the log's
record limit) when that is given, so one event the log would refuse is rejected alone instead of
failing the append it would have been grouped with. An event nested deeper than the JSON encoder
writes (orjson reads 1,024 levels but writes about 250) is rejected with ``too_deep``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import orjson

from exactly.errors import InvalidEvent
from exactly.events.ksuid import ksuid

EVENT_TYPES = frozenset({"track", "identify", "page", "screen", "group", "alias"})
MAX_EVENT_BYTES = 32 * 1024
MAX_MESSAGE_ID_LENGTH = 255
MAX_MESSAGE_ID_BYTES = 4 * MAX_MESSAGE_ID_LENGTH  # as UTF-8, the record key at most

MessageIdFor = Callable[[dict[str, Any]], str]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_AHEAD_MILLIS = 86_400_000  # an event time may be at most a day after receivedAt
OUT_OF_RANGE = "timestampOutOfRange"  # set (true) where timestamp is receivedAt for that reason
_MIN_MILLIS = (datetime(1, 1, 1, tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1)
_MAX_MILLIS = (datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC) - _EPOCH) // timedelta(
    milliseconds=1
)
_MINUTES: dict[int, str] = {}  # epoch minute -> "YYYY-MM-DDTHH:MM:", a cache for format_millis


class Normalised(NamedTuple):
    """An event ready for the log: its messageId (the record key) and its JSON (the value)."""

    message_id: str
    value: bytes


def parse_time(text: object, name: str) -> datetime:
    """An ISO-8601 timestamp as an aware datetime (UTC when it names no zone)."""
    if type(text) is not str:
        raise InvalidEvent("invalid_timestamp", f"{name} must be an ISO-8601 string")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        try:  # RFC 3339 allows a lower-case "t" and "z"
            parsed = datetime.fromisoformat(text.upper())
        except ValueError:
            raise InvalidEvent(
                "invalid_timestamp", f"{name} is not an ISO-8601 timestamp: {text[:40]!r}"
            ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def parse_millis(text: object, name: str) -> int:
    """An ISO-8601 timestamp as milliseconds since the Unix epoch (UTC when it names no zone)."""
    try:
        since = parse_time(text, name) - _EPOCH
    except OverflowError:  # a zone offset pushed it past year 1 or 9999
        raise InvalidEvent("invalid_timestamp", f"{name} is out of range") from None
    return (since.days * 86_400 + since.seconds) * 1000 + since.microseconds // 1000


def format_millis(millis: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS.mmmZ``, the one timestamp format the pipeline writes."""
    if not _MIN_MILLIS <= millis <= _MAX_MILLIS:
        raise InvalidEvent("invalid_timestamp", "the corrected timestamp is out of range")
    minute, rest = divmod(millis, 60_000)
    prefix = _MINUTES.get(minute)
    if prefix is None:
        if len(_MINUTES) >= 10_000:
            _MINUTES.clear()
        m = _EPOCH + timedelta(minutes=minute)
        prefix = _MINUTES[minute] = (
            f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:"
        )
    seconds, rest = divmod(rest, 1000)
    return f"{prefix}{seconds:02d}.{rest:03d}Z"


def format_time(moment: datetime) -> str:
    """``moment`` in the pipeline's timestamp format (see :func:`format_millis`)."""
    since = moment - _EPOCH
    return format_millis((since.days * 86_400 + since.seconds) * 1000 + since.microseconds // 1000)


def _object(value: object, name: str) -> dict[str, Any] | None:
    if value is None or type(value) is dict:
        return value
    raise InvalidEvent("invalid_field", f"{name} must be an object")


@dataclass(frozen=True, slots=True)
class Receipt:
    """What is known of a request (or an import) when its events are normalised.

    Build it with :meth:`of`; ``envelope`` is the batch object, whose ``sentAt``, ``context`` and
    ``integrations`` apply to every event in it. ``keep_received_at`` (the importer) keeps an
    event's own valid ``receivedAt``, so replaying an export reproduces its timestamps.
    """

    source_id: str
    received_millis: int
    sent_at: str | None = None
    context: dict[str, Any] | None = None
    integrations: dict[str, Any] | None = None
    keep_received_at: bool = False
    max_event_bytes: int = MAX_EVENT_BYTES
    max_record_bytes: int | None = None
    received_text: str = field(init=False)
    sent_millis: int | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "received_text", format_millis(self.received_millis))
        sent = None if self.sent_at is None else parse_millis(self.sent_at, "sentAt")
        object.__setattr__(self, "sent_millis", sent)

    @classmethod
    def of(
        cls,
        source_id: str,
        envelope: dict[str, Any] | None = None,
        *,
        received_at: datetime | None = None,
        keep_received_at: bool = False,
        max_event_bytes: int = MAX_EVENT_BYTES,
        max_record_bytes: int | None = None,
    ) -> Receipt:
        """A receipt for now (or ``received_at``); :class:`InvalidEvent` for a bad envelope."""
        envelope = envelope or {}
        sent_at = envelope.get("sentAt")
        if sent_at is not None and type(sent_at) is not str:
            raise InvalidEvent("invalid_timestamp", "sentAt must be an ISO-8601 string")
        since = (received_at or datetime.now(UTC)) - _EPOCH
        return cls(
            source_id,
            (since.days * 86_400 + since.seconds) * 1000 + since.microseconds // 1000,
            sent_at,
            _object(envelope.get("context"), "context"),
            _object(envelope.get("integrations"), "integrations"),
            keep_received_at,
            max_event_bytes,
            max_record_bytes,
        )


def _id(event: dict[str, Any], name: str) -> str | None:
    """The id field ``name`` as a string (integers are converted in place); None if absent."""
    value = event.get(name)
    if value is None:
        return None
    kind = type(value)
    if kind is str:
        return value or None
    if kind is int:
        text = str(value)
        event[name] = text
        return text
    raise InvalidEvent("invalid_field", f"{name} must be a string")


def _require(event: dict[str, Any], kind: str) -> None:
    user_id = _id(event, "userId")
    if kind == "alias":
        if user_id is None or _id(event, "previousId") is None:
            raise InvalidEvent("missing_field", "alias needs userId and previousId")
        return
    if user_id is None and _id(event, "anonymousId") is None:
        raise InvalidEvent("missing_field", f"{kind} needs userId or anonymousId")
    if kind == "track":
        name = event.get("event")
        if type(name) is not str or not name:
            raise InvalidEvent("missing_field", "track needs event, a non-empty string")
    elif kind == "group" and _id(event, "groupId") is None:
        raise InvalidEvent("missing_field", "group needs groupId")


def _check_fields(event: dict[str, Any]) -> None:
    get = event.get
    for name in ("properties", "traits", "context", "integrations"):
        value = get(name)
        if value is not None and type(value) is not dict:
            raise InvalidEvent("invalid_field", f"{name} must be an object")
    for name in ("name", "category"):
        value = get(name)
        if value is not None and type(value) is not str:
            raise InvalidEvent("invalid_field", f"{name} must be a string")


def _timestamps(event: dict[str, Any], receipt: Receipt) -> None:
    """Set receivedAt, originalTimestamp, sentAt and the skew-corrected timestamp."""
    get = event.get
    received, received_text = receipt.received_millis, receipt.received_text
    if receipt.keep_received_at and (own := get("receivedAt")) is not None:
        received = parse_millis(own, "receivedAt")
        received_text = format_millis(received)
    original_text = get("originalTimestamp")
    if original_text is None:
        original_text = get("timestamp")
    sent_text = get("sentAt")
    if sent_text is None:
        sent_text, sent = receipt.sent_at, receipt.sent_millis
    else:
        sent = parse_millis(sent_text, "sentAt")
    if original_text is None:
        event["timestamp"] = received_text
    else:
        original = parse_millis(original_text, "timestamp")
        when = original if sent is None else received - (sent - original)
        if 0 <= when <= received + MAX_AHEAD_MILLIS:
            event["timestamp"] = format_millis(when)
        else:  # a zero or maximum date (Go's, .NET's), a clock years off: not an event time
            event["timestamp"] = received_text
            event[OUT_OF_RANGE] = True
        event["originalTimestamp"] = original_text
    if sent_text is not None:
        event["sentAt"] = sent_text
    event["receivedAt"] = received_text


def message_id_of(event: dict[str, Any]) -> str | None:
    """The messageId an event carries, by the one rule every reader of events applies.

    A string of at most :data:`MAX_MESSAGE_ID_LENGTH` characters, or an integer (as its digits);
    None when it is missing or empty. Raises :class:`InvalidEvent` for any other value.
    """
    value = event.get("messageId")
    if value is None or value == "":
        return None
    if type(value) is int:
        value = str(value)
    elif type(value) is not str:
        raise InvalidEvent("invalid_field", "messageId must be a string")
    _check_message_id(value)
    return value


def _check_message_id(value: str) -> None:
    if len(value) > MAX_MESSAGE_ID_LENGTH:
        raise InvalidEvent(
            "invalid_field", f"messageId is longer than {MAX_MESSAGE_ID_LENGTH} characters"
        )


def _message_id(event: dict[str, Any], message_id_for: MessageIdFor | None) -> str:
    value = message_id_of(event)
    if value is None:
        value = message_id_for(event) if message_id_for is not None else ksuid()
        _check_message_id(value)
    event["messageId"] = value
    return value


def normalise(
    event: object,
    receipt: Receipt,
    kind: str | None = None,
    message_id_for: MessageIdFor | None = None,
) -> Normalised:
    """Check ``event`` and return it normalised (see the module docstring); modifies it in place.

    ``kind`` is the type the API path gives (None: the event's own ``type``). ``message_id_for``
    makes the id of an event without one (default: a random KSUID). Raises
    :class:`InvalidEvent` naming the first rule broken.
    """
    if type(event) is not dict:
        raise InvalidEvent("not_an_object", "an event must be a JSON object")
    if kind is None:
        kind = event.get("type")
        if type(kind) is not str or kind not in EVENT_TYPES:
            raise InvalidEvent(
                "invalid_type", "type must be one of " + ", ".join(sorted(EVENT_TYPES))
            )
    event["type"] = kind
    _require(event, kind)
    _check_fields(event)
    _timestamps(event, receipt)
    if receipt.context:
        own = event.get("context")
        event["context"] = {**receipt.context, **own} if own else dict(receipt.context)
    if receipt.integrations:
        own = event.get("integrations")
        event["integrations"] = (
            {**receipt.integrations, **own} if own else dict(receipt.integrations)
        )
    message_id = _message_id(event, message_id_for)
    if "writeKey" in event:
        del event["writeKey"]
    event["sourceId"] = receipt.source_id
    try:
        value = orjson.dumps(event)
    except orjson.JSONEncodeError as error:  # nested deeper than the encoder writes
        raise InvalidEvent(
            "too_deep", f"the event cannot be stored: {error} (it nests too deeply)"
        ) from None
    if len(value) > receipt.max_event_bytes:
        raise InvalidEvent(
            "too_large",
            f"the event is {len(value)} bytes as stored; the limit is {receipt.max_event_bytes}",
        )
    limit = receipt.max_record_bytes
    if limit is not None and len(value) + len(message_id.encode()) > limit:
        raise InvalidEvent(
            "too_large",
            f"the event and its messageId are more than the log's record limit, {limit} bytes",
        )
    return Normalised(message_id, value)
