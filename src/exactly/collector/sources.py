"""Who may send events: write keys, checked in constant time and never logged.

A write key arrives as the HTTP Basic username (``Authorization: Basic base64(KEY:)``, as
Segment's and RudderStack's SDKs send it) or as ``writeKey`` in the JSON body. Keys are looked up
by their SHA-256 digest, then compared with :func:`hmac.compare_digest`, so neither the lookup
nor the comparison takes a time that depends on how much of a guess was right.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
from base64 import b64decode
from collections.abc import Iterable

from exactly.collector.settings import Source


class Unauthorized(Exception):
    """The request carries no write key, or one no source has; the message says which."""


class Sources:
    """The configured sources, by write key."""

    def __init__(self, sources: Iterable[Source]) -> None:
        self._by_digest: dict[bytes, tuple[bytes, str]] = {}
        for source in sources:
            key = source.write_key.get_secret_value().encode()
            self._by_digest[hashlib.sha256(key).digest()] = (key, source.name)

    def __len__(self) -> int:
        return len(self._by_digest)

    def source_of(self, write_key: bytes) -> str:
        """The name of the source whose write key is ``write_key``; else :class:`Unauthorized`."""
        found = self._by_digest.get(hashlib.sha256(write_key).digest())
        if found is None or not hmac.compare_digest(found[0], write_key):
            raise Unauthorized("the write key is not known to this collector")
        return found[1]


def basic_username(authorization: bytes) -> bytes:
    """The username of an ``Authorization: Basic`` header value (the write key)."""
    scheme, _, encoded = authorization.strip().partition(b" ")
    if scheme.lower() != b"basic":
        raise Unauthorized("the Authorization header must use the Basic scheme")
    try:
        decoded = b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise Unauthorized("the Authorization header is not valid base64") from None
    username = decoded.partition(b":")[0]
    if not username:
        raise Unauthorized("the Authorization header names no write key")
    return username
