"""The appender process: one per collector worker, the only writer of that worker's events.

It runs apart from the worker so that the log's own work (building rows, binding them, SQLite's
page writes) never competes with the event loop for one GIL: measured, an appender *thread* in
the worker capped the collector at about half the throughput (docs/benchmarks.md).

Protocol, over a Unix stream socket inherited from the worker (fd in ``EXACTLY_APPENDER_FD``):

* worker → appender, one frame per request: ``request id (u64), body length (u32)``, then the
  body, records back to back: ``partition (u16), key length (u16), value length (u32), key,
  value``. Request ids increase by one.
* appender → worker, one ack per group: ``last request id (u64), seconds the append took (f64),
  error length (u32)``, then the error text (empty on success). An ack covers every request up to
  and including that id.

The loop (group commit):

1. block for data, then take everything else already readable, without waiting;
2. merge the complete frames' records per partition and make **one** ``append_many`` call;
3. only after it returned (durable) or failed, send the ack, so the worker answers 200 only for
   durable events.

On end of input (the worker closed its side or died) the frames already received are appended and
acknowledged, and the process exits.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import time

from exactly.log import Log, Record, open_log

REQUEST = struct.Struct("!QI")
RECORD = struct.Struct("!HHI")
ACK = struct.Struct("!QdI")
ENVIRONMENT = ("EXACTLY_APPENDER_FD", "EXACTLY_APPENDER_LOG", "EXACTLY_APPENDER_TOPIC")


def encode_record(partition: int, key: bytes, value: bytes) -> bytes:
    """One record of a request body (see the module docstring)."""
    return RECORD.pack(partition, len(key), len(value)) + key + value


def parse(buffer: bytearray, merged: dict[int, list[Record]]) -> tuple[int, int]:
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


def serve(sock: socket.socket, log: Log, topic: str) -> None:
    """Append what arrives on ``sock`` until end of input (module docstring, steps 1-3)."""
    buffer = bytearray()
    closed = False
    while not closed:
        # 1. block for data, then take what else is readable now
        chunk = sock.recv(1 << 20)
        closed = not chunk
        buffer += chunk
        sock.setblocking(False)
        try:
            while not closed:
                chunk = sock.recv(1 << 20)
                closed = not chunk
                buffer += chunk
        except BlockingIOError:
            pass
        finally:
            sock.setblocking(True)
        merged: dict[int, list[Record]] = {}
        consumed, last = parse(buffer, merged)
        del buffer[:consumed]
        if last < 0:
            continue
        # 2. one durable append for every complete request
        started = time.perf_counter()
        error = b""
        try:
            log.append_many(topic, merged)
        except Exception as failed:  # noqa: BLE001 - the worker answers 503 and the client retries
            error = f"{type(failed).__name__}: {failed}".encode(errors="replace")
        # 3. only now acknowledge
        try:
            sock.sendall(ACK.pack(last, time.perf_counter() - started, len(error)) + error)
        except OSError:  # the worker is gone; what was appended stays appended
            return


def main() -> None:
    fd, url, topic = (os.environ[name] for name in ENVIRONMENT)
    max_record_bytes = int(os.environ.get("EXACTLY_APPENDER_MAX_RECORD_BYTES", 1024 * 1024))
    # Ctrl-C and SIGTERM reach the whole process group: the worker decides when to stop, by
    # closing its side, so that what it queued is appended and acknowledged first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=int(fd))
    try:
        with open_log(url, max_record_bytes=max_record_bytes) as log:
            serve(sock, log, topic)
    finally:
        sock.close()


if __name__ == "__main__":
    main()
