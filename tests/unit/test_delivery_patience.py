"""How long the router and the director retry a failing JobDB (pure logic)."""

from __future__ import annotations

import pytest

from exactly.delivery.patience import Patience
from exactly.errors import JobDBError


def test_failures_are_retried_with_one_report_until_patience_is_spent() -> None:
    reports: list[str] = []
    patience = Patience("sqlite:///jobs.db", 60.0, "the query stopped", reports.append)
    pauses = [patience.failed(OSError("disk\n  gone")) for _ in range(5)]
    assert all(0 <= pause <= 2.0 for pause in pauses)
    assert reports == ["the JobDB failed (OSError: disk gone); retrying"]
    with pytest.raises(JobDBError, match=r"sqlite:///jobs.db failed \(OSError: again\).*60 s; the"):
        patience.failed(OSError("again"), spent=True)


def test_no_patience_gives_up_at_the_first_failure() -> None:
    patience = Patience("postgresql://h/db", 0.0, "a restart resumes", lambda line: None)
    with pytest.raises(JobDBError, match="a restart resumes"):
        patience.failed(ConnectionError("refused"))
