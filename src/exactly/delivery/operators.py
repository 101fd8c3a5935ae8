"""What an operator can do to a destination while the director runs: pause, resume, expire.

Each writes the destination's control row in the JobDB (:class:`~exactly.delivery.jobdb.base.
Control`); the running director reads the rows every second and applies them, so a command takes
effect within a second and never races the director's own writes. With several directors, each
applies an expiry to the buckets of the partitions it holds and adds its count and partitions to
the row; the ask is answered once every partition is. With no director running, an expiry is
applied at once holding every partition's lease (which keeps a director from starting
meanwhile); a pause waits in the row for the next director.

Expired jobs end like any other: archived with their dataset, and ``exactly replay --state
expired`` sends them again.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from exactly.delivery.jobdb.base import EXPIRED, Transition
from exactly.delivery.jobdb.faces import OperatorJobs
from exactly.errors import DirectorLockHeld

BY_OPERATOR = "expired by an operator"
ANSWER_WAIT = 10.0  # seconds an expiry waits for the running director to apply it


def pause(jobdb: OperatorJobs, destination: str) -> str:
    jobdb.set_control(destination, held=True)
    return (
        f"{destination}: paused; nothing is sent to it until "
        f"`exactly deliveries resume {destination}`"
    )


def resume(jobdb: OperatorJobs, destination: str) -> str:
    jobdb.set_control(destination, held=False)
    return f"{destination}: resumed"


def expire(
    jobdb: OperatorJobs,
    destination: str,
    before: float,
    *,
    partitions: int = 1,
    wait: float = ANSWER_WAIT,
) -> str:
    """Expire ``destination``'s pending jobs created before ``before``; the line to print."""
    when = datetime.fromtimestamp(before, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    try:
        with jobdb.all_partitions(partitions, wait=False):
            count = expire_now(jobdb, destination, before)
    except DirectorLockHeld:
        asked = time.time()
        jobdb.set_control(
            destination,
            expire_before=before,
            expire_asked=asked,
            expired=None,
            expired_partitions=(),
        )
        everyone = set(range(partitions))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            control = jobdb.controls().get(destination)
            if control is not None and everyone <= set(control.expired_partitions):
                count = control.expired or 0
                break
            time.sleep(0.2)
        else:
            return (
                f"{destination}: asked the running director to expire jobs created before "
                f"{when}; it has not answered in {wait:g} s (see `exactly deliveries`)"
            )
    return f"{destination}: {count:,} pending events created before {when} expired"


def expire_now(jobdb: OperatorJobs, destination: str, before: float) -> int:
    """Expire the pending jobs directly; only while holding every partition's lease."""
    count = 0
    for bucket in jobdb.buckets():
        if bucket.rpartition("/")[2] != destination:
            continue
        after = 0
        while True:
            page = jobdb.pending(bucket, after=after, limit=10_000)
            now = time.time()
            gone = [job for job in page if job.created_at < before]
            jobdb.record(
                [
                    Transition(job.id, EXPIRED, job.attempt, time=now, error_type=BY_OPERATOR)
                    for job in gone
                ]
            )
            count += sum(job.events for job in gone)  # a pack counts its events
            if len(page) < 10_000:
                break
            after = page[-1].id
    return count
