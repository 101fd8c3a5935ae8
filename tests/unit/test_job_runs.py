"""A micro-batch's jobs as columns (jobdb/runs.py) and the insert statements' spans (pure)."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from exactly.delivery import packs
from exactly.delivery.jobdb.base import NewJob, bucket_of
from exactly.delivery.jobdb.runs import JobRun, RoutedJobs, events_of, job_rows
from exactly.delivery.jobdb.sql.rows import statement_spans
from exactly.delivery.route import EventColumns, jobs_for
from exactly.delivery.settings import DestinationSettings


def run(count: int, *, sources: list[str] | None = None, lanes: int = 0) -> JobRun:
    return JobRun(
        "hook",
        sources or ["web"] * count,
        [b"e%d" % i for i in range(count)],
        [f"m{i}" for i in range(count)],
        [f"u{i % 3}" if i % 4 else None for i in range(count)],
        expire_at=50.0,
        lanes=[i % lanes for i in range(count)] if lanes else (),
    )


def test_a_run_reads_as_the_jobs_it_holds() -> None:
    jobs = run(5, sources=["web", "ios", "web", "web", "ios"], lanes=2)
    assert len(jobs) == 5 and jobs[1] == NewJob("ios", "hook", b"e1", "m1", "u1", 50.0, lane=1)
    assert list(jobs) == [jobs[i] for i in range(5)] and jobs[3:] == [jobs[3], jobs[4]]
    assert list(jobs.buckets()) == [job.bucket for job in jobs]
    assert list(jobs.buckets())[:2] == [bucket_of("web", "hook"), bucket_of("ios", "hook", 1)]
    assert list(run(3).buckets()) == ["web/hook"] * 3 and list(run(0).buckets()) == []


def test_routed_jobs_keep_their_parts_order_and_count_events() -> None:
    pack = NewJob(
        "web", "bulk", packs.pack([packs.Member(f"p{i}", None, b"x") for i in range(4)]), "k"
    )
    alone = NewJob("web", "crm", b"c", "c1", error="boom")
    jobs = RoutedJobs([pack, run(3), run(0), alone])
    assert len(jobs) == 5 and len(jobs.parts) == 3  # an empty run is left out
    assert [job.destination for job in jobs] == ["bulk", "hook", "hook", "hook", "crm"]
    assert jobs[4] == alone and jobs == list(jobs) and RoutedJobs() == []
    assert events_of(jobs) == 4 + 3 + 1 == events_of(list(jobs))


def test_job_rows_give_ids_by_events_and_the_failed_their_error() -> None:
    pack = NewJob(
        "web", "bulk", packs.pack([packs.Member(f"p{i}", None, b"x") for i in range(4)]), "k"
    )
    alone = NewJob("web", "crm", b"c", "c1", expire_at=0.0, error="boom")
    jobs = RoutedJobs([pack, run(2, lanes=2), alone])
    rows, failed = job_rows(jobs, 100, now=10.0)
    assert [row[0] for row in rows] == [100, 104, 105, 106]  # a pack takes an id per member
    assert rows[2] == (105, "web/1/hook", "hook", b"e1", "m1", "u1", 10.0, 50.0, 1)
    assert rows[3][7] == 10.0 + 4 * 3600 and rows[0][8] == 4  # no expiry: 4 h; a pack's events
    assert failed == [(106, "boom")]
    assert job_rows(list(jobs), 100, now=10.0) == (rows, failed)  # the same from plain jobs


def test_a_destinations_single_jobs_are_one_run_of_the_columns() -> None:
    events = EventColumns(
        source=["web", None, "web", "web"],
        name=["A", "B", "A", "A"],
        message_id=["m0", "m1", None, "m3"],
        user_id=["u0", "u1", "u2", None],
        payload=[b"0", b"1", b"2", b"3"],
        partition=[0, 0, 1, 1],
        offset=[5, 6, 7, 8],
    )
    every, some = (
        DestinationSettings(name="every", url="http://127.0.0.1:9/", lanes=4),
        DestinationSettings(name="some", url="http://127.0.0.1:9/", events=["A"]),
    )
    jobs = jobs_for(events, [every, some], now=0.0)
    assert [type(part) for part in jobs.parts] == [JobRun, JobRun]
    assert [(job.source, job.message_id) for job in jobs.parts[1]] == [
        ("web", "m0"),
        ("web", "1-7"),  # no messageId: its place in the log
        ("web", "m3"),
    ]
    assert [job.source for job in jobs.parts[0]] == ["web", "", "web", "web"]
    assert jobs.parts[0][3].lane == 0  # no user: lane 0


@given(st.lists(st.integers(0, 50), max_size=60), st.integers(1, 8), st.integers(1, 120))
def test_statements_take_every_row_once_within_their_bounds(
    sizes: list[int], rows: int, size: int
) -> None:
    spans = list(statement_spans(sizes, rows, size))
    assert [i for span in spans for i in span] == list(range(len(sizes)))
    for span in spans:
        assert 1 <= len(span) <= rows
        assert len(span) == 1 or sum(sizes[i] for i in span) <= size
    for span, after in pairwise(spans):  # each as full as it could be
        assert len(span) == rows or sum(sizes[i] for i in span) + sizes[after.start] > size
