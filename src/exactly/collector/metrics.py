"""The collector's Prometheus metrics, served at ``GET /metrics`` (the shared way,
:mod:`exactly.metrics`).

With one worker the figures live in the process. With ``--workers N`` the CLI sets
``PROMETHEUS_MULTIPROC_DIR`` before the workers start, each worker writes its figures to files
there, and whichever worker answers ``/metrics`` sums them all.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from exactly.metrics import CollectorRegistry, exposition, multiprocess

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """Requests, events accepted and rejected (by reason), append latency and queue depth."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "exactly_collector_requests",
            "HTTP requests answered, by path and status",
            ["path", "status"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "exactly_collector_request_seconds",
            "time from a request's arrival to its answer",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.accepted = Counter(
            "exactly_collector_events_accepted",
            "events durably appended to the log, by source",
            ["source"],
            registry=registry,
        )
        self.rejected = Counter(
            "exactly_collector_events_rejected",
            "events refused, by reason",
            ["reason"],
            registry=registry,
        )
        self.suppressed = Counter(
            "exactly_collector_events_suppressed",
            "events of forgotten people (exactly forget) answered 200 and not stored, by source",
            ["source"],
            registry=registry,
        )
        self.append_seconds = Histogram(
            "exactly_collector_append_seconds",
            "duration of one durable group append to the log",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_bytes = Gauge(
            "exactly_collector_queue_bytes",
            "bytes of events waiting for the log",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.queue_requests = Gauge(
            "exactly_collector_queue_requests",
            "requests waiting for the log",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self._requests: dict[tuple[str, int], Counter] = {}
        self._accepted: dict[str, Counter] = {}
        self._rejected: dict[str, Counter] = {}

    def request(self, path: str, status: int, seconds: float) -> None:
        child = self._requests.get((path, status))
        if child is None:
            child = self._requests[path, status] = self.requests.labels(path, str(status))
        child.inc()
        self.request_seconds.observe(seconds)

    def accept(self, source: str, count: int) -> None:
        child = self._accepted.get(source)
        if child is None:
            child = self._accepted[source] = self.accepted.labels(source)
        child.inc(count)

    def suppress(self, source: str, count: int) -> None:
        self.suppressed.labels(source).inc(count)

    def reject(self, reason: str, count: int = 1) -> None:
        child = self._rejected.get(reason)
        if child is None:
            child = self._rejected[reason] = self.rejected.labels(reason)
        child.inc(count)

    def render(self) -> bytes:
        """The Prometheus text exposition of every worker's figures."""
        return exposition(self.registry, every_process=multiprocess())
