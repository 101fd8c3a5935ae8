"""Upkeep: what operators set through the JobDB's control rows, applied every second, and
each destination's breaker written back for them (``exactly deliveries``)."""

from __future__ import annotations

from collections.abc import Callable

from exactly.delivery.director.expiry import Expiry
from exactly.delivery.director.jobdb_thread import JobDBThread
from exactly.delivery.director.queues import Destination
from exactly.delivery.jobdb.base import Control


class Controls:
    """Applies the control rows to this director's destinations.

    A pause holds a destination's requests; an expiry asked for is answered for the partitions
    this director keeps (each director answers for its own). The breaker is this director's
    own: its row is written when this director's breaker changes, so it shows the last change
    any director made.
    """

    def __init__(self, calls: JobDBThread, expiry: Expiry, report: Callable[[str], None]) -> None:
        self.calls = calls
        self.expiry = expiry
        self.report = report
        self._breakers: dict[str, tuple[bool, float | None]] = {}  # as this director wrote them

    async def apply(self, destinations: dict[str, Destination], kept: set[int]) -> None:
        """Apply the controls to ``destinations`` for the partitions in ``kept``."""
        jobdb = self.calls.jobdb
        call = self.calls.call
        controls = await call(jobdb.controls)
        for name, destination in destinations.items():
            control = controls.get(name, Control(name))
            if destination.pace.held != control.held:
                destination.pace.held = control.held
                self.report(f"{name}: {'paused' if control.held else 'resumed'} by an operator")
                destination.wake.set()
            unanswered = kept - set(control.expired_partitions)
            if control.expire_asked is not None and unanswered:
                before = control.expire_before or control.expire_asked
                count = await self.expiry.before(destination, before, unanswered)
                await call(jobdb.answer_expiry, name, control.expire_asked, unanswered, count)
                self.report(f"{name}: {count} jobs expired by an operator")
            pace = destination.pace
            since = pace.failing_since if pace.open else None
            last = self._breakers.get(name, (control.breaker_open, control.failing_since))
            if last != (pace.open, since):
                await call(jobdb.set_control, name, breaker_open=pace.open, failing_since=since)
                if pace.open:
                    self.report(f"{name}: paused after {pace.failures} failed requests; probing")
                elif last[0]:
                    self.report(f"{name}: answering again; sending resumed")
            self._breakers[name] = (pace.open, since)
        for name, control in controls.items():  # asked of a destination with no jobs here
            unanswered = kept - set(control.expired_partitions)
            if control.expire_asked is not None and unanswered and name not in destinations:
                await call(jobdb.answer_expiry, name, control.expire_asked, unanswered, 0)
