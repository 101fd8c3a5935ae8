"""The appender process: one per collector worker, the only writer of that worker's events.

It runs apart from the worker so that the log's own work (building rows, binding them, SQLite's
page writes) never competes with the event loop for one GIL: measured, an appender *thread* in
the worker capped the collector at about half the throughput (docs/benchmarks.md).

Protocol: frames over a Unix stream socket inherited from the worker (fd in
``EXACTLY_APPENDER_FD``), one per request one way and one ack per group the other; their layout
is :mod:`exactly.collector.wire`, which both ends use. An ack covers every request up to and
including its id.

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
import time

from exactly.collector.wire import encode_ack, parse_requests
from exactly.log import Log, Record, open_log

ENVIRONMENT = ("EXACTLY_APPENDER_FD", "EXACTLY_APPENDER_LOG", "EXACTLY_APPENDER_TOPIC")


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
        consumed, last = parse_requests(buffer, merged)
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
            sock.sendall(encode_ack(last, time.perf_counter() - started, error))
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
