"""``exactly up``'s supervisor: its parts as child processes, restarted when they die.

Each part (the collector, the Spark pipeline, the director) is an ``exactly`` command run as a
child in a process group of its own, so that stopping a part stops everything it started (the
collector's workers, the pipeline's JVM). Parts die with the supervisor (``PR_SET_PDEATHSIG``):
a SIGKILLed ``exactly up`` leaves nothing running, and its restart finds ports and locks free.

* **A part that dies** is restarted after :func:`exactly.backoff.backoff` (1 s, doubling, at most
  30 s); a part that ran ``healthy_after`` seconds starts counting again. One that dies
  ``patience`` times in a row, each time sooner than that, stops ``up`` with one line naming it
  and its last words (:class:`PartKeepsDying`).
* **A graceful stop** (SIGTERM or Ctrl-C) stops the collector first (it answers 503 and finishes
  its durable appends), then the pipeline (each query after its current micro-batch) and the
  director (its requests in flight) together; whatever still runs ``grace`` seconds after the
  signal is killed. Nothing acknowledged is lost either way: that is each part's own guarantee.

Each part's output goes to ``LOG_DIR/<part>.log``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from exactly.backoff import ceiling
from exactly.errors import CONFIG_REFUSED, ConfigError, PartKeepsDying


@dataclass(frozen=True)
class Part:
    """A part of the pipeline: its name, command line, and when it stops in a graceful stop."""

    name: str
    argv: Sequence[str]
    stops_first: bool = False  # the collector: no new events while the rest finishes


@dataclass
class Running:
    """A part's current process and its history."""

    part: Part
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    starts: int = 0
    quick_deaths: int = 0  # deaths in a row, each sooner than healthy_after
    restart_at: float = 0.0
    last_exit: int | None = None
    last_words: str = ""
    log_start: int = 0  # where this run's output begins in the part's log
    output: IO[bytes] | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


