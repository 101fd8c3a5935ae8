"""The demo's destinations: a receiver that fails at times, and what each destination got.

1. a local HTTP receiver starts on a free loopback port (:class:`FlakyReceiver`, the standard
   library's threaded server) and answers 503 to a fifth of the requests, chosen at random;
2. ``exactly up``'s route query turns the events into jobs for four demo destinations on that
   receiver (every event; ``Order Completed`` only; the ``ios`` source only; every event again,
   in batches of up to 500, which the route query makes: packs), written into the demo's config
   by :func:`destinations_toml`, and its director sends them, retrying the 503s after a short
   backoff;
3. :func:`received` tells what each destination got: requests, distinct events, duplicates, and
   the events its filters should have taken (:func:`expected`, read back from ``events``).
"""

from __future__ import annotations

import json
import random
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAILURE_RATE = 0.2
FILTERS: dict[str, tuple[tuple[str, ...] | None, tuple[str, ...] | None]] = {
    "all-events": (None, None),  # name: (sources, events)
    "orders": (None, ("Order Completed",)),
    "ios": (("ios",), None),
    "batches": (None, None),
}
BATCHED = {"batches": 500}  # name: max_events (json-array bodies)
# A request the director gives up on is sent again: if the receiver had taken it, a duplicate
# (at-least-once). The receiver answers in a millisecond, but on two cores starved by other work
# (a test suite beside the demo, load average 16) its answers took over 5 s and the demo showed
# duplicates; 30 s keeps them for what the demo is about, kills and 503s.
TIMEOUT = "30s"


@dataclass
class Inbox:
    """What one path of the receiver got: requests, and 2xx answers per event (its webhook-id,
    or each messageId of a batch)."""

    requests: int = 0
    succeeded: Counter[str] = field(default_factory=Counter)


class FlakyReceiver:
    """A loopback HTTP receiver that answers 503 to ``failure_rate`` of the requests."""

    def __init__(self, failure_rate: float = FAILURE_RATE, seed: int = 7) -> None:
        self.failure_rate = failure_rate
        self.inboxes: dict[str, Inbox] = {}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the director's pool expects
            # the head and the body go out as two writes: without TCP_NODELAY the body waits
            # for the client's delayed ACK of the head (40 ms), so each connection managed
            # about 25 requests a second
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ids = [self.headers.get("webhook-id", "")]
                if body[:1] == b"[":  # a batch: each of its events counts
                    ids = [str(event.get("messageId")) for event in json.loads(body)]
                status = receiver.answer(self.path, ids)
                body = b"ok" if status == 200 else b"busy, try again"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                return

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, message_ids: list[str]) -> int:
        """A request carrying ``message_ids`` (one, or a batch's): 503 at random, else 200."""
        with self._lock:
            inbox = self.inboxes.setdefault(path, Inbox())
            inbox.requests += 1
            if self._rng.random() < self.failure_rate:
                return 503
            inbox.succeeded.update(message_ids)
            return 200

    def __enter__(self) -> FlakyReceiver:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietServer(ThreadingHTTPServer):
    """The receiver's server, quiet when a client went away before its answer (the director
    gave up on the request and sends it again): no traceback in the demo's output."""

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def destinations_toml(url: str) -> str:
    """The demo's ``[[destinations]]``, each a path of the receiver at ``url``."""
    entries = []
    for name, (sources, events) in FILTERS.items():
        lines = [
            "[[destinations]]",
            f'name = "{name}"',
            f'url = "{url}/{name}"',
            f'timeout = "{TIMEOUT}"',
            "max_in_flight = 16",
        ]
        if sources is not None:
            lines.append(f"sources = {json.dumps(list(sources))}")
        if events is not None:
            lines.append(f"events = {json.dumps(list(events))}")
        lines += ["[destinations.backoff]", 'min = "50ms"', 'max = "500ms"']
        if name in BATCHED:
            lines += ["[destinations.batch]", f"max_events = {BATCHED[name]}"]
        entries.append("\n".join(lines))
    return "\n\n".join(entries) + "\n"


@dataclass(frozen=True)
class Received:
    """One destination's side: what it got, and the events its filters take."""

    destination: str
    requests: int
    events: int
    duplicates: int
    expected: int


def received(receiver: FlakyReceiver, log_url: str, start: dict[int, int]) -> list[Received]:
    """Per destination, what ``receiver`` got beside what its filters take after ``start``."""
    truth = expected(log_url, start)
    return [
        Received(
            name,
            inbox.requests,
            len(inbox.succeeded),
            sum(n - 1 for n in inbox.succeeded.values()),
            truth[name],
        )
        for name in FILTERS
        for inbox in [receiver.inboxes.get(f"/{name}", Inbox())]
    ]


def expected(log_url: str, start: dict[int, int]) -> dict[str, int]:
    """Per destination, the events after ``start`` its filters take, read back from the log."""
    from exactly.log import open_log

    counts = dict.fromkeys(FILTERS, 0)
    with open_log(log_url) as log:
        for partition, end in log.end_offsets("events").items():
            for records in log.read_range("events", partition, start.get(partition, 0), end):
                for record in records:
                    event = json.loads(record.value)
                    for name, (sources, events) in FILTERS.items():
                        if (sources is None or event.get("sourceId") in sources) and (
                            events is None or event.get("event") in events
                        ):
                            counts[name] += 1
    return counts


def lines(received: list[Received], failure_rate: float = FAILURE_RATE) -> list[str]:
    """What each destination received, in lines of at most 80 columns."""
    out = [f"deliver: a local receiver answering 503 to {failure_rate:.0%} of the requests got"]
    for r in received:
        out.append(
            f"  {r.destination:<10} {r.requests:>9,} requests {r.events:>9,} events "
            f"{r.duplicates:>3,} duplicates"
            + ("" if r.events == r.expected else f"  MISMATCH: {r.expected:,} expected")
        )
    return out


def exact(received: list[Received]) -> bool:
    return all(r.events == r.expected for r in received)
