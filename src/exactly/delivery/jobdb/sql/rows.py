"""A job's columns and how a row becomes a :class:`Job` or a :class:`Transition` (pure)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Any

from exactly.delivery.jobdb.base import AWAITING_SCHEDULING, Job, Transition

#: the columns of ``jobs_N`` every read names (a dataset from an older version has more)
JOB_COLUMNS = "id, bucket, destination, payload, message_id, user_id, created_at, expire_at"
#: the columns of ``job_state_transitions_N`` read back, in :class:`Transition`'s order
TRANSITION_COLUMNS = "job_id, state, attempt, time, retry_at, status_code, error_type, response"
#: the bytes of values one insert statement carries at most (a MariaDB packet is 16 MiB)
STATEMENT_BYTES = 1 << 20


def statement_spans(
    sizes: Sequence[int], rows: int, size: int = STATEMENT_BYTES
) -> Iterator[range]:
    """The rows of each insert statement, in order, for rows of ``sizes`` bytes: at most
    ``rows`` rows and, past its first row, ``size`` bytes a statement."""
    reach = list(accumulate(sizes, initial=0))  # reach[i]: the bytes of the rows before i
    start = 0
    while start < len(sizes):
        end = bisect_right(reach, reach[start] + size, start + 2, min(start + rows, len(sizes)) + 1)
        yield range(start, end - 1)
        start = end - 1


def transition_of(r: Sequence[Any]) -> Transition:
    """A transition from :data:`TRANSITION_COLUMNS`."""
    return Transition(
        int(r[0]),
        str(r[1]),
        int(r[2]),
        float(r[3]),
        None if r[4] is None else float(r[4]),
        None if r[5] is None else int(r[5]),
        r[6],
        r[7],
    )


def job_of(row: Sequence[Any]) -> Job:
    """A job from :data:`JOB_COLUMNS` followed by its latest state, attempt and retry time."""
    return Job(
        id=int(row[0]),
        bucket=str(row[1]),
        destination=str(row[2]),
        payload=bytes(row[3]),
        message_id=str(row[4]),
        user_id=None if row[5] is None else str(row[5]),
        created_at=float(row[6]),
        expire_at=float(row[7]),
        state=AWAITING_SCHEDULING if row[8] is None else str(row[8]),
        attempt=0 if row[9] is None else int(row[9]),
        retry_at=None if row[10] is None else float(row[10]),
    )
