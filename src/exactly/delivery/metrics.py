"""The director's Prometheus metrics, served at ``http://127.0.0.1:PORT/metrics`` when asked for.

Per destination (label ``destination``):

* counters of this director's run (they start at 0 with each run, as Prometheus expects):
  ``exactly_delivery_requests_total``, ``..._succeeded_total``, ``..._retried_total``,
  ``..._discarded_total``, ``..._expired_total``;
* ``exactly_delivery_request_seconds``: a histogram of request latency (sent to answered);
* gauges the director refreshes every second from its memory: ``exactly_delivery_queued`` (jobs
  waiting to be sent, paged in or not), ``exactly_delivery_in_flight``,
  ``exactly_delivery_retrying`` (waiting for their retry time) and
  ``exactly_delivery_oldest_queued_seconds`` (age of the oldest job not yet finished);

and ``exactly_delivery_jobdb_datasets``, the JobDB's live datasets. Counters are read from the
director's tallies at scrape time; the gauges are a snapshot the event loop replaces whole, so the
HTTP thread never walks the director's queues. Exposed the shared way (:mod:`exactly.metrics`):
the histogram is live, the rest a ``Collector`` read at scrape time, served by its ``Server``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exactly.metrics import CollectorRegistry, Server, counter, gauge

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_COUNTERS = (
    ("requests", "sent", "requests sent (every attempt)"),
    ("succeeded", "succeeded", "jobs answered 2xx"),
    ("retried", "retried", "attempts that ended awaiting a retry"),
    ("discarded", "discarded", "jobs refused with a status not retried"),
    ("expired", "expired", "jobs given up at their expiry"),
)


class _Tally(Protocol):
    sent: int
    succeeded: int
    retried: int
    discarded: int
    expired: int


@dataclass(frozen=True)
class Gauges:
    """One destination's jobs as the director last saw them."""

    queued: int = 0
    in_flight: int = 0
    retrying: int = 0
    oldest_queued_seconds: float = 0.0


class DeliveryMetrics(Collector):
    """The registry the director's ``/metrics`` serves; see the module docstring."""

    def __init__(self, tallies: Callable[[], Mapping[str, _Tally]]) -> None:
        self.registry = CollectorRegistry()
        self._tallies = tallies
        self.gauges: dict[str, Gauges] = {}
        self.datasets = 0
        self.latency = Histogram(
            "exactly_delivery_request_seconds",
            "time from a request leaving to its answer (or timeout), by destination",
            ["destination"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(self)
        self._server: Server | None = None

    def collect(self) -> Iterator[Metric]:
        tallies = sorted(dict(self._tallies()).items())
        for name, field, text in _COUNTERS:
            samples = [((destination,), getattr(tally, field)) for destination, tally in tallies]
            yield counter(f"exactly_delivery_{name}", text, ["destination"], samples)
        gauges = self.gauges  # replaced whole by the director, never changed in place
        for field, text in (
            ("queued", "jobs waiting to be sent (not in flight, not waiting to retry)"),
            ("in_flight", "jobs recorded executing and not yet answered"),
            ("retrying", "jobs waiting for their retry time"),
            ("oldest_queued_seconds", "age of the oldest job not yet finished"),
        ):
            samples = [
                ((destination,), getattr(gauges.get(destination, Gauges()), field))
                for destination, _ in tallies
            ]
            yield gauge(f"exactly_delivery_{field}", text, ["destination"], samples)
        text = "live datasets in the JobDB"
        yield gauge("exactly_delivery_jobdb_datasets", text, [], [((), self.datasets)])

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``host:port`` from a thread until :meth:`close`."""
        self._server = Server(self.registry, port, host)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
