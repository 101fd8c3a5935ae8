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


def test_a_429_pauses_every_request_with_jitter_and_halves_the_rate_once() -> None:
    pace = Pace(jitter=lambda: 0.5)
    for at in range(20):  # 20 requests in the second before
        assert pace.take(99.0 + at / 20) == 0.0
    pace.answered(THROTTLED, 100.0, wait=2.0)
    assert pace.paused_until == 100.0 + 2.0 * 1.1  # 10% of jitter drawn
    assert abs(pace.take(101.0) - 1.2) < 1e-9
    first = pace.throttle
    assert first is not None and 9.0 <= first <= 11.0  # half of about 20/s
    for _ in range(7):  # the other requests that were out: the same pause, no new decrease
        pace.answered(THROTTLED, 100.5, wait=2.0)
    assert pace.throttle == first


def test_a_throttled_rate_grows_back_with_successes_until_it_ends() -> None:
    pace = Pace(rate=40.0, jitter=lambda: 0.0)
    pace.take(99.5)
    pace.answered(THROTTLED, 100.0, wait=1.0)
    assert pace.throttle is not None and pace.limit() == pace.throttle
    start = pace.throttle
    pace.answered(SUCCESS, 102.0)  # a second of successes after the pause: doubled
    assert pace.throttle == 2 * start
    pace.answered(SUCCESS, 110.0)
    assert pace.throttle is None and pace.limit() == 40.0


def test_the_breaker_opens_after_consecutive_failures_and_probes_one_at_a_time() -> None:
    pace = Pace(open_after=3, probe_minimum=1.0, probe_maximum=8.0, jitter=lambda: 1.0)
    pace.answered(FAILED, 10.0)
    pace.answered(REFUSED, 10.5)  # an answer: the count starts again
    for at in (11.0, 11.1):
        pace.answered(FAILED, at)
    assert not pace.open
    pace.answered(FAILED, 11.2)
    assert pace.open and pace.failing_since == 11.0
    assert pace.take(11.5) > 0  # nothing before the probe time (1 s to 2 s)
    assert pace.take(13.3) == 0.0  # the probe
    assert pace.take(13.3) == 1.0  # a second request waits for the probe's answer
    pace.answered(FAILED, 13.4)
    assert pace.open and pace.probe_at == 13.4 + 4.0  # the next probe later
    assert pace.take(17.5) == 0.0
    pace.answered(SUCCESS, 17.6)
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
        pace.answered(FAILED, 100.0 + at / 25)
    assert not pace.open
    pace.answered(SUCCESS, 105.0)
    for at in range(25):
        pace.answered(FAILED, 106.0 + at * 2)
    assert pace.open and pace.failing_since == 106.0


def test_buckets_take_turns_across_takes() -> None:
    """Three jobs taken at once, then one per freed slot: every bucket is served in turn."""
    from exactly.delivery.director.queues import Bucket, Destination
    from exactly.delivery.jobdb.base import Job
    from exactly.delivery.settings import DestinationSettings

    settings = DestinationSettings(name="d", url="http://127.0.0.1:9/", max_in_flight=3, rate=1)
    destination = Destination(settings, Pace())
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