class Supervisor:
    """Runs ``parts`` until :meth:`stop` or a part that keeps dying; see the module docstring."""

    def __init__(
        self,
        parts: Sequence[Part],
        log_dir: Path,
        *,
        env: dict[str, str] | None = None,
        say: Callable[[str], None] = print,
        patience: int = 5,
        healthy_after: float = 60.0,
        grace: float = 30.0,
    ) -> None:
        self.parts = [Running(part) for part in parts]
        self.log_dir = log_dir
        self.env = env
        self.say = say
        self.patience = patience
        self.healthy_after = healthy_after
        self.grace = grace
        self.stopping_since: float | None = None

    def stop(self) -> None:
        """Ask for a graceful stop (safe from a signal handler: it only records the moment)."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()

    def run(self, on_tick: Callable[[], None] | None = None, tick: float = 0.2) -> None:
        """Start every part and keep them running until :meth:`stop`; then stop them all.

        Raises :class:`PartKeepsDying` (after stopping the other parts) when one keeps dying.
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        held = os.open(self.log_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(held)
            raise ConfigError(
                f"another exactly up runs on this data dir (it holds {self.log_dir / LOCK}); "
                "stop it first"
            ) from None
        try:
            for running in self.parts:
                self._start(running)
            while self.stopping_since is None:
                self._watch()
                if on_tick is not None:
                    on_tick()
                time.sleep(tick)
            self._stop_all()
        except BaseException:
            self.stop()
            self._stop_all()
            raise
        finally:
            for running in self.parts:
                if running.output is not None:
                    running.output.close()
            os.close(held)  # the kernel releases it too if this process is killed

    # -- one round of watching ------------------------------------------------------------------

    def _watch(self) -> None:
        now = time.monotonic()
        for running in self.parts:
            process = running.process
            if process is not None and process.poll() is not None:
                self._died(running, process.returncode, now)
            if running.process is None and now >= running.restart_at:
                self._start(running)

    def _died(self, running: Running, code: int, now: float) -> None:
        _kill_group(running)  # whatever it started goes with it
        lasted = now - running.started
        running.process = None
        running.last_exit = code
        running.last_words = last_words(
            self.log_dir / f"{running.part.name}.log", running.log_start, killed=code < 0
        )
        running.quick_deaths = running.quick_deaths + 1 if lasted < self.healthy_after else 1
        how = f"exit status {code}" if code >= 0 else f"signal {-code}"
        words = f": {running.last_words}" if running.last_words else ""
        if code == CONFIG_REFUSED:  # the same configuration would be refused again
            raise PartKeepsDying(
                f"the {running.part.name} part refused the configuration{words}; see "
                f"{self.log_dir / running.part.name}.log"
            )
        if running.quick_deaths >= self.patience:
            raise PartKeepsDying(
                f"the {running.part.name} part died {running.quick_deaths} times in a row, each "
                f"within {self.healthy_after:.0f} s of starting ({how}{words}); see "
                f"{self.log_dir / running.part.name}.log"
            )
        wait = ceiling(running.quick_deaths, minimum=0.5, maximum=30.0)  # 1 s, 2 s, 4 s ...
        running.restart_at = now + wait
        self.say(f"{running.part.name} died ({how}{words}); restarting in {wait:.0f} s")

    def _start(self, running: Running) -> None:
        if running.output is None:
            running.output = (self.log_dir / f"{running.part.name}.log").open("ab")
        running.log_start = running.output.seek(0, os.SEEK_END)
        parent = os.getpid()
        running.process = subprocess.Popen(
            list(running.part.argv),
            stdin=subprocess.DEVNULL,
            stdout=running.output,
            stderr=subprocess.STDOUT,
            env=self.env,
            process_group=0,
            preexec_fn=lambda: _die_with(parent),
        )
        running.started = time.monotonic()
        running.starts += 1

    # -- the graceful stop ----------------------------------------------------------------------

    def _stop_all(self) -> None:
        began = self.stopping_since or time.monotonic()
        deadline = began + self.grace - 1.0  # a second to kill and reap what is left
        first = [r for r in self.parts if r.part.stops_first]
        rest = [r for r in self.parts if not r.part.stops_first]
        for group in (first, rest):
            for running in group:
                _signal_group(running, signal.SIGTERM)
            for running in group:
                _wait(running, deadline)
        for running in self.parts:
            if running.alive:
                self.say(f"{running.part.name} did not stop within {self.grace:.0f} s: killed")
            _kill_group(running)


def _die_with(parent: int) -> None:
    from exactly.lifetime import die_with_parent

    die_with_parent(parent)


def _signal_group(running: Running, signum: int) -> None:
    if running.process is not None and running.process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(running.process.pid, signum)


def _wait(running: Running, deadline: float) -> None:
    if running.process is None:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        running.process.wait(max(0.0, deadline - time.monotonic()))


def _kill_group(running: Running) -> None:
    """SIGKILL the part's process group (its leader may be gone, its children not) and reap."""
    if running.process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(running.process.pid, signal.SIGKILL)
    running.process.wait()


def last_words(path: Path, since: int = 0, *, killed: bool = False, limit: int = 65536) -> str:
    """What a part said before it died: its last ``error:`` line since ``since`` (its start in
    the log), else its last line unless a signal ``killed`` it (then it said nothing relevant).
    """
    try:
        with path.open("rb") as log:
            end = log.seek(0, os.SEEK_END)
            log.seek(max(since, end - limit))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1][:200]
    return "" if killed or not lines else lines[-1][:200]


LOCK = "up.lock"  # held by a running ``exactly up`` for its whole life, in its log folder


def running(log_dir: Path) -> bool:
    """Whether an ``exactly up`` runs over this log folder (``DATA_DIR/up``): its lock is held.
    ``exactly forget`` then leaves the lake and the JobDB to its parts."""
    try:
        descriptor = os.open(log_dir / LOCK, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False
