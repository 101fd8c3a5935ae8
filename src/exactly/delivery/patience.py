"""How long the router and the director keep retrying a failing JobDB before they give up."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from exactly.backoff import backoff
from exactly.errors import JobDBError


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
