"""A destination's pacing (``delivery/pacing.py``): pure, so driven here with a pinned clock."""

from __future__ import annotations

from exactly.delivery.pacing import FAILED, REFUSED, SUCCESS, THROTTLED, Pace, result_of


def test_answers_count_as_the_rules_say() -> None:
    assert result_of(429, retry_after=None) == THROTTLED
    assert result_of(503, retry_after=2.0) == THROTTLED
    assert result_of(503, retry_after=None) == FAILED
    assert result_of(None, retry_after=None) == FAILED
    assert result_of(408, retry_after=None) == FAILED
    assert result_of(204, retry_after=None) == SUCCESS
    assert result_of(404, retry_after=None) == REFUSED
    assert result_of(301, retry_after=None) == REFUSED


def test_a_429_narrows_the_window_by_half_a_request_and_pauses_nothing() -> None:
    pace = Pace(jitter=lambda: 0.5)
    assert pace.allowed(16) == 16
    pace.answered(THROTTLED, 100.0, wait=1.0, maximum=16)
    assert pace.window == 15.5 and pace.allowed(16) == 15
    assert pace.take(100.0) == 0.0 and pace.paused_until == 0.0  # only its own job waits
    for _ in range(9):
        pace.answered(THROTTLED, 100.1, wait=1.0, maximum=16)
    assert pace.window == 11.0 and pace.paused_until == 0.0


def test_the_window_widens_by_one_per_window_of_successes_back_to_max_in_flight() -> None:
    pace = Pace(jitter=lambda: 0.0)
    for _ in range(8):
        pace.answered(THROTTLED, 100.0, maximum=8)
    assert pace.window == 4.0
    for _ in range(4):
        pace.answered(SUCCESS, 101.0, maximum=8)
    assert pace.allowed(8) == 4 and pace.window is not None and pace.window > 4.9
    for _ in range(40):
        pace.answered(SUCCESS, 102.0, maximum=8)
    assert pace.window is None and pace.allowed(8) == 8  # recovered: no window kept


def test_a_share_of_429s_settles_the_window_where_the_formula_says() -> None:
    """One 429 in ``k`` answers: the window settles near ``2 (k - 1)``, capped by
    ``max_in_flight``. 5%: the whole window; a half: about two."""
    for every, maximum, settled in ((20, 16, (15, 16)), (2, 16, (1, 3)), (5, 16, (6, 10))):
        pace = Pace(jitter=lambda: 0.0)
        seen = []
        for n in range(4000):
            result = THROTTLED if n % every == 0 else SUCCESS
            pace.answered(result, 100.0 + n / 1000, wait=1.0, maximum=maximum)
            seen.append(pace.allowed(maximum))
        low, high = settled
        assert low <= min(seen[2000:]) and max(seen[2000:]) <= high, (every, min(seen[2000:]))
        assert pace.paused_until == 0.0


def test_throttled_at_a_window_of_one_the_whole_destination_waits_with_jitter() -> None:
    pace = Pace(jitter=lambda: 0.5)
    for _ in range(30):  # 16 down to 1, half a request a time
        pace.answered(THROTTLED, 100.0, wait=2.0, maximum=16)
    assert pace.allowed(16) == 1 and pace.paused_until == 0.0
    pace.answered(THROTTLED, 105.0, wait=2.0, maximum=16)
    assert pace.paused_until == 105.0 + 2.0 * 1.1  # 10% of jitter drawn
    assert abs(pace.take(106.0) - 1.2) < 1e-9


def test_a_window_narrowed_by_a_429_is_capped_by_a_smaller_max_in_flight() -> None:
    """A director's share of ``max_in_flight`` can shrink (another director took partitions)."""
    pace = Pace()
    pace.answered(THROTTLED, 100.0, maximum=16)
    assert pace.allowed(16) == 15 and pace.allowed(3) == 3
    pace.answered(THROTTLED, 100.0, maximum=3)
    assert pace.window == 2.5


def test_the_breaker_opens_after_consecutive_failures_and_probes_one_at_a_time() -> None:
    pace = Pace(open_after=3, probe_minimum=1.0, probe_maximum=8.0, jitter=lambda: 1.0)
    pace.answered(FAILED, 10.0, maximum=16)
    pace.answered(REFUSED, 10.5, maximum=16)  # an answer: the count starts again
    for at in (11.0, 11.1):
        pace.answered(FAILED, at, maximum=16)
    assert not pace.open
    pace.answered(FAILED, 11.2, maximum=16)
    assert pace.open and pace.failing_since == 11.0
    assert pace.take(11.5) > 0  # nothing before the probe time (1 s to 2 s)
    assert pace.take(13.3) == 0.0  # the probe
    assert pace.take(13.3) == 1.0  # a second request waits for the probe's answer
    pace.answered(FAILED, 13.4, maximum=16)
    assert pace.open and pace.probe_at == 13.4 + 4.0  # the next probe later
    assert pace.take(17.5) == 0.0
    pace.answered(SUCCESS, 17.6, maximum=16)
    assert not pace.open and pace.failing_since is None and pace.take(17.7) == 0.0


def test_an_operator_pause_holds_everything() -> None:
    pace = Pace(held=True)
    assert pace.take(0.0) > 0
    pace.held = False
    assert pace.take(0.0) == 0.0


def test_a_run_of_failures_shorter_than_failing_for_keeps_the_breaker_closed() -> None:
    """A receiver failing each first try: 25 first tries fail within a second, then the
    retries succeed; the breaker must not open on the run alone."""
    pace = Pace(open_after=20, failing_for=30.0)
    for at in range(25):
        pace.answered(FAILED, 100.0 + at / 25, maximum=16)
    assert not pace.open
    pace.answered(SUCCESS, 105.0, maximum=16)
    for at in range(25):
        pace.answered(FAILED, 106.0 + at * 2, maximum=16)
    assert pace.open and pace.failing_since == 106.0


def test_buckets_take_turns_across_takes() -> None:
    """Three jobs taken at once, then one per freed slot: every bucket is served in turn."""
    from exactly.delivery.client import Client
    from exactly.delivery.director.queues import Bucket, Destination
    from exactly.delivery.jobdb.base import Job
    from exactly.delivery.settings import DestinationSettings

    settings = DestinationSettings(name="d", url="http://127.0.0.1:9/", max_in_flight=3, rate=1)
    destination = Destination(settings, Pace(), Client(settings.url))
    for source in range(5):
        bucket = Bucket(f"s{source}/d", ordered=False)
        jobs = [
            Job(source * 10 + n, bucket.name, "d", b"{}", f"{source}-{n}", None, 0.0, 1e12)
            for n in range(3)
        ]
        bucket.place(jobs, 0.0)
        destination.buckets.append(bucket)
    out, _ = destination.take(0.0)
    served = [bucket.name[:2] for bucket, _ in out]
    for _ in range(7):
        bucket, job = out.pop(0)
        destination.done(bucket, job)
        taken, _ = destination.take(0.0)
        served += [bucket.name[:2] for bucket, _ in taken]
        out += taken
    assert served == ["s0", "s1", "s2", "s3", "s4"] * 2
