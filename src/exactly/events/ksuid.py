"""KSUIDs: the messageId the collector gives an event that arrived without one.

A KSUID is 20 bytes, a 4-byte big-endian count of seconds since 2014-05-13T16:53:20Z followed by
16 payload bytes, written as 27 base-62 characters (``0-9A-Za-z``), so that ids sort by time as
text. The payload is random by default; the importer passes a digest instead, so that the id of a
line is the same on every run and a resumed import puts it in the same partition.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

KSUID_EPOCH = 1_400_000_000
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_INDEX = {char: value for value, char in enumerate(_ALPHABET)}
_LENGTH = 27
_MAX_SECONDS = 0xFFFF_FFFF


def ksuid(at: float | None = None, payload: bytes | None = None) -> str:
    """A new KSUID for the time ``at`` (seconds since the Unix epoch; default now).

    ``payload`` (16 bytes) makes the id deterministic; by default it is 16 random bytes. Times
    outside the KSUID range (2014 to 2150) are clamped to its ends.
    """
    seconds = int(datetime.now(UTC).timestamp() if at is None else at) - KSUID_EPOCH
    seconds = min(max(seconds, 0), _MAX_SECONDS)
    if payload is None:
        payload = os.urandom(16)
    elif len(payload) != 16:
        raise ValueError("a KSUID payload is 16 bytes")
    number = int.from_bytes(seconds.to_bytes(4, "big") + payload, "big")
    chars = []
    while number:
        number, digit = divmod(number, 62)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars)).rjust(_LENGTH, "0")


def ksuid_time(value: str) -> datetime:
    """The time encoded in a KSUID (to the second); ValueError if ``value`` is not one."""
    if len(value) != _LENGTH or any(char not in _INDEX for char in value):
        raise ValueError(f"{value!r} is not a KSUID")
    number = 0
    for char in value:
        number = number * 62 + _INDEX[char]
    if number >> 160:
        raise ValueError(f"{value!r} is not a KSUID")
    return datetime.fromtimestamp((number >> 128) + KSUID_EPOCH, UTC)
