"""The collector's wire frames between a worker and its appender process, for both ends.

* worker -> appender, one frame per request: ``request id (u64), body length (u32)``, then the
  body, records back to back: ``partition (u16), key length (u16), value length (u32), key,
  value``. Request ids increase by one.
* appender -> worker, one ack per group: ``last request id (u64), seconds the append took (f64),
  error length (u32)``, then the error text (empty on success).

All integers big-endian. The worker builds request bodies with :data:`RECORD` directly (it is on
the hot path); everything else goes through the functions here.
"""

from __future__ import annotations

import struct

from exactly.log import Record

REQUEST = struct.Struct("!QI")
RECORD = struct.Struct("!HHI")
ACK = struct.Struct("!QdI")


def encode_record(partition: int, key: bytes, value: bytes) -> bytes:
    """One record of a request body."""
    return RECORD.pack(partition, len(key), len(value)) + key + value


def encode_request(request: int, body: bytes) -> bytes:
    """The frame of one request: its id and its body (records)."""
    return REQUEST.pack(request, len(body)) + body


def parse_requests(buffer: bytearray, merged: dict[int, list[Record]]) -> tuple[int, int]:
    """Move the complete frames at the head of ``buffer`` into ``merged``.

    Returns (bytes consumed, last request id or -1 when no frame was complete).
    """
    at, last, end = 0, -1, len(buffer)
    view = memoryview(buffer)
    try:
        while at + REQUEST.size <= end:
            request, length = REQUEST.unpack_from(buffer, at)
            stop = at + REQUEST.size + length
            if stop > end:
                break
            cursor = at + REQUEST.size
            while cursor < stop:
                partition, key_length, value_length = RECORD.unpack_from(buffer, cursor)
                cursor += RECORD.size
                key = bytes(view[cursor : cursor + key_length])
                cursor += key_length
                value = bytes(view[cursor : cursor + value_length])
                cursor += value_length
                records = merged.get(partition)
                if records is None:
                    merged[partition] = [Record(value, key)]
                else:
                    records.append(Record(value, key))
            at, last = stop, request
    finally:
        view.release()
    return at, last


def encode_ack(last: int, seconds: float, error: bytes) -> bytes:
    """The ack of every request up to ``last``: how long the append took, its error or b""."""
    return ACK.pack(last, seconds, len(error)) + error


def parse_acks(buffer: bytearray) -> list[tuple[int, float, str]]:
    """Take the complete acks at the head of ``buffer``: (last request id, seconds, error)."""
    found = []
    while len(buffer) >= ACK.size:
        last, seconds, length = ACK.unpack_from(buffer)
        if len(buffer) < ACK.size + length:
            break
        error = buffer[ACK.size : ACK.size + length].decode(errors="replace")
        del buffer[: ACK.size + length]
        found.append((last, seconds, error))
    return found
