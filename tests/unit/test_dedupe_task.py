"""Where the dedupe task finds a record's messageId (pure)."""

from __future__ import annotations

import pytest

from exactly.dedupe.recovery import SOURCE_HEADER, source_offset
from exactly.dedupe.task import message_id


@pytest.mark.parametrize(
    ("key", "value", "found"),
    [
        (b"m-1", b"not even json", b"m-1"),  # the key wins: the value is not parsed
        (None, b'{"messageId": "m-2"}', b"m-2"),
        (b"", b'{"messageId": "m-3"}', b"m-3"),
        (None, b'{"messageId": 42}', b"42"),
        (None, '{"messageId": "é"}'.encode(), "é".encode()),
    ],
)
def test_message_id_from_the_key_else_the_json(
    key: bytes | None, value: bytes, found: bytes
) -> None:
    assert message_id(key, value) == (found, None)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"type": "track"}', "no messageId"),
        (b'{"messageId": ""}', "no messageId"),
        (b'{"messageId": true}', "no messageId"),
        (b'{"messageId": {"a": 1}}', "no messageId"),
    ],
)
def test_records_without_a_message_id_say_why(value: bytes, reason: str) -> None:
    found, why = message_id(None, value)
    assert found is None and why is not None and reason in why


def test_source_offset_header() -> None:
    assert source_offset(((SOURCE_HEADER, b"17"),)) == 17
    assert source_offset((("other", b"1"),)) is None
    assert source_offset(((SOURCE_HEADER, b"x"),)) is None
