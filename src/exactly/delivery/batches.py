"""A batch's id, where a batch is cut, and its body in each format: pure functions.

* :func:`batch_id`: the key a batch is sent under (``Idempotency-Key``, ``webhook-id``), derived
  from its destination and members, so it names that batch and no other. It is recorded with the
  batch before the first attempt: every retry, and a resend after a crash, carries it.
* :func:`cut`: how many of the ready jobs, in order, go into the next batch: at most
  ``max_events``, and a body of at most ``max_bytes`` (always at least one job, so an event
  larger than ``max_bytes`` goes alone).
* :func:`body`: the request body for the members' payloads, in their order: ``json-array``
  (``[e1,e2]``), ``ndjson`` (one event a line) or ``segment`` (a Segment ``/v1/batch`` body,
  ``{"batch":[e1,e2],"sentAt":"..."}``, which any Segment-compatible collector takes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

FORMATS = ("json-array", "ndjson", "segment")
CONTENT_TYPES = {
    "json-array": "application/json",
    "ndjson": "application/x-ndjson",
    "segment": "application/json",
}
# bytes of a body besides its events: brackets, or the segment envelope with its sentAt
OVERHEAD = {"json-array": 2, "ndjson": 0, "segment": 64}


def batch_id(destination: str, members: Iterable[tuple[int, str]]) -> str:
    """The id of a batch of ``destination`` whose members are these (job id, message id)."""
    digest = hashlib.sha256(destination.encode())
    for job_id, message_id in members:
        digest.update(b"\n%d %s" % (job_id, message_id.encode()))
    return "batch_" + digest.hexdigest()[:32]


def cut(sizes: Iterable[int], *, max_events: int, max_bytes: int, form: str) -> tuple[int, bool]:
    """How many jobs of payload ``sizes`` (in order) the next batch takes, and whether it is
    full (a limit reached: the batch need not wait for more)."""
    total = OVERHEAD[form]
    count = 0
    for size in sizes:
        if count >= max_events:
            return count, True
        if count and total + size + 1 > max_bytes:
            return count, True
        total += size + 1
        count += 1
    return count, count >= max_events or total >= max_bytes


def body(form: str, payloads: Sequence[bytes], sent_at: float) -> bytes:
    """The request body of a batch: its members' payloads, as stored, in ``form``."""
    if form == "json-array":
        return b"[" + b",".join(payloads) + b"]"
    if form == "ndjson":
        return b"".join(_one_line(payload) + b"\n" for payload in payloads)
    if form == "segment":
        stamp = datetime.fromtimestamp(sent_at, UTC).isoformat(timespec="milliseconds")
        sent = json.dumps(stamp.replace("+00:00", "Z")).encode()
        return b'{"batch":[' + b",".join(payloads) + b'],"sentAt":' + sent + b"}"
    raise ValueError(f"unknown batch format {form!r}; use one of {', '.join(FORMATS)}")


def _one_line(payload: bytes) -> bytes:
    """A payload on one line (JSON strings hold no raw line break; whitespace between tokens
    may, and is dropped by re-encoding)."""
    if b"\n" not in payload and b"\r" not in payload:
        return payload
    return json.dumps(json.loads(payload), separators=(",", ":"), ensure_ascii=False).encode()
