"""GCRA (pure): the properties both entry points keep, police (collector) and shape (director)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.gcra import Rate, police, police_cost, shape

RATES = st.builds(
    Rate,
    per_second=st.floats(min_value=0.1, max_value=1000, allow_nan=False),
    burst=st.integers(min_value=1, max_value=100),
)
GAPS = st.lists(st.floats(min_value=0, max_value=2, allow_nan=False), min_size=1, max_size=300)


def arrivals(gaps: list[float]) -> list[float]:
    times, now = [], 1000.0
    for gap in gaps:
        now += gap
        times.append(now)
    return times


def assert_within_rate(taken: list[float], rate: Rate) -> None:
    """No window [taken[i], taken[j]] holds more than burst + its length x rate requests."""
    for i, start in enumerate(taken):
        for j in range(i, len(taken)):
            window = taken[j] - start
            assert j - i + 1 <= rate.burst + window * rate.per_second + 1e-6


@given(rate=RATES, gaps=GAPS)
def test_policing_admits_no_more_than_burst_plus_rate_in_any_window(
    rate: Rate, gaps: list[float]
) -> None:
    tat, taken = 0.0, []
    for now in arrivals(gaps):
        tat, wait = police(tat, now, rate)
        if not wait:
            taken.append(now)
    assert_within_rate(taken, rate)


@given(rate=RATES, gaps=GAPS)
def test_shaping_sends_no_more_than_burst_plus_rate_in_any_window(
    rate: Rate, gaps: list[float]
) -> None:
    """Requests ready at ``now`` (after the previous one left) leave at ``send_at``."""
    tat, now, sent = 0.0, 1000.0, []
    for gap in gaps:
        now += gap
        send_at, tat = shape(tat, now, rate)
        assert send_at >= now
        now = send_at
        sent.append(send_at)
    assert_within_rate(sent, rate)


@given(rate=RATES, count=st.integers(min_value=1, max_value=300))
def test_a_party_within_its_rate_is_never_held_back(rate: Rate, count: int) -> None:
    police_tat = shape_tat = 0.0
    now = 50.0
    for _ in range(count):
        police_tat, wait = police(police_tat, now, rate)
        assert wait == 0
        send_at, shape_tat = shape(shape_tat, now, rate)
        assert send_at == now
        now += rate.interval * 1.000001


@given(rate=RATES)
def test_a_burst_goes_at_once_then_the_next_waits_one_interval(rate: Rate) -> None:
    tat, now = 0.0, 7.0
    for _ in range(rate.burst):
        tat, wait = police(tat, now, rate)
        assert wait == 0
    refused_tat, wait = police(tat, now, rate)
    assert wait > 0 and refused_tat == tat  # a refusal costs the client nothing more
    assert police(tat, now + wait, rate)[1] == 0
    assert wait == pytest.approx(rate.interval)
    send_at, _ = shape(tat, now, rate)
    assert send_at == pytest.approx(now + wait)  # both entry points agree on the time


@given(rate=RATES, gaps=GAPS)
def test_police_and_shape_agree(rate: Rate, gaps: list[float]) -> None:
    """A policed request refused with ``wait`` is the one shaping would send ``wait`` later,
    and a request taken now is one shaping sends now, leaving the same TAT."""
    tat = 0.0
    for now in arrivals(gaps):
        new_tat, wait = police(tat, now, rate)
        send_at, shaped_tat = shape(tat, now, rate)
        if wait:
            assert police(tat, now + wait, rate)[1] == 0
            assert send_at == pytest.approx(now + wait)
        else:
            assert (send_at, shaped_tat) == (now, new_tat)
            tat = new_tat


@pytest.mark.parametrize(("per_second", "burst"), [(0, 1), (-1, 1), (float("inf"), 1), (1, 0)])
def test_a_rate_must_be_positive_and_finite_with_a_burst_of_one_or_more(
    per_second: float, burst: int
) -> None:
    with pytest.raises(ValueError, match="per_second > 0"):
        Rate(per_second, burst)


@given(
    per_second=st.floats(1, 1e6),
    burst=st.integers(1, 10**7),
    costs=st.lists(st.tuples(st.floats(0, 5), st.floats(0, 1)), min_size=1, max_size=60),
)
def test_police_cost_never_takes_more_than_burst_plus_rate(
    per_second: float, burst: int, costs: list[tuple[float, float]]
) -> None:
    """Weighted by cost (bytes, each at most the burst): what is taken from the first taken
    request up to any moment is at most ``burst + rate * elapsed``."""
    rate = Rate(per_second, burst)
    tat, now, first, taken = 0.0, 0.0, None, 0.0
    for gap, share in costs:
        now += gap
        cost = share * burst
        tat, wait = police_cost(tat, now, rate, cost)
        if not wait:
            first = now if first is None else first
            taken += cost
            assert taken <= (burst + (now - first) * per_second) * (1 + 1e-9) + 1e-6


def test_police_cost_takes_a_request_larger_than_the_burst_only_when_quiet() -> None:
    rate = Rate(1000, 100)
    tat, wait = police_cost(0.0, 10.0, rate, 500)
    assert wait == 0 and tat == 10.5
    assert police_cost(tat, 10.2, rate, 500) == (tat, pytest.approx(0.3))
    assert police_cost(tat, 10.45, rate, 10)[1] == 0  # a small one, once its backlog fits
