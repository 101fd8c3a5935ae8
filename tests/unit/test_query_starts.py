"""``streaming.run_query`` starts a query again when Spark's fixed wait for its Python source
ran out (a loaded machine), a bounded number of times, and never for any other failure."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.errors import PySparkException

from exactly.errors import StreamError
from exactly.spark import streaming
from tests.cli_text import messages
from tests.unit.test_progress_reads import Query

LATE = (
    "[STREAM_FAILED] Query [id = 1] terminated with exception: Python worker failed to "
    "connect back. SQLSTATE: XXKST"
)


class FailingQuery(Query):
    """A StreamingQuery that ends at once: failed with ``failure``, or done with one batch."""

    def __init__(self, failure: str | None) -> None:
        super().__init__()
        self.failure = failure
        self.name = "q"
        self.isActive = False
        if failure is None:
            self.add(0, 1)

    def awaitTermination(self, timeout: float) -> bool:  # Spark's name
        if self.failure is not None:
            raise PySparkException(self.failure)
        return True


class Writer:
    """A DataStreamWriter whose starts fail with ``failures`` in turn, then succeed."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = list(failures)
        self.starts = 0
        self._spark = None

    def trigger(self, **_: Any) -> Writer:
        return self

    def start(self) -> FailingQuery:
        self.starts += 1
        return FailingQuery(self.failures.pop(0) if self.failures else None)


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses between starts, recorded instead of slept."""
    paused: list[float] = []

    def wait(seconds: float) -> bool:
        paused.append(seconds)
        return False

    monkeypatch.setattr(streaming.STOPPING, "wait", wait)
    return paused


def run(writer: Writer) -> dict[int, Any]:
    return streaming.run_query(writer, until_caught_up=True, trigger_seconds=1.0)  # type: ignore[arg-type]


def test_a_late_python_source_is_started_again(
    capsys: pytest.CaptureFixture[str], no_pause: list[float]
) -> None:
    writer = Writer([LATE, LATE])
    assert list(run(writer)) == [0]
    assert writer.starts == 3
    low, high = streaming.START_PAUSE
    first, second = no_pause  # drawn at random, longer after each start
    assert low <= first <= high and 2 * low <= second <= 2 * high
    err = capsys.readouterr().err
    assert all(len(line) <= 80 for line in err.splitlines()), err
    said = messages(err)
    assert said == [
        f"warning: query q: its Python source did not connect back within Spark's fixed 10 s "
        f"(a loaded machine); starting it again ({n} of {streaming.QUERY_STARTS})"
        for n in (2, 3)
    ]


def test_only_so_many_times() -> None:
    writer = Writer([LATE] * streaming.QUERY_STARTS)
    with pytest.raises(StreamError, match="failed to connect back"):
        run(writer)
    assert writer.starts == streaming.QUERY_STARTS


def test_any_other_failure_is_raised_at_once() -> None:
    writer = Writer(["[STREAM_FAILED] Query [id = 1] terminated with exception: boom"])
    with pytest.raises(StreamError, match="boom"):
        run(writer)
    assert writer.starts == 1


def test_a_stop_during_the_pause_ends_the_query_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming.STOPPING, "wait", lambda seconds: True)
    writer = Writer([LATE])
    assert run(writer) == {}
    assert writer.starts == 1
