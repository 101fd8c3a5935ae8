"""Running the collector: granian serves the ASGI app in ``workers`` processes.

Each worker builds its own :class:`~exactly.collector.app.CollectorApp` from the settings in its
environment, opens the log and starts its own appender; the sqlite log is safe for several
processes appending at once, and a Kafka log takes any number of producers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from exactly.collector.front import SOCKET_NAME, FrontSettings
from exactly.collector.settings import MAX_CONNECTIONS, CollectorSettings
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
FRONT_RESERVE = 64  # files of the front process beside its connections
FRONT_PREFIX = "exactly-front-"  # then the pid of exactly collect
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


def check_file_limit(max_connections: int, workers: int, *, front: bool = False) -> int:
    """Raise the open-file limit to what the connection caps need, or fail in one line (issue
    33: with a 4,096 limit, 5,000 idle sockets from one host left no file for anyone else);
    the connections per worker. Behind the front (its own process, the same limit) each
    connection may hold two files there: the client's socket and the one to granian."""
    reserve = 256 * workers  # logs, sockets to appenders, the interpreter's own files
    needed = max_connections * workers + reserve
    how = f"{max_connections} connections x {workers} workers + {reserve}"
    if front and 2 * max_connections * workers + FRONT_RESERVE > needed:
        needed = 2 * max_connections * workers + FRONT_RESERVE
        how = f"2 files x {max_connections} connections x {workers} workers + {FRONT_RESERVE}"
    limit = raise_file_limit(needed)
    if limit < needed:
        raise ConfigError(
            f"the open-file limit ({limit}) is below the {needed} the collector needs "
            f"({how}): raise it (ulimit -n, or LimitNOFILE= in a systemd unit) or lower "
            "collector.max_connections"
        )
    return max_connections


def _front_directory() -> str:
    """A private directory for granian's socket and the front's socket names (tmpfs if there
    is one: a name is bound and unlinked per connection); short enough for any name in it.
    Named after this process, so that a start removes those of collectors that were killed."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()
    if len(base) > 16:  # a unix socket's name has 107 bytes: 20 digits, "_", an IPv6 address
        base = "/tmp"
    for name in os.listdir(base):
        owner = name.removeprefix(FRONT_PREFIX).partition("-")[0]
        if name.startswith(FRONT_PREFIX) and owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{FRONT_PREFIX}{os.getpid()}-", dir=base)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


@contextmanager
def _front(
    host: str, port: int, max_connections: int, per_address: int, idle_timeout: float
) -> Iterator[str]:
    """The connection front (:mod:`exactly.collector.front`) in its own process, listening on
    ``host:port``; yields its private directory, where granian is to listen. If the front exits
    while the collector runs, the collector is stopped (SIGTERM to this process) and says so."""
    directory = _front_directory()
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    listener = socket.socket(family, kind, proto)
    stopping = threading.Event()
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(BACKLOG)
        settings = FrontSettings(directory, per_address, max_connections, idle_timeout, BACKLOG)
        front = subprocess.Popen(
            [
                sys.executable, "-m", "exactly.collector.front",
                json.dumps(dataclasses.asdict(settings)), str(listener.fileno()),
            ],
            stdin=subprocess.PIPE,
            pass_fds=(listener.fileno(),),
        )  # fmt: skip
    except BaseException:
        listener.close()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    listener.close()

    def watch() -> None:
        code = front.wait()
        if not stopping.is_set():
            print(f"collector: the connection front exited ({code}); stopping", file=sys.stderr)
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="front-watch", daemon=True).start()
    try:
        yield directory
    finally:
        stopping.set()
        assert front.stdin is not None
        front.stdin.close()  # the front's end of file: it stops
        try:
            front.wait(timeout=5)
        except subprocess.TimeoutExpired:
            front.kill()
            front.wait()
        shutil.rmtree(directory, ignore_errors=True)


def serve(
    settings: CollectorSettings,
    host: str,
    port: int,
    workers: int,
    *,
    shutdown_timeout: float = 10.0,
    idle_timeout: float = 5.0,
    max_connections: int = MAX_CONNECTIONS,
    max_connections_per_address: int = 0,
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

    front = max_connections_per_address > 0
    per_worker = check_file_limit(max_connections, workers, front=front)
    header_timeout = min(idle_timeout, shutdown_timeout)
    with ExitStack() as stack:
        where: dict[str, Any] = {"address": host, "port": port}
        if front:
            directory = stack.enter_context(
                _front(
                    host,
                    port,
                    max_connections * workers,
                    max_connections_per_address,
                    idle_timeout,
                )
            )
            settings = settings.model_copy(update={"front_directory": directory})
            where = {"uds": Path(directory) / SOCKET_NAME, "uds_permissions": 0o600}
        stack.enter_context(_environment(settings, workers))
        Granian(
            FACTORY,
            factory=True,
            **where,
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
