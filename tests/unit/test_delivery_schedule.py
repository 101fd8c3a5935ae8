"""The director's chores (``director/schedule.py``): pure, so driven with a pinned clock."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from exactly.delivery.director.schedule import Schedule


def test_every_chore_is_due_at_the_first_look() -> None:
    schedule = Schedule({"lease": 1.0, "controls": 1.0, "archive": 5.0})
    assert schedule.due(1000.0) == ["lease", "controls", "archive"]
    assert schedule.due(1000.0) == []


def test_a_chore_comes_round_once_its_interval_has_passed() -> None:
    schedule = Schedule({"lease": 1.0, "archive": 5.0, "unpaged": 5.0})
    schedule.due(100.0)
    assert schedule.due(100.9) == []
    assert schedule.due(101.0) == ["lease"]
    assert schedule.due(104.9) == ["lease"]
    assert schedule.due(105.0) == ["archive", "unpaged"]
    assert schedule.due(105.5) == []


def test_a_late_look_runs_a_chore_once_and_counts_from_then() -> None:
    """A loop held up for a while (a slow JobDB call) runs each chore once, not once per
    interval missed, and its next run is an interval after that."""
    schedule = Schedule({"metrics": 1.0})
    schedule.due(0.0)
    assert schedule.due(30.0) == ["metrics"]
    assert schedule.due(30.5) == []
    assert schedule.due(31.0) == ["metrics"]


def test_a_missed_chore_is_due_again_at_the_next_look() -> None:
    """A chore that could not run (an archive pass still under way) is not put off by a
    whole interval."""
    schedule = Schedule({"archive": 5.0, "lease": 1.0})
    assert schedule.due(10.0) == ["archive", "lease"]
    schedule.missed("archive")
    assert schedule.due(10.5) == ["archive"]
    assert schedule.due(11.0) == ["lease"]
    assert schedule.due(15.4) == ["lease"]
    assert schedule.due(15.5) == ["archive"]


def test_a_postponed_chore_waits_its_seconds_then_its_interval_again() -> None:
    """A chore that failed (the forget chore's JobDB busy) comes round after the wait it was
    given, however longer than its interval, and then at its interval as before."""
    schedule = Schedule({"forget": 1.0, "lease": 1.0})
    schedule.due(10.0)
    schedule.postpone("forget", 10.0, 8.0)
    assert schedule.due(11.0) == ["lease"]
    assert schedule.due(17.5) == ["lease"]
    assert schedule.due(18.0) == ["forget"]
    assert schedule.due(19.0) == ["forget", "lease"]


def test_no_chores_nothing_due() -> None:
    assert Schedule({}).due(5.0) == []


@given(
    intervals=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=5),
    steps=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=60),
)
def test_runs_are_never_closer_than_the_interval(
    intervals: list[float], steps: list[float]
) -> None:
    schedule = Schedule({f"c{n}": interval for n, interval in enumerate(intervals)})
    runs: dict[str, list[float]] = {}
    now = 0.0
    for step in steps:
        now += step
        for chore in schedule.due(now):
            runs.setdefault(chore, []).append(now)
    for chore, times in runs.items():
        interval = schedule.intervals[chore]
        assert all(later - earlier >= interval for earlier, later in itertools.pairwise(times))
        assert times[0] == steps[0]  # due at the first look
