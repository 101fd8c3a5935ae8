"""The headers every request carries, so a receiver can check it and drop a duplicate.

* ``Idempotency-Key`` and ``webhook-id``: the event's messageId, the same on every retry and after
  every crash, so a receiver that remembers ids keeps one copy.
* ``webhook-timestamp`` and ``webhook-signature`` (Standard Webhooks, standardwebhooks.com):
  ``v1,`` then base64 of HMAC-SHA256 over ``{id}.{timestamp}.{body}`` with the key the
  destination's ``whsec_`` secret encodes. Receivers verify with any Standard Webhooks library.
  With several secrets (a key being rotated) the header holds one signature per key, separated by
  spaces as the spec allows, so a receiver that knows any one of them accepts the request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence


def signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for one request."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.digest(key, signed, hashlib.sha256)  # one call into C
    return "v1," + base64.b64encode(digest).decode()


def request_headers(
    *,
    message_id: str,
    body: bytes,
    timestamp: int,
    keys: Sequence[bytes],
    extra: dict[str, str],
    content_type: str = "application/json",
) -> dict[str, str]:
    """Every header of one request: the configured ones, then the ones exactly owns; signed with
    each of ``keys`` (none: unsigned). ``message_id`` is the key: an event's messageId, or a
    batch's id."""
    headers = dict(extra)
    headers["Content-Type"] = content_type
    headers["Idempotency-Key"] = message_id
    headers["webhook-id"] = message_id
    headers["webhook-timestamp"] = str(timestamp)
    if keys:
        headers["webhook-signature"] = " ".join(
            signature(key, message_id, timestamp, body) for key in keys
        )
    return headers
