"""``exactly up``'s terminal view: each part's state, each stage's rate and lag.

On a terminal it is a live table (rich) redrawn every second; otherwise (a log file, a test) one
line per stage every ``every`` seconds. Both fit 80 columns.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.table import Column, Table
from rich.text import Text

from exactly.config import Settings
from exactly.log import Log
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
        self.before: watch.Snapshot | None = None
        self.last: watch.Snapshot | None = None
        self.due = 0.0
        self.live = Live(console=Console(), auto_refresh=False, transient=False) if live else None

    def __enter__(self) -> View:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.live is not None:
            self.live.stop()

    def tick(self) -> None:
        now = time.monotonic()
        if now < self.due:
            return
        self.due = now + self.every
        try:
            taken = watch.take(self.settings, self.log, self.stages)
        except Exception as error:  # noqa: BLE001 - the view never stops the service it shows
            self.say(f"warning: no status this time: {type(error).__name__}: {error}")
            return
        self.before, self.last = self.last, taken
        if self.live is not None:
            self.live.update(self.render(), refresh=True)
        else:
            for line in self.lines():
                self.say(line)

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(stage, total, per second, lag) for the collector, each query and each destination."""
        now, before = self.last, self.before
        if now is None:
            return []
        found = []
        accepted = now.ends.get(watch.RAW)
        was = before.ends.get(watch.RAW) if before else None
        found.append(("collector", _n(accepted), _rate(watch.rate(before, now, accepted, was)), ""))
        for stage in self.stages:
            position = now.positions.get(stage.name)
            was = before.positions.get(stage.name) if before else None
            lag = now.lag(stage)
            found.append(
                (
                    stage.name,
                    _n(position),
                    _rate(watch.rate(before, now, position, was)),
                    "" if lag is None else f"{lag:,}",
                )
            )
        for name, entry in sorted(now.deliveries.items()):
            done = sum(entry.states.values()) - entry.queued
            was_entry = before.deliveries.get(name) if before else None
            was_done = sum(was_entry.states.values()) - was_entry.queued if was_entry else None
            found.append(
                (
                    f"→ {name}"[:22],
                    _n(done),
                    _rate(watch.rate(before, now, done, was_done)),
                    f"{entry.queued:,}",
                )
            )
        return found

    def parts(self) -> str:
        words = []
        for running in self.supervisor.parts:
            state = "up" if running.alive else "restarting"
            restarts = f", {running.starts - 1} restarts" if running.starts > 1 else ""
            words.append(f"{running.part.name} {state}{restarts}")
        return "; ".join(words)

    def render(self) -> Group:
        table = Table(
            Column("stage", no_wrap=True, min_width=12),
            Column("done", justify="right"),
            Column("per s", justify="right"),
            Column("lag / queued", justify="right"),
            box=None,
        )
        for row in self.rows():
            table.add_row(*row)
        return Group(Text(self.parts()), table)

    def lines(self) -> list[str]:
        found = [self.parts()]
        for stage, done, per_second, lag in self.rows():
            behind = ("queued " if stage.startswith("→") else "lag ") + lag if lag else ""
            found.append(f"  {stage:<18} {done:>12} {per_second:>9}/s  {behind}".rstrip())
        return found


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _rate(value: float) -> str:
    return f"{value:,.0f}"
