"""A standalone Spark cluster for tests: a master and workers from the pip-installed PySpark.

:class:`SparkCluster` starts ``spark-class ...Master`` and ``...Worker`` processes on free ports of
127.0.0.1, each worker with 1 core, 1 GB and a work dir of its own, each in a process group of its
own so that :meth:`SparkCluster.kill_worker` can SIGKILL a worker with its executor and Python
workers, as a lost host would. Everything is stopped on exit (and by ``atexit`` if the run dies).

:func:`plain_python` makes an interpreter that has PySpark's dependencies (pyarrow, pandas, ...)
but not ``exactly``: a virtualenv whose one ``.pth`` line adds the project venv's site-packages
as a plain directory (its own ``.pth`` files, among them the editable install of ``exactly``,
are not processed), so executors running it must get ``exactly`` from the driver.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import site
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.servers import free_port


def plain_python(directory: Path) -> Path:
    """A Python with PySpark's dependencies and without ``exactly`` (checked)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=120
    )
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = directory / "lib" / version / "site-packages"
    (packages / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = directory / "bin" / "python"
    probe = subprocess.run(
        [str(python), "-c", "import pyarrow, pyspark\nimport exactly"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=60,
    )
    assert "No module named 'exactly'" in probe.stderr, probe.stderr
    return python


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _environment(extra: dict[str, str]) -> dict[str, str]:
    from exactly.spark.java import use_java

    use_java()  # JAVA_HOME for Spark's launcher
    import pyspark

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        SPARK_HOME=str(Path(pyspark.__file__).parent),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_NO_DAEMONIZE="1",
        **extra,
    )
    return env


class SparkCluster:
    """A master and ``workers`` workers (1 core, 1 GB each) under ``directory``."""

    def __init__(
        self, directory: Path, workers: int = 2, *, worker_env: dict[str, str] | None = None
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.webui_port = free_port()
        self.worker_env = worker_env or {}
        self.worker_count = workers
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes] | None] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def work_dir(self, index: int) -> Path:
        return self.directory / f"worker-{index}"

    def start(self, timeout: float = 120.0) -> Self:
        atexit.register(self.stop)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.master = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.webui_port),
            ],
            {},
        )
        for index in range(self.worker_count):
            self.workers.append(None)
            self.start_worker(index)
        self.wait_for_workers(self.worker_count, timeout)
        return self

    def start_worker(self, index: int) -> None:
        """(Re)start worker ``index`` with its work dir."""
        work = self.work_dir(index)
        work.mkdir(parents=True, exist_ok=True)
        self.workers[index] = self._spawn(
            f"worker-{index}",
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--webui-port",
                str(free_port()),
                "--cores",
                "1",
                "--memory",
                "1g",
                "--work-dir",
                str(work),
                self.url,
            ],
            {"SPARK_WORKER_DIR": str(work), **self.worker_env},
        )

    def _spawn(self, name: str, args: list[str], extra: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.directory / f"{name}.log").open("ab")
        with log:
            return subprocess.Popen(
                [str(_spark_class()), *args],
                env=_environment(extra),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def state(self) -> dict[str, object]:
        """The master's JSON status."""
        url = f"http://127.0.0.1:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            found: dict[str, object] = json.load(response)
            return found

    def alive_workers(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            workers = self.state().get("workers", [])
            assert isinstance(workers, list)
            return sum(1 for worker in workers if worker.get("state") == "ALIVE")
        return 0

    def wait_for_workers(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.alive_workers() < count:
            if time.monotonic() > deadline:
                logs = "".join(
                    path.read_text(errors="replace")[-2000:]
                    for path in sorted(self.directory.glob("*.log"))
                )
                raise AssertionError(f"{count} Spark workers not alive in {timeout} s\n{logs}")
            time.sleep(0.5)

    def tasks_run(self, index: int) -> int:
        """Tasks that the executors of worker ``index`` finished (from their logs)."""
        return sum(
            path.read_text(errors="replace").count("Finished task")
            for path in self.work_dir(index).glob("app-*/*/stderr")
        )

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` with its executors and their Python workers."""
        process = self.workers[index]
        if process is not None:
            _kill_group(process)
            self.workers[index] = None

    def stop(self) -> None:
        for index in range(len(self.workers)):
            self.kill_worker(index)
        if self.master is not None:
            _kill_group(self.master)
            self.master = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
    from tests.up_service import wait_until_gone

    wait_until_gone(process.pid)
