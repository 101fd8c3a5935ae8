"""Running the collector: granian serves the ASGI app in ``workers`` processes.

Each worker builds its own :class:`~exactly.collector.app.CollectorApp` from the settings in its
environment, opens the log and starts its own appender; the sqlite log is safe for several
processes appending at once, and a Kafka log takes any number of producers.
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from exactly.collector.settings import CollectorSettings
from exactly.errors import ConfigError

FACTORY = "exactly.collector.app:from_environment"
BACKLOG = 4096  # connections the kernel queues before granian accepts them (somaxconn caps it)
# Memory a body costs in granian itself (issue 33; docs/collector.md, "Security"). Its HTTP/1 read
# buffer grows to 408 KiB per connection while a body arrives (0.27-0.4 MB for each of 1,000
# stalled 490 KB bodies): capped at 64 KiB, which still holds any request head we take. Its
# jemalloc keeps freed pages until later allocations purge them (no background thread in its
# build), so an idle collector held +285 MB after 1,000 such connections had closed; purged at
# once, it held +8 MB. Set in the environment before granian's module is loaded (the workers
# are forked from this process).
READ_BUFFER_BYTES = 64 * 1024
JEMALLOC_CONF = ("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")


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


def raise_file_limit(wanted: int) -> int:
    """Raise this process's open-file limit (inherited by the workers) towards ``wanted``;
    returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return wanted if soft == resource.RLIM_INFINITY else soft


def check_file_limit(max_connections: int, workers: int) -> int:
    """Raise the open-file limit to what the connection caps need, or fail in one line (issue
    33: with a 4,096 limit, 5,000 idle sockets from one host left no file for anyone else);
    the connections per worker."""
    reserve = 256 * workers  # logs, sockets to appenders, the interpreter's own files
    needed = max_connections * workers + reserve
    limit = raise_file_limit(needed)
    if limit < needed:
        raise ConfigError(
            f"the open-file limit ({limit}) is below the {needed} the collector needs "
            f"({max_connections} connections x {workers} workers + {reserve}): raise it "
            "(ulimit -n, or LimitNOFILE= in a systemd unit) or lower collector.max_connections"
        )
    return max_connections


def serve(
    settings: CollectorSettings,
    host: str,
    port: int,
    workers: int,
    *,
    shutdown_timeout: float = 10.0,
    idle_timeout: float = 5.0,
    max_connections: int = 10_000,
) -> None:
    """Serve until SIGINT or SIGTERM; queued events are appended before the workers exit.

    A stop waits for requests in flight at most ``shutdown_timeout`` seconds, then kills the
    workers: their appender processes still append and acknowledge what they were sent, and a
    client that got no answer retries (the dedupe stage removes what was appended twice).

    Connections (issue 11: 2,000 idle connections used to stop the collector): HTTP/1.1 only, so
    that a connection that sends nothing is under the header timeout from its first moment
    (granian's protocol detection for HTTP/2 waits for bytes without one); a connection without a
    whole request head for ``idle_timeout`` seconds is closed (new, idle keep-alive, or slow
    headers), so idle ones go oldest first; each worker holds at most ``max_connections`` (more
    wait in the listen backlog; the open-file limit is raised to fit); a body's pieces must come
    within the settings' ``read_timeout_seconds`` and the whole within ``body_timeout_seconds``
    (408).
    """
    os.environ.setdefault(*JEMALLOC_CONF)
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.log import LogLevels

    per_worker = check_file_limit(max_connections, workers)
    header_timeout = min(idle_timeout, shutdown_timeout)
    with _environment(settings, workers):
        Granian(
            FACTORY,
            factory=True,
            address=host,
            port=port,
            interface=Interfaces.ASGI,
            http=HTTPModes.http1,
            workers=workers,
            loop=Loops.uvloop,
            websockets=False,
            backlog=BACKLOG,
            backpressure=per_worker,
            log_level=LogLevels.warning,
            log_access=False,
            respawn_failed_workers=True,
            workers_kill_timeout=max(1, round(shutdown_timeout)),
            http1_settings=HTTP1Settings(
                header_read_timeout=max(1, int(header_timeout * 1000)),
                max_buffer_size=READ_BUFFER_BYTES,
            ),
        ).serve()
