"""The crash tests' harness: job processes started warm, told to go, watched, SIGKILLed.

The child modules (``tests.pipeline_job_child``, ``tests.route_job_child``) start Spark, print
``warm``, wait for ``go`` on stdin, print ``running``, ``batch ...`` per micro-batch and ``done``.
:func:`kill_at_random_points` is the one kill loop their crash tests run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from exactly.log import Log, open_log

ROOT = Path(__file__).resolve().parents[1]
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"


class Child:
    """A job process in its own process group, its lines collected by a thread.

    Its stderr goes to an unlinked temporary file, so that a run that dies unexpectedly can say
    why (:meth:`report`).
    """

    def __init__(
        self, module: str, args: list[str], env: dict[str, str], mode: str = "streaming"
    ) -> None:
        self.stderr = tempfile.TemporaryFile(mode="w+", prefix="job-child-")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, mode],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
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
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.proc.wait()
            raise AssertionError(f"the run died while warming up: {self.report()}") from None

    def saw(self, word: str) -> bool:
        return any(line.split(" ")[0] == word for line in self.lines)

    def wait_for(self, word: str, timeout: float = 180) -> bool:
        """Wait for a line starting with ``word``; False if the process exits first."""
        with self.changed:
            self.changed.wait_for(lambda: self.saw(word) or self.saw("<exit>"), timeout)
            return self.saw(word)

    def report(self, lines: int = 25) -> str:
        """Its stdout lines and the last ``lines`` lines of its stderr, for an assertion."""
        self.stderr.seek(0)
        tail = "".join(self.stderr.readlines()[-lines:])
        return f"{self.lines}\n--- stderr (last {lines} lines) ---\n{tail}"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def kill_at_random_points(
    module: str,
    args: list[str],
    *,
    log_url: str,
    grow: Callable[[Log], object],
    rng: random.Random,
    kills: int,
    self_kill: Callable[[random.Random], dict[str, str]] | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """SIGKILL ``kills`` runs of a job at random points while its input grows; the last runs free.

    Runs are ``python -m module *args MODE`` in their own process groups; the next one warms up
    (Spark's start) while the current one works. A run is killed at a random moment: while the
    query starts (0-4 s after ``running``) or inside a later micro-batch (0-2 s after a
    ``batch`` line). ``grow(log)`` appends to the input every 0.25 s until the last run takes
    its turn; the last run catches up undisturbed and must print ``done``. ``self_kill``, when
    given, is asked for the extra environment of a run (empty: an ordinary run) and such a run
    must end by itself before ``done`` (it kills itself at a point of its own). ``env`` adds to
    every run's environment (a ``PYTHONPATH`` in it comes first, then this tree's ``src`` and the
    tree itself, so a run imports the package of the tree its test came from, whatever is
    installed). Returns how many runs killed themselves.
    """
    extra = dict(env or {})
    path = os.pathsep.join(
        filter(None, [extra.pop("PYTHONPATH", ""), str(ROOT / "src"), str(ROOT)])
    )
    env = {**os.environ, "JDK_JAVA_OPTIONS": FAST_JVM, **extra, "PYTHONPATH": path}
    growing = threading.Event()
    growing.set()

    def appending() -> None:
        with open_log(log_url) as writer:
            while growing.is_set():
                grow(writer)
                time.sleep(0.25)

    def start(last: bool) -> tuple[Child, bool]:
        extra = self_kill(rng) if self_kill is not None and not last else {}
        return Child(module, args, {**env, **extra}, "catch-up" if last else "streaming"), bool(
            extra
        )

    appender = threading.Thread(target=appending, daemon=True)
    appender.start()
    current, suicidal = start(False)
    current.go()
    children = [current]
    killed = self_kills = 0
    began = time.monotonic()
    try:
        while killed < kills:
            last = killed == kills - 1
            following, following_suicidal = start(last)
            children.append(following)
            assert current.wait_for("running"), f"run {killed} did not start: {current.report()}"
            if suicidal:
                assert current.wait_for("<exit>", timeout=240), current.report()
                assert not current.saw("done"), current.report()
                self_kills += 1
            elif rng.random() < 0.4:
                time.sleep(rng.uniform(0.0, 4.0))  # query start, planning, the first tasks
            else:
                assert current.wait_for("batch", timeout=120), f"no batch: {current.report()}"
                time.sleep(rng.uniform(0.0, 2.0))  # inside later micro-batches
            if not suicidal:
                assert not current.saw("<exit>"), f"run {killed} died: {current.report()}"
            if last:  # the input stops growing before the final run can take its turn
                growing.clear()
                appender.join()
            current.kill()
            killed += 1
            print(f"kill {killed} at {time.monotonic() - began:.0f} s: {current.lines[-2:]}")
            current, suicidal = following, following_suicidal
            current.go()
        growing.clear()
        appender.join()
        # the last run catches up on every batch the kills left behind: minutes on a loaded machine
        assert current.wait_for("done", timeout=600), f"the last run failed: {current.report()}"
    finally:
        growing.clear()
        for child in children:
            child.kill()
            child.stderr.close()
    return self_kills
