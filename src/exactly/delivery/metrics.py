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
HTTP thread never walks the director's queues.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exactly.errors import ConfigError

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
        self._server: Any = None

    def collect(self) -> Iterator[Metric]:
        tallies = dict(self._tallies())
        for name, field, text in _COUNTERS:
            family = CounterMetricFamily(f"exactly_delivery_{name}", text, labels=["destination"])
            for destination, tally in sorted(tallies.items()):
                family.add_metric([destination], getattr(tally, field))
            yield family
        gauges = self.gauges  # replaced whole by the director, never changed in place
        for field, text in (
            ("queued", "jobs waiting to be sent (not in flight, not waiting to retry)"),
            ("in_flight", "jobs recorded executing and not yet answered"),
            ("retrying", "jobs waiting for their retry time"),
            ("oldest_queued_seconds", "age of the oldest job not yet finished"),
        ):
            gauge = GaugeMetricFamily(f"exactly_delivery_{field}", text, labels=["destination"])
            for destination in sorted(tallies):
                gauge.add_metric([destination], getattr(gauges.get(destination, Gauges()), field))
            yield gauge
        yield GaugeMetricFamily(
            "exactly_delivery_jobdb_datasets", "live datasets in the JobDB", value=self.datasets
        )

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``host:port`` from a thread until :meth:`close`."""
        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            why = "the port is in use" if error.errno == errno.EADDRINUSE else str(error)
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {why}") from None

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
