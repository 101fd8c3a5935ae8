"""A real collector for tests: ``exactly collect`` as a subprocess on a free port, always stopped.

A :class:`~tests.servers.ServerProcess`. The collector runs in its own session (process group) so
that stopping it, gracefully or with SIGKILL, reaches its granian worker and appender processes
too; the ``atexit`` hook kills the group if a test run dies before the ``with`` block ends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from exactly.log import LogRecord, open_log
from tests.servers import ServerProcess

KEYS = {"web": "web-key-0123", "app": "app-key-4567"}


def basic(key: str) -> tuple[str, str]:
    """httpx auth for a write key: the Basic username, an empty password (as the SDKs send)."""
    return (key, "")


class Collector(ServerProcess):
    """``exactly collect`` with a sqlite log under ``data_dir``; ``url`` once started."""

    name = "the collector"
    startup_timeout = 60.0

    def __init__(
        self,
        data_dir: Path,
        *,
        sources: dict[str, str] | None = None,
        workers: int = 1,
        args: tuple[str, ...] = (),
        log_url: str | None = None,
        topic: str = "raw",
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.sources = KEYS if sources is None else sources
        self.workers = workers
        self.args = args
        self.topic = topic
        self.env = env or {}
        self._log_url = log_url
        self.output = data_dir / "collector.out"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_url(self) -> str:
        return self._log_url or f"sqlite://{self.data_dir / 'log'}"

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "exactly", "--data-dir", str(self.data_dir), "collect",
            "--port", str(self.port), "--workers", str(self.workers), "--topic", self.topic,
            "--log", self.log_url, *self.args,
        ]  # fmt: skip
        # write keys through the environment, as a user should: argv is visible in ps
        env = {**os.environ, **self.env}
        if self.sources:
            env["EXACTLY_COLLECTOR__SOURCES"] = ",".join(
                f"{n}={k}" for n, k in self.sources.items()
            )
        with self.output.open("ab") as output:
            return subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                start_new_session=True, env=env,
            )  # fmt: skip

    def _ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
        return False

    def _output(self) -> str:
        return self.tail()

    def tail(self) -> str:
        try:
            return self.output.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    @staticmethod
    def _kill_group(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the collector and every process it started; wait for them to be gone."""
        self._kill_group(process.pid)
        process.wait(timeout=30)
        self._wait_group_gone(process.pid)

    def kill(self) -> None:
        """SIGKILL the collector and every process it started; wait for them to be gone."""
        if self.process is not None:
            self._kill(self.process)

    def stop(self, *, timeout: float = 30.0) -> int | None:
        """SIGTERM (graceful: queued events are appended), SIGKILL after ``timeout``."""
        if self.process is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        self._wait_group_gone(self.process.pid, kill_after=timeout)
        atexit.unregister(self._kill)
        return code

    def _wait_group_gone(self, pgid: int, kill_after: float = 10.0) -> None:
        """Wait until no process of the group is left (SIGKILL after ``kill_after``)."""
        deadline = time.monotonic() + kill_after
        while time.monotonic() < deadline + 10:  # then only zombies nobody reaps could be left
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            if time.monotonic() > deadline:
                self._kill_group(pgid)
            time.sleep(0.05)

    def rss_mb(self) -> float:
        """Resident memory of every process of the collector (workers, appenders), in MB."""
        assert self.process is not None
        total = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if os.getpgid(int(pid)) != self.process.pid:
                    continue
                with open(f"/proc/{pid}/statm") as statm:
                    total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return total / 2**20

    def records(self) -> list[LogRecord]:
        """Every record of the collector's topic, partition by partition."""
        return read_all(self.log_url, self.topic)


def read_all(log_url: str, topic: str = "raw") -> list[LogRecord]:
    found: list[LogRecord] = []
    with open_log(log_url) as log:
        for partition in range(log.topic_info(topic).partitions):
            offset = 0
            while batch := log.read(topic, partition, offset, max_records=10_000):
                found += batch
                offset = batch[-1].offset + 1
    return found
