"""Running the collector: granian serves the ASGI app in ``workers`` processes.

Each worker builds its own :class:`~exactly.collector.app.CollectorApp` from the settings in its
environment, opens the log and starts its own appender; the sqlite log is safe for several
processes appending at once, and a Kafka log takes any number of producers.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from exactly.collector.settings import CollectorSettings
from exactly.errors import ConfigError

FACTORY = "exactly.collector.app:from_environment"


@contextmanager
def _environment(settings: CollectorSettings, workers: int) -> Iterator[None]:
    """Settings (and, with several workers, a shared metrics directory) for the workers."""
    added = settings.to_environment()
    metrics_dir = None
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        metrics_dir = tempfile.mkdtemp(prefix="exactly-metrics-")
        added["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    saved = {name: os.environ.get(name) for name in added}
    os.environ.update(added)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def check_address(host: str, port: int) -> None:
    """Fail in one line, before any worker starts, when ``host:port`` cannot be listened on."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as error:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {error.strerror or error}; check --host and --port"
        ) from None


def serve(
    settings: CollectorSettings,
    host: str,
    port: int,
    workers: int,
    *,
    shutdown_timeout: float = 10.0,
) -> None:
    """Serve until SIGINT or SIGTERM; queued events are appended before the workers exit.

    A stop waits for requests in flight at most ``shutdown_timeout`` seconds, then kills the
    workers: their appender processes still append and acknowledge what they were sent, and a
    client that got no answer retries (the dedupe stage removes what was appended twice). Clients
    that stall are cut sooner: headers within ``shutdown_timeout``, each piece of a body within
    the settings' ``read_timeout_seconds`` (408).
    """
    from granian import Granian
    from granian.constants import Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.log import LogLevels

    with _environment(settings, workers):
        Granian(
            FACTORY,
            factory=True,
            address=host,
            port=port,
            interface=Interfaces.ASGI,
            workers=workers,
            loop=Loops.uvloop,
            websockets=False,
            log_level=LogLevels.warning,
            log_access=False,
            respawn_failed_workers=True,
            workers_kill_timeout=max(1, round(shutdown_timeout)),
            http1_settings=HTTP1Settings(header_read_timeout=int(shutdown_timeout * 1000)),
        ).serve()
