"""One way to expose metrics: a ``prometheus_client`` registry per component, in Prometheus text.

Each component with figures builds one :class:`CollectorRegistry` and fills it in one of two ways:

* figures that change where they happen are ``prometheus_client`` counters, gauges and histograms,
  updated in place (the collector's requests, the director's request latency); a child per label
  value is cached by its owner, so a request costs a dict lookup and an increment;
* figures kept elsewhere (the director's tallies, the dedupe job's status) are read when the
  registry is exposed, by a ``Collector`` yielding metric families (:func:`counter`,
  :func:`gauge`), so nothing copies them on every change.

The registry is then exposed by whatever suits the process, always as :func:`exposition` renders
it: a server answers ``GET /metrics`` with it (the collector from its own HTTP server, summing its
workers' files; the director from :func:`serve`'s thread), and a job without a server writes it
to a file for a node-exporter textfile collector (:func:`write_textfile`).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from exactly.errors import ConfigError

__all__ = [
    "CONTENT_TYPE",
    "CollectorRegistry",
    "Server",
    "counter",
    "exposition",
    "gauge",
    "multiprocess",
    "write_textfile",
]

disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

Samples = Iterable[tuple[Sequence[str], float | None]]


def multiprocess() -> bool:
    """Whether figures are kept in ``PROMETHEUS_MULTIPROC_DIR`` (the collector's ``--workers``)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def exposition(registry: Collector, every_process: bool = False) -> bytes:
    """The registry in Prometheus text format (0.0.4); with ``every_process`` (under
    :func:`multiprocess`), the sum of every process's figures instead, as they wrote them to files.

    It is ``prometheus_client.generate_latest`` except that labels keep the order their metric
    declares (``source``, ``store``, ``partition``) instead of being sorted: a line reads the same
    whichever way it was exposed, and as it read before the three ways became one.
    """
    if every_process:
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    out: list[str] = []
    for family in registry.collect():
        name, kind = family.name, _KINDS.get(family.type, family.type)
        if family.type == "counter":
            name += "_total"
        text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
        for sample in family.samples:
            labels = ",".join(f'{key}="{_escape(value)}"' for key, value in sample.labels.items())
            where = f"{{{labels}}}" if labels else ""
            value = floatToGoString(sample.value)  # type: ignore[no-untyped-call]
            out.append(f"{sample.name}{where} {value}\n")
    return "".join(out).encode()


_KINDS = {"unknown": "untyped"}  # exactly's metrics are counters, gauges and histograms


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def counter(name: str, text: str, labels: Sequence[str], samples: Samples) -> CounterMetricFamily:
    """A counter family read at exposition; a sample of value ``None`` (not known) is left out."""
    family = CounterMetricFamily(name, text, labels=list(labels))
    for values, value in samples:
        if value is not None:
            family.add_metric(list(values), value)
    return family


def gauge(name: str, text: str, labels: Sequence[str], samples: Samples) -> GaugeMetricFamily:
    """A gauge family read at exposition; a sample of value ``None`` (not known) is left out."""
    family = GaugeMetricFamily(name, text, labels=list(labels))
    for values, value in samples:
        if value is not None:
            family.add_metric(list(values), value)
    return family


class Server:
    """``GET /metrics`` of one registry (:func:`exposition`), served from a thread until
    :meth:`close`; for a process with no HTTP server of its own (the director)."""

    def __init__(self, registry: Collector, port: int, host: str = "127.0.0.1") -> None:
        class Answer(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exposition(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE.decode())
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Scrapes are not logged."""

        try:
            self._server: ThreadingHTTPServer | None = ThreadingHTTPServer((host, port), Answer)
        except OSError as error:
            why = "the port is in use" if error.errno == errno.EADDRINUSE else str(error)
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {why}") from None
        self._server.daemon_threads = True
        thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        thread.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def write_textfile(path: Path, registry: CollectorRegistry) -> None:
    """Write the registry's exposition to ``path``, replaced atomically (a reader never sees half);
    the staged file's name does not end in ``.prom``, so a textfile collector skips it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_bytes(exposition(registry))
    staged.replace(path)
