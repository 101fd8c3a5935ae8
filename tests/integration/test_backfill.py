"""``exactly backfill`` in a real Spark over a real log and each JobDB backend: a destination
added later gets the history before the route started with it, through its filter,
integrations rule and transform, once, however often backfill runs and whatever its window.

The expected jobs are worked out in plain Python (``test_route_shaping.expected``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from exactly.delivery import backfill
from exactly.delivery.backfill import BackfillPlan
from exactly.delivery.jobdb.base import BACKFILL, ROUTE, RouteCounts
from exactly.delivery.route import RoutePlan, drive
from exactly.delivery.settings import DestinationSettings
from exactly.errors import ConfigError, ReplayRunning
from exactly.log import open_log
from exactly.log.base import Record
from exactly.text import message
from tests.integration.test_route_shaping import SHAPES, destinations, expected, make_events

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from exactly.delivery.jobdb import JobDB

pytestmark = pytest.mark.spark

PARTITIONS = 2
HISTORY, LIVE = 600, 200  # events before the route takes the late destination, and after
DAY = 86_400_000


def received(n: int) -> str:
    """History over six days (20th to 25th), live events on the 28th."""
    day = 20 + n // 100 if n < HISTORY else 28
    return f"2026-11-{day:02d}T12:00:00.000Z"


def ms(day: int) -> int:
    return 1795132800000 + (day - 20) * DAY  # 2026-11-20T00:00:00Z on


def append(log_url: str, events: list[dict[str, Any]]) -> None:
    """Three of every five events to partition 0, so partition 1 runs out first."""
    with open_log(log_url) as log:
        log.create_topic("events", PARTITIONS, exist_ok=True)
        for partition in range(PARTITIONS):
            values = [
                orjson.dumps(event)
                for n, event in enumerate(events)
                if (n % 5 >= 3) == bool(partition)
            ]
            log.append("events", partition, [Record(value) for value in values])


def route(
    spark: SparkSession,
    log_url: str,
    db: JobDB,
    checkpoint: Path,
    routed: tuple[DestinationSettings, ...],
) -> None:
    plan = RoutePlan(
        log_url, checkpoint, routed, until_caught_up=True, read_records=200,
        max_records_per_trigger=300,
    )  # fmt: skip
    drive(spark, plan, db, say=lambda _: None)


def jobs_of(db: JobDB, name: str) -> Counter[tuple[str, bytes]]:
    return Counter((job.message_id, job.payload) for job in db.jobs_of(name, limit=10**6))


def wanted(events: list[dict[str, Any]], directory: Path, name: str) -> Counter[tuple[str, bytes]]:
    jobs, failed, _ = expected(events, directory)
    found: Counter[tuple[str, bytes]] = Counter()
    for (destination, message_id, payload), times in jobs.items():
        if destination == name:
            found[(message_id, payload)] += times
    failing = {message_id for destination, message_id in failed if destination == name}
    stored = {event["messageId"]: orjson.dumps(event) for event in events}
    for message_id in failing:  # a failed job keeps the stored event as its payload
        found[(message_id, stored[message_id])] += 1
    return found


def counts(events: list[dict[str, Any]], directory: Path, name: str) -> RouteCounts:
    return expected(events, directory)[2].get(name, RouteCounts())


def test_a_late_destination_gets_its_history_once_through_its_filter_and_transform(
    spark: SparkSession, tmp_path: Path, jobdb: JobDB
) -> None:
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "shapes.py").write_text(SHAPES)
    everyone, late = destinations(directory)[0], destinations(directory)[3]  # late: "shaped"
    events = make_events(HISTORY + LIVE)
    for n, event in enumerate(events):
        event["receivedAt"] = received(n)
    history, live = events[:HISTORY], events[HISTORY:]
    log_url, checkpoint = f"sqlite://{tmp_path / 'log'}", tmp_path / "checkpoint"
    plan = BackfillPlan(log_url=log_url, destination=late, since_ms=ms(23), wait_seconds=0)

    # the history is routed to everyone alone; late is not routed yet, so backfill refuses
    append(log_url, history)
    route(spark, log_url, jobdb, checkpoint, (everyone,))
    with open_log(log_url) as log, pytest.raises(ConfigError) as refused:
        backfill.drive(spark, plan, jobdb, log, say=lambda _: None)
    assert str(refused.value).startswith("shaped is not routed yet: start `exactly route`")

    # the route starts with late too: it gets the live events from there on
    append(log_url, live)
    route(spark, log_url, jobdb, checkpoint, (everyone, late))
    assert jobs_of(jobdb, late.name) == wanted(live, directory, late.name)
    routes = [span for span in jobdb.spans(late.name, "events") if span.kind == ROUTE]
    assert [(span.start, span.end) for span in routes] == [({0: 360, 1: 240}, None)]

    # backfill from the 23rd: the history received since, once, and nothing to everyone else
    lines: list[str] = []
    with open_log(log_url) as log:
        done = backfill.drive(spark, plan, jobdb, log, say=lines.append)
    since_23 = [e for e in history if e["receivedAt"] >= "2026-11-23"]
    assert jobs_of(jobdb, late.name) == wanted(since_23 + live, directory, late.name)
    assert jobs_of(jobdb, everyone.name) == wanted(events, directory, everyone.name)
    assert jobdb.route_counts().get(late.name, RouteCounts()) == counts(
        since_23 + live, directory, late.name
    )
    assert (done.to_read, done.read, done.events) == (HISTORY, HISTORY, len(since_23))
    assert done.jobs == sum(wanted(since_23, directory, late.name).values())
    assert any("chunk 1 committed, " in line and "records/s" in line for line in lines)
    assert all(len(part) <= 80 for line in lines for part in message(line).splitlines())
    assert done.line().startswith(f"backfill shaped: {done.jobs:,} jobs for 300 events, 600 ")

    # the same window again reads nothing: its span holds it whole
    with open_log(log_url) as log:
        again = backfill.drive(spark, plan, jobdb, log, say=lambda _: None)
    assert (again.to_read, again.jobs) == (0, 0)
    assert again.line() == "backfill shaped: nothing to do, every event is routed to it"

    # a wider window reads everything again but adds only what the first left out, in chunks
    # of 150 records a partition: partition 1 runs out a chunk before partition 0
    wide = BackfillPlan(
        log_url=log_url, destination=late, wait_seconds=0, chunk_records=HISTORY // 2
    )
    with open_log(log_url) as log:
        widened = backfill.drive(spark, wide, jobdb, log, say=lambda _: None)
    assert widened.read == HISTORY and widened.chunks == 3
    assert widened.events == HISTORY - len(since_23)
    assert jobs_of(jobdb, late.name) == wanted(events, directory, late.name)
    assert jobdb.route_counts().get(late.name) == counts(events, directory, late.name)
    assert jobs_of(jobdb, everyone.name) == wanted(events, directory, everyone.name)
    spans = {(span.kind, span.since_ms) for span in jobdb.spans(late.name, "events")}
    assert spans == {(ROUTE, None), (BACKFILL, ms(23)), (BACKFILL, None)}

    # and then any window is held whole
    with open_log(log_url) as log:
        for since in (None, ms(21), ms(24)):
            window = BackfillPlan(
                log_url=log_url, destination=late, since_ms=since, until_ms=ms(25)
            )
            assert backfill.drive(spark, window, jobdb, log, say=lambda _: None).to_read == 0
    assert jobs_of(jobdb, late.name) == wanted(events, directory, late.name)


def test_one_backfill_of_a_destination_runs_at_a_time(jobdb: JobDB) -> None:
    with jobdb.replay_lock("crm", kind=BACKFILL):
        with (
            pytest.raises(ReplayRunning, match="another backfill of 'crm' is running"),
            jobdb.replay_lock("crm", kind=BACKFILL),
        ):
            pass
        with jobdb.replay_lock("crm"):  # a replay of it is another lock
            pass


def test_an_ordered_destination_is_backfilled_only_when_allowed(
    spark: SparkSession, tmp_path: Path, jobdb: JobDB
) -> None:
    ordered = DestinationSettings(name="crm", url="http://127.0.0.1:9/c", ordered=True)
    plan = BackfillPlan(log_url=f"sqlite://{tmp_path}", destination=ordered, wait_seconds=0)
    with open_log(plan.log_url) as log, pytest.raises(ConfigError) as refused:
        backfill.drive(spark, plan, jobdb, log)
    assert str(refused.value) == (
        "crm delivers each user's events in order, and backfilled events would reach it after "
        "newer ones; pass --allow-unordered to send them anyway"
    )
