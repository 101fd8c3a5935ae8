"""The crash tests' harness: job processes started warm, told to go, watched, SIGKILLed.

The child modules (``tests.pipeline_job_child``, ``tests.route_job_child``,
``tests.lake_job_child``) start Spark, print ``warm``, wait for ``go`` on stdin, print
``running``, ``batch ...`` per micro-batch and ``done``. :func:`kill_at_random_points` is the one
kill loop their crash tests run; it records where each kill landed (``tests.batches_in_flight``).
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
from dataclasses import dataclass
from pathlib import Path

from exactly.log import Log, open_log
from tests.batches_in_flight import BATCH_WAIT, Checkpoints, Landings

ROOT = Path(__file__).resolve().parents[1]
# The Java options of every Spark driver a test starts in a process of its own: C1 only and
# the serial collector (a JVM that lives seconds), and Spark's interpreted expressions and
# operators instead of code generated for each query and compiled by Janino (Spark reads
# ``-Dspark.*`` as its settings). Generating code was a sixth of a crash test's CPU: the
# embedded pipeline crash test alone, seed 30, took 517 and 539 CPU seconds with it and 436 and
# 457 without (2026-11-29). The results are the same: Spark takes these paths itself wherever
# code cannot be generated, and no test here measures speed. (One JIT compiler thread, not
# two, was tried and not taken: 0.99x the JVM's CPU a start, `bench/jvm_start.py`, 2026-12-02.)
FAST_JVM = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"
    " -Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN"
)
AT_START = 3  # of a test's kills, how many come while the queries start (no batch of their own)
AFTER_START = 0.5  # the most seconds a kill waits once a micro-batch of its run is in flight
# the children cap micro-batches small so that kills have many to land in; the last run, which
# no kill ends, works off what the kills left in batches this many times as large
CATCH_UP_SCALE = 20


def read_in_several_tasks() -> None:
    """For a crash child: a micro-batch of two records or more read by as many tasks as
    production reads a large one with (``exactly.spark.session.read_options``), so that kills
    land between tasks: the children's micro-batches are small, and one task would read each."""
    from exactly.spark import session

    session.READ_TASK_RECORDS = 1


@dataclass
class Kills:
    """What :func:`kill_at_random_points` did: the runs that killed themselves, and where every
    kill (theirs included) landed."""

    self_kills: int
    landings: Landings


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

    def alive(self) -> bool:
        return self.proc.poll() is None

    def errors(self) -> str:
        """Everything it wrote to stderr so far."""
        self.stderr.seek(0)
        return self.stderr.read()

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
    checkpoints: Checkpoints,
    self_kill: Callable[[random.Random], dict[str, str]] | None = None,
    env: dict[str, str] | None = None,
    may_fail: Callable[[str], bool] | None = None,
) -> Kills:
    """SIGKILL ``kills`` runs of a job at random points while its input grows; the last runs free.

    Runs are ``python -m module *args MODE`` in their own process groups; the next one warms up
    (Spark's start) while the current one works. A run is killed at a random moment: while the
    queries start (0-4 s after ``running``, :data:`AT_START` kills chosen at random) or inside a
    micro-batch (0 to :data:`AFTER_START` s after one of its own is in flight in
    ``checkpoints``). Where each kill landed is read from ``checkpoints`` once the run is dead
    and printed with it. ``grow(log)`` appends to the input every 0.25 s until the last run takes
    its turn; the last run catches up undisturbed and must print ``done``. ``self_kill``, when
    given, is asked for the extra environment of a run (empty: an ordinary run) and such a run
    must end by itself before ``done`` (it kills itself at a point of its own). ``env`` adds to
    every run's environment (a ``PYTHONPATH`` in it comes first, then this tree's ``src`` and the
    tree itself, so a run imports the package of the tree its test came from, whatever is
    installed). ``may_fail``, when given, is asked about a run that ended by itself with an
    error (its stderr): one it accepts is replaced and counts as no kill (the test's own faults,
    as a Redis server restarted empty under a claim, fail a micro-batch; ``exactly up`` restarts
    such a part). Returns how many runs killed themselves, and the landings.
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
    checkpoints.run_starts()
    current.go()
    children = [current]
    killed = self_kills = 0
    at_start = set(rng.sample(range(kills - 1), AT_START))  # (a self-killing run goes its way)
    landings = Landings(module.rsplit(".", 1)[-1])
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
            elif killed in at_start:
                time.sleep(rng.uniform(0.0, 4.0))  # query start, planning, the first tasks
            else:
                in_flight = checkpoints.wait_for_batch(BATCH_WAIT, current.alive)
                assert in_flight or not current.alive(), f"no batch: {current.report()}"
                time.sleep(rng.uniform(0.0, AFTER_START))  # inside a micro-batch of its own
            if not suicidal and current.saw("<exit>") and may_fail and may_fail(current.errors()):
                print(f"run after kill {killed} failed by the test's fault: {current.lines[-2:]}")
                following.kill()  # (warmed for the turn after this one: started again)
                current, suicidal = start(last)
                children.append(current)
                checkpoints.run_starts()
                current.go()
                continue
            if not suicidal:
                assert not current.saw("<exit>"), f"run {killed} died: {current.report()}"
            current.kill()
            killed += 1
            landing = landings.add(checkpoints.landing(by_itself=suicidal))  # all dead
            if last:  # the input stops growing before the final run can take its turn
                growing.clear()
                appender.join()
            print(
                f"kill {killed} at {time.monotonic() - began:.0f} s"
                f"{' (by itself)' if suicidal else ''}: {landing}; {current.lines[-2:]}"
            )
            current, suicidal = following, following_suicidal
            checkpoints.run_starts()
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
    return Kills(self_kills, landings)
