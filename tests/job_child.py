"""A crash test's job process: started warm, told to go, watched line by line, SIGKILLed.

The child modules (``tests.dedupe_job_child``, ``tests.aggregate_job_child``) start Spark, print
``warm``, wait for ``go`` on stdin, print ``running``, ``batch N`` per micro-batch and ``done``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"


class Child:
    """A job process in its own process group, its lines collected by a thread."""

    def __init__(
        self, module: str, args: list[str], env: dict[str, str], mode: str = "streaming"
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, mode],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.strip())
                self.changed.notify_all()
        with self.changed:
            self.lines.append("<exit>")
            self.changed.notify_all()

    def go(self) -> None:
        """Let it run: the previous run is dead."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def saw(self, word: str) -> bool:
        return any(line.split(" ")[0] == word for line in self.lines)

    def wait_for(self, word: str, timeout: float = 180) -> bool:
        """Wait for a line starting with ``word``; False if the process exits first."""
        with self.changed:
            self.changed.wait_for(lambda: self.saw(word) or self.saw("<exit>"), timeout)
            return self.saw(word)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
