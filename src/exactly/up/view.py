"""``exactly up``'s terminal view: each part's state, each stage's rate and lag.

On a terminal it is a live table (rich) redrawn every second; otherwise (a log file, a test) one
line per stage every ``every`` seconds, each starting with the time (UTC). Both fit 80 columns.
Rates are averaged over :data:`~exactly.up.watch.RATE_WINDOW` seconds; a query whose first
micro-batch has not run yet shows ``starting (N s)`` instead of a rate, and what it waits on
(:func:`~exactly.up.watch.waiting_on`: Spark to start, a target to open, a batch run again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.table import Column, Table
from rich.text import Text

from exactly.config import Settings
from exactly.dedupe.status import saved_window, show_window
from exactly.log import Log
from exactly.stages import DEDUPE
from exactly.up import watch
from exactly.up.supervisor import Supervisor


class View:
    """Takes a snapshot each ``every`` seconds and shows it; :meth:`tick` is called often."""

    def __init__(
        self,
        settings: Settings,
        log: Log,
        supervisor: Supervisor,
        *,
        live: bool,
        every: float = 1.0,
        say: Callable[[str], None] = print,
    ) -> None:
        self.settings = settings
        self.log = log
        self.supervisor = supervisor
        self.stages = watch.stages(settings)
        self.every = every
        self.say = say
        self.history = watch.History()
        self.jobdb = watch.JobDBReader(settings)
        self.plan = DEDUPE.plan(settings)
        self.window = self.plan.window
        self.due = 0.0
        self.live = Live(console=Console(), auto_refresh=False, transient=False) if live else None

    def __enter__(self) -> View:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.live is not None:
            self.live.stop()
        self.jobdb.close()

    def tick(self) -> None:
        now = time.monotonic()
        if now < self.due:
            return
        self.due = now + self.every
        try:
            taken = watch.take(self.settings, self.log, self.stages, self.jobdb)
            self.window = saved_window(self.settings.data_dir, self.plan)[0]
        except Exception as error:  # noqa: BLE001 - the view never stops the service it shows
            self.say(f"warning: no status this time: {type(error).__name__}: {error}")
            return
        self.history.add(taken)
        if self.live is not None:
            self.live.update(self.render(), refresh=True)
        else:
            for line in self.lines():
                self.say(line)

    def starting(self, query: str) -> float | None:
        """Seconds ``query`` has been starting (:func:`watch.starting`); None once it ran."""
        now = self.history.newest
        if now is None:
            return None
        pipeline = next((r for r in self.supervisor.parts if r.part.name == "pipeline"), None)
        since = pid = None
        if pipeline is not None and pipeline.alive:
            since = time.time() - (time.monotonic() - pipeline.started)
            pid = pipeline.pid
        elif pipeline is not None:
            return None  # not running: the parts line says so
        return watch.starting(now.progress, query, now.at, since, pid)

    def waiting_on(self, query: str) -> str | None:
        """What ``query`` waits on while it starts (:func:`watch.waiting_on`)."""
        now = self.history.newest
        pipeline = next((r for r in self.supervisor.parts if r.part.name == "pipeline"), None)
        if now is None or self.starting(query) is None:
            return None
        return watch.waiting_on(now.progress, query, None if pipeline is None else pipeline.pid)

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(stage, total, per second, lag) for the collector, each query and each destination;
        a query not started yet shows ``starting (N s)`` for its rate."""
        now, history = self.history.newest, self.history
        if now is None:
            return []
        accepted = now.ends.get(watch.RAW)
        found = [("collector", _n(accepted), _rate(history.rate(watch.end_of(watch.RAW))), "")]
        for stage in self.stages:
            lag = now.lag(stage)
            waited = self.starting(stage.name)
            per_second = (
                f"starting ({waited:.0f} s)"
                if waited is not None
                else _rate(history.rate(watch.position_of(stage.name)))
            )
            found.append(
                (
                    stage.name,
                    _n(now.positions.get(stage.name)),
                    per_second,
                    "" if lag is None else f"{lag:,}",
                )
            )
        for name, entry in sorted(now.deliveries.items()):
            found.append(
                (
                    f"→ {name}"[:NAME_WIDTH],
                    _n(watch.delivered_of(name)(now)),
                    _rate(history.rate(watch.delivered_of(name))),
                    f"{entry.queued:,}",
                )
            )
        return found

    def parts(self) -> str:
        """Each part's state; several directors as one entry (``directors 2/3 up``), so the
        line stays within 80 columns."""
        words = []
        directors = [r for r in self.supervisor.parts if r.part.name.startswith("director")]
        for running in self.supervisor.parts:
            if running in directors and len(directors) > 1:
                if running is directors[0]:
                    up = sum(1 for r in directors if r.alive)
                    count = sum(max(0, r.starts - 1) for r in directors)
                    again = f" ({count} restarts)" if count else ""
                    words.append(f"directors {up}/{len(directors)} up{again}")
                continue
            state = "up" if running.alive else "starting" if not running.starts else "restarting"
            restarts = f" ({running.starts - 1} restarts)" if running.starts > 1 else ""
            words.append(f"{running.part.name} {state}{restarts}")
        return "; ".join(words)

    def clock(self) -> str:
        """The newest snapshot's time of day, UTC, 24 h (the console's clock too)."""
        now = self.history.newest
        return time.strftime("%H:%M:%S", time.gmtime(now.at if now else time.time()))

    def render(self) -> Group:
        table = Table(
            Column("stage", no_wrap=True, min_width=12),
            Column("done", justify="right"),
            Column("rate", justify="right"),
            Column("lag / queued", justify="right"),
            box=None,
        )
        for row in self.rows():
            table.add_row(*row)
        head = f"{self.clock()} UTC  {self.parts()}"[:WIDTH]
        waits = [
            Text(f"{stage.name} waits on {waiting}"[:WIDTH])
            for stage in self.stages
            if (waiting := self.waiting_on(stage.name)) is not None
        ]
        return Group(Text(head), table, Text(f"dedupe window {show_window(self.window)}"), *waits)

    def lines(self) -> list[str]:
        """One line per stage, each starting with the time (UTC), within :data:`WIDTH` columns."""
        clock = self.clock()
        found = [f"{clock} {self.parts()}"]
        for stage, done, per_second, lag in self.rows():
            behind = ("queued " if stage.startswith("→") else "lag ") + lag if lag else ""
            if stage == "dedupe":
                behind += f"  window {show_window(self.window)}"
            waiting = None if stage.startswith("→") else self.waiting_on(stage)
            if waiting is not None:  # starting: no lag yet, and the total is the last run's
                window = f"window {show_window(self.window)}  " if stage == "dedupe" else ""
                found.append(f"{clock} {stage:<{NAME_WIDTH}} {per_second}  {window}on {waiting}")
                continue
            found.append(f"{clock} {stage:<{NAME_WIDTH}} {done:>13} {per_second:>9}  {behind}")
        return [line.rstrip()[:WIDTH] for line in found]


WIDTH = 80  # columns, the view's lines at most
NAME_WIDTH = 14


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"
