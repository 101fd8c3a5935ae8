"""How long the router and the director keep retrying a failing JobDB before they give up."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from exactly.backoff import backoff
from exactly.errors import ExactlyError, JobDBError

T = TypeVar("T")


@dataclass
class Patience:
    """One operation's retries: each failure gives the pause before the next try, or, once
    ``seconds`` have passed since the first failure, raises one :class:`JobDBError` naming the
    JobDB, the cause and ``then`` (what stopped, and how a restart resumes)."""

    jobdb_name: str
    seconds: float
    then: str
    report: Callable[[str], None]
    failed_at: float | None = None
    attempt: int = 0

    def failed(self, error: Exception, *, spent: bool = False) -> float:
        """The pause before the next try; ``spent``: give up now (an earlier call did)."""
        now = time.monotonic()
        self.failed_at = now if self.failed_at is None else self.failed_at
        self.attempt += 1
        cause = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        if spent or now - self.failed_at >= self.seconds:
            raise JobDBError(
                f"the JobDB {self.jobdb_name} failed ({cause}) and did not recover within "
                f"{self.seconds:g} s; {self.then}"
            ) from None
        if self.attempt == 1:
            self.report(f"the JobDB failed ({cause}); retrying")
        return backoff(self.attempt, minimum=0.05, maximum=2.0)


class Closable(Protocol):
    def close(self) -> None: ...


def patiently(call: Callable[[], T], jobdb: Closable, patience: Patience) -> T:
    """``call()``, tried again on a new connection while the JobDB fails, as ``patience``
    allows. An :class:`~exactly.errors.ExactlyError` is a decision, not a failure: raised."""
    while True:
        try:
            return call()
        except ExactlyError:  # decided: the JobDB refused in words of its own
            raise
        except Exception as error:  # noqa: BLE001 (each driver has its own error tree)
            pause = patience.failed(error)
            with contextlib.suppress(Exception):
                jobdb.close()
            time.sleep(pause)
