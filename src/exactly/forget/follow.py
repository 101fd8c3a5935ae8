"""A running part applying regulations to its own store, between two pieces of its own work.

``exactly forget`` leaves a store to the part that owns it while the part runs (the lake query
holds the lake's checkpoint lock): writing it beside the part would race with the part's
commits. The part runs a :class:`Follower`: a thread that reads the regulations topic every
second and applies each pending one under the part's own lock, which the part holds for each
micro-batch, so a regulation lands between two batches even when none comes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from exactly.forget.regulations import REFRESH_SECONDS, Forgotten, Regulation, Regulations

if TYPE_CHECKING:
    from exactly.log import Log

Apply = Callable[[Forgotten], Mapping[str, Any]]


class Follower:
    """Applies ``store``'s pending regulations with ``apply`` under ``lock``, every second."""

    def __init__(
        self,
        log_url: str,
        key: bytes,
        store: str,
        apply: Apply,
        lock: threading.Lock,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.log_url = log_url
        self.key = key
        self.store = store
        self.apply = apply
        self.lock = lock
        self.report = report or _say
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"forget-{store}", daemon=True)
        self._log: Log | None = None
        self._regulations: Regulations | None = None

    def start(self) -> Follower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if self._log is not None:
            with contextlib.suppress(Exception):
                self._log.close()

    def _loop(self) -> None:
        from exactly.log import open_log

        while not self._stop.wait(REFRESH_SECONDS):
            try:
                if self._regulations is None:
                    self._log = open_log(self.log_url)
                    self._regulations = Regulations(self._log)
                regulations = self._regulations
                regulations.refresh()
                for regulation in regulations.pending(self.store):
                    self._apply(regulations, regulation)
            except Exception as error:  # noqa: BLE001 (said, and tried again in a second)
                self.report(f"forget: {self.store}: {type(error).__name__}: {error}")

    def _apply(self, regulations: Regulations, regulation: Regulation) -> None:
        with self.lock:
            if self._stop.is_set():
                return
            report = self.apply(Forgotten(self.key, regulation.hashes))
        regulations.mark_done(regulation, self.store, report)
        said = ", ".join(f"{value:,} {name}" for name, value in report.items())
        self.report(f"forget: {self.store}: regulation {regulation.id[:8]} applied, {said}")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
